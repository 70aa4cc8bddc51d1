--- The `tupper` verbs that talk to the daemon (run, create, exec, ls, cp,
-- kill, pause/resume, stats, pull, logs, port, import, images, rmi, image
-- inspect/prune, build): each takes the connection and its parsed
-- arguments (cli_args.parse: opts, args, cmd, raw) and returns the exit
-- code.  A process's output streams to stdout and stderr as it comes.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local units = require("tupper.util.units")
local cli_args = require("tupper.client.cli_args")
-- cli-b: terminals, cp and logs live in their own files
local cli_tty = require("tupper.client.cli_tty")
local stream = require("tupper.wire.stream")

local M = {}

local die, errmsg, box_opts = cli_args.die, cli_args.errmsg, cli_args.box_opts

--- Prints rows (lists of strings) under headers, each column as wide as
-- its widest cell (the last one unpadded), two spaces apart.
function M.print_table(headers, rows)
  local width = {}
  for k, h in ipairs(headers) do width[k] = utf8.len(h) or #h end
  for _, r in ipairs(rows) do
    for k, cell in ipairs(r) do width[k] = math.max(width[k] or 0, utf8.len(cell) or #cell) end
  end
  local function line(r)
    local out = {}
    for k, cell in ipairs(r) do
      out[k] = k < #r and (cell .. (" "):rep(width[k] - (utf8.len(cell) or #cell))) or cell
    end
    print(table.concat(out, "  "))
  end
  line(headers)
  for _, r in ipairs(rows) do line(r) end
end

M.TRUNC_REF = 40    -- an image reference longer than this is shortened in a listing
M.TRUNC_DIGEST = 19 -- "sha256:" and 12 hex digits

--- s shortened to n characters with an ellipsis, unless it fits (or keep).
function M.trunc(s, n, keep)
  s = tostring(s)
  if keep or #s <= n then return s end
  return s:sub(1, n - 1) .. "\u{2026}"
end

-- A verb that lists what a method returns (ls, images, volume ls,
-- snapshot ls): calls how.method and prints its how.field as JSON with
-- --json (how.json(list), else a compact array), one how.quiet(item) a
-- line with --quiet (when the verb has it), else a table of how.row(item)
-- under how.headers.  Returns the exit code.
local function list_verb(c, p, how)
  local r, err = c:call(how.method, {})
  if not r then return die("%s", errmsg(err)) end
  local list = r[how.field]
  if p.opts.json then
    print(how.json and how.json(list) or json.encode(json.array(list)))
    return 0
  end
  if p.opts.quiet and how.quiet then
    for _, item in ipairs(list) do print(how.quiet(item)) end
    return 0
  end
  local rows = {}
  for _, item in ipairs(list) do rows[#rows + 1] = how.row(item) end
  M.print_table(how.headers, rows)
  return 0
end

-- A verb that calls method once for each of its arguments (kill, pause,
-- rmi, volume rm ...) with { [key] = arg } and prints what shown(r, arg)
-- returns (the arg by default), or its nil, message as `VERB ARG: message`.
-- Returns the exit code (non-zero when one failed).
local function each_arg(c, p, verb, method, key, shown, extra)
  shown = shown or function(_, arg) return arg end
  local code = 0
  for _, arg in ipairs(p.args) do
    local params = { [key] = arg }
    for k, v in pairs(extra or {}) do params[k] = v end
    local r, err = c:call(method, params)
    local out, why
    if r then out, why = shown(r, arg) else why = errmsg(err) end
    if out then print(out) else code = die("%s %s: %s", verb, arg, why) end
  end
  return code
end

-- cli-b: a box's bytes on our terminal go through the escaping filter
local out_filters = {}
local function write_out(stream, p)
  local data = p.data
  if p.encoding ~= "utf8" then data = core.b64decode(data) or "" end
  local f = stream == "stderr" and io.stderr or io.stdout
  local fd = stream == "stderr" and 2 or 1
  out_filters[fd] = out_filters[fd] or cli_tty.filter(fd)
  data = out_filters[fd](data)
  if not f:write(data) or not f:flush() then
    -- our reader went away (`tupper run -- yes | head -1`): end as a
    -- SIGPIPE would; the daemon kills the box when we disconnect
    os.exit(141)
  end
end

-- Feeds the CLI's stdin to send(chunk) (false: stop), then calls close().
local function pump_stdin(send, close)
  local kind = uv.guess_handle(0)
  if kind == "file" or kind == "unknown" then
    while true do
      local chunk = io.stdin:read(65536)
      if not chunk then break end
      if not send(chunk) then return end
    end
  else
    local h = kind == "tty" and uv.new_tty(0, true) or uv.new_pipe(false)
    if kind ~= "tty" then h:open(0) end
    local queue, waiting, eof = {}, nil, false
    h:read_start(function(err, chunk)
      if err or not chunk then eof = true else queue[#queue + 1] = chunk end
      if waiting then local w = waiting; waiting = nil; w() end
    end)
    while true do
      if #queue == 0 and not eof then async.wait(function(cb) waiting = cb end) end
      if #queue > 0 then
        local chunk = table.remove(queue, 1)
        if not send(chunk) then break end
      elseif eof then
        break
      end
    end
    h:read_stop()
    h:close()
  end
  close()
end

-- The old way, base64 in JSON (a daemon without process streams).
local function pump_stdin_json(c, sandbox, pid)
  pump_stdin(function(chunk)
    return c:call("process.stdin", { sandbox = sandbox, pid = pid, data = core.b64encode(chunk) })
  end, function() c:call("process.close_stdin", { sandbox = sandbox, pid = pid }) end)
end

-- The exit code of a process.start error.
local function start_failed(err)
  io.stderr:write("tupper: ", errmsg(err), "\n")
  local code = type(err) == "table" and err.data and err.data.code
  return (code == "ENOENT") and 127 or (code == "EACCES" and 126 or 125)
end

-- Forwards ^C and friends to the process, as docker run does; returns the
-- signal handles (closed by the caller).  Taken before process.start: a
-- signal that comes before its reply is held, and sent by sigs.started()
-- once the pid is known (the process's first output can reach us, and be
-- written, before that reply is read: a signal then must not find us
-- without a handler).
local function forward_signals(c, id, get_pid)
  local sigs, early = {}, {}
  local function send(sig)
    async.spawn(function() c:call("process.signal", { sandbox = id, pid = get_pid(), signal = sig }) end)
  end
  for _, name in ipairs({ "sigint", "sigterm", "sighup" }) do
    local s = uv.new_signal()
    s:start(name, function(signame)
      local sig = signame:upper():sub(4)
      if get_pid() then send(sig) else early[#early + 1] = sig end
    end)
    sigs[#sigs + 1] = s
  end
  function sigs.started()
    for _, sig in ipairs(early) do send(sig) end
    early = {}
  end
  return sigs
end

local function close_signals(sigs)
  for _, s in ipairs(sigs) do s:close() end
end

-- The exit code of a process's exit notification.
local function exit_code(exited)
  if exited.oom_killed == true then
    io.stderr:write("tupper: the command was killed: out of memory (the sandbox's memory limit)\n")
  end
  local sig = math.tointeger(exited.signal) or 0
  if sig > 0 then return 128 + sig end
  return math.tointeger(exited.exit_code) or 125
end

-- run_in over process streams (docs/protocol.md, "Process streams"): the
-- output comes as binary frames on the data connection dc and is written
-- out as it comes, by the connection's pump in C where our stdout or
-- stderr is not a terminal (a terminal gets the escaping filter in Lua);
-- the daemon gets credit only once a chunk is written, so a slow reader of
-- ours slows the process down and nothing is lost.
local function run_streamed(c, dc, id, argv, o)
  -- on a terminal a MiB a frame goes through here as short-lived strings:
  -- the incremental collector would mark the CLI's whole heap again and again
  collectgarbage("generational")
  local exited, done_cb, pid, failed, broken
  local pending = 2 -- stdout and stderr, until their END
  local function wake() if done_cb then local w = done_cb; done_cb = nil; w() end end
  c:on("process.exit", function(p)
    if p.sandbox == id and p.pid == pid then exited = p; wake() end
  end)
  c.on_close = wake
  local sigs = forward_signals(c, id, function() return pid end)
  local r, err = c:call("process.start", { sandbox = id, argv = argv, env = o.env,
    cwd = o.workdir, stdin = o.interactive, streams = true })
  if not r then close_signals(sigs); dc:close(); return start_failed(err) end
  pid = r.pid
  sigs.started()
  local st = r.streams
  io.stdout:flush() -- the pump writes fd 1 itself: nothing of ours may come after its bytes
  for _, which in ipairs({ "stdout", "stderr" }) do
    async.spawn(function()
      local fd = which == "stderr" and 2 or 1
      local sink = fd
      if uv.guess_handle(fd) == "tty" then
        local f = which == "stderr" and io.stderr or io.stdout
        local filt = cli_tty.filter(fd)
        sink = function(data)
          -- our reader went away: end as a SIGPIPE would
          if not f:write(filt(data)) or not f:flush() then os.exit(141) end
          return true
        end
      end
      local n, derr = dc:drain(st[which], sink)
      if not n then
        failed = failed or derr
        -- writing our output failed here (the daemon was told): stop now,
        -- as a SIGPIPE would for `tupper exec ID -- yes | head -1`
        if derr.loc then broken = broken or derr end
      end
      pending = pending - 1
      wake()
    end)
  end
  if o.interactive and st.stdin then
    local input = dc:input(st.stdin)
    -- a file on our stdin goes from C; a pipe or a terminal through Lua
    if not (uv.guess_handle(0) == "file" and input:pump(0)) then
      async.spawn(pump_stdin, function(chunk) return input:write(chunk) end, function() input:close() end)
    end
  end
  while (not exited or pending > 0) and not c.closed and not broken do async.wait(function(cb) done_cb = cb end) end
  close_signals(sigs)
  dc:close()
  if broken then
    if broken.data and broken.data.code == "EPIPE" then return 141 end
    io.stderr:write("tupper: writing the process's output failed: ", errmsg(broken), "\n")
    return 125
  end
  if not exited then
    io.stderr:write("tupper: lost the connection to the daemon\n")
    return 125
  end
  if failed then
    io.stderr:write("tupper: the process's output stream failed: ", errmsg(failed), "\n")
    return 125
  end
  return exit_code(exited)
end

-- Runs argv in sandbox id, streaming output; returns the exit code.
local function run_in(c, id, argv, o)
  if o.tty then return cli_tty.run_pty(c, id, argv, o) end -- cli-b
  if c.server and c.server.process_streams == stream.PROCESS_STREAMS then
    local dc = stream.open(c)
    if dc then return run_streamed(c, dc, id, argv, o) end
  end
  local exited
  local done_cb
  local pid
  c:on("process.output", function(p)
    if p.sandbox == id and p.pid == pid then write_out(p.stream, p) end
  end)
  c:on("process.exit", function(p)
    if p.sandbox == id and p.pid == pid then
      exited = p
      if done_cb then done_cb() end
    end
  end)
  c.on_close = function() if done_cb then done_cb() end end
  local sigs = forward_signals(c, id, function() return pid end)
  local r, err = c:call("process.start", { sandbox = id, argv = argv, env = o.env,
    cwd = o.workdir, stdin = o.interactive })
  if not r then close_signals(sigs); return start_failed(err) end
  pid = r.pid
  sigs.started()
  if o.interactive then async.spawn(pump_stdin_json, c, id, pid) end
  if not exited and not c.closed then async.wait(function(cb) done_cb = cb end) end
  close_signals(sigs)
  if not exited then
    io.stderr:write("tupper: lost the connection to the daemon\n")
    return 125
  end
  return exit_code(exited)
end

-- The policy file a create sends (docs/policy.md): --policy FILE, none with
-- --no-policy, else the nearest tupper.lua from the working directory up.
local function policy_param(o)
  -- lazy: start-up cost, only a verb that sends a policy or a recipe loads
  -- the recipe VM
  local policy = require("tupper.recipe.policy")
  if o.policy == false then return nil end
  local path = o.policy or policy.find()
  if not path then return nil end
  local text, err = require("tupper.recipe.jail").read_source(path)
  if not text then error(("policy: %s"):format(err), 0) end
  return { source = text, name = path }
end

-- The `recipe` param of --recipe FILE|NAME, or nil.
local function recipe_spec(o)
  if not o.recipe then return nil end
  return require("tupper.recipe.file").client_spec(o.recipe) -- lazy: start-up cost, as above
end

--- tupper build RECIPE: builds the recipe's layer and writes RECIPE.lock.
function M.build(c, p)
  local path = p.args[1]
  local rec = require("tupper.recipe.file") -- lazy: start-up cost, as above
  -- the old lock goes along: an unchanged recipe's Debian image is rebuilt
  -- from its locked package versions
  local spec, serr = rec.client_spec(path)
  if not spec then return die("%s", serr) end
  local r, err = c:call("recipe.build", { recipe = spec })
  if not r then return die("%s", errmsg(err)) end
  io.stderr:write(("%s: image %s (%s), layer %s%s\n"):format(r.recipe, r.image, r.image_digest,
    r.layer ~= json.null and r.layer or "none", r.cached and " (cached)" or ""))
  if not spec.source then
    io.stderr:write("tupper: a shipped recipe has no file to lock beside; its lock:\n")
    print(json.pretty(r.lock))
    return 0
  end
  local lock_path = rec.lock_path(path)
  local tmp = lock_path .. ".tmp"
  local f, ferr = io.open(tmp, "wb")
  if not f then return die("write %s: %s", lock_path, ferr) end
  f:write(json.pretty(r.lock), "\n")
  f:close()
  local ok, rerr = os.rename(tmp, lock_path)
  if not ok then os.remove(tmp); return die("write %s: %s", lock_path, rerr) end
  print(lock_path)
  return 0
end

function M.run(c, p)
  local o, rest = box_opts(p), p.cmd or {}
  local image_cmd = #rest == 0 and o.image and o.image ~= "default"
  if #rest == 0 then rest = { "/bin/sh" } end
  local pol = policy_param(o)
  -- a run box lives as long as its command, as with docker run; a policy
  -- with max.timeout refuses "forever", so it lives as long as that allows
  if o.limits.timeout == nil then
    o.limits.timeout = 0
    -- lazy: start-up cost, as above
    local p = pol and require("tupper.recipe.policy").load_string(pol.source, pol.name)
    if p and p.max and p.max.timeout then o.limits.timeout = p.max.timeout end
  end
  -- the box goes with this client, even if it is killed (docker run --rm
  -- without leaving a container behind)
  local spec, serr = recipe_spec(o)
  if serr then return die("%s", serr) end
  local sb, err = c:call("sandbox.create", { image = o.image, env = next(o.env) and o.env or nil,
    metadata = next(o.metadata) and o.metadata or nil, limits = o.limits, kill_on_disconnect = true,
    policy = pol, recipe = spec, network = o.network, backend = o.backend, accel = o.accel,
    volumes = o.volumes })
  if not sb then return die("%s", errmsg(err)) end
  if image_cmd then
    -- no command: the image's own (Entrypoint + Cmd), as docker run does
    local info = c:call("image.inspect", { ref = o.image })
    local argv = {}
    for _, a in ipairs(info and info.config.entrypoint or {}) do argv[#argv + 1] = a end
    for _, a in ipairs(info and info.config.cmd or {}) do argv[#argv + 1] = a end
    if #argv > 0 then rest = argv end
  end
  -- the sandbox's workdir (a recipe's) is where the command runs
  local code = run_in(c, sb.id, rest, o)
  -- --rm: a notification, not a call: the daemon takes the box out of its
  -- registry at once and finishes the cleanup on its own; no need to wait
  if not c.closed then c.conn:send({ jsonrpc = "2.0", method = "sandbox.kill", params = { id = sb.id } }) end
  return code
end

function M.create(c, p)
  local o = box_opts(p)
  local spec, serr = recipe_spec(o)
  if serr then return die("%s", serr) end
  local sb, err = c:call("sandbox.create", { image = o.image, env = next(o.env) and o.env or nil,
    metadata = next(o.metadata) and o.metadata or nil, cwd = o.workdir,
    limits = next(o.limits) and o.limits or nil, policy = policy_param(o), recipe = spec,
    network = o.network, backend = o.backend, accel = o.accel,
    volumes = o.volumes, snapshot = p.opts.snapshot })
  if not sb then return die("%s", errmsg(err)) end
  print(sb.id)
  return 0
end

--- tupper snapshot ID [NAME]
function M.snapshot(c, p)
  local r, err = c:call("sandbox.snapshot", { id = p.args[1], name = p.args[2] })
  if not r then return die("%s", errmsg(err)) end
  print(r.id)
  return 0
end

--- tupper snapshot ls [--json]
function M.snapshot_ls(c, p)
  return list_verb(c, p, { method = "snapshot.list", field = "snapshots",
    headers = { "ID", "NAMES", "SANDBOX", "SIZE", "CREATED", "USED BY" },
    row = function(s)
      return { s.id, #s.names > 0 and table.concat(s.names, ",") or "-", tostring(s.sandbox or "-"),
        units.human(s.size or 0, { si = true }), tostring(s.created_at or "-"),
        #s.sandboxes > 0 and table.concat(s.sandboxes, ",") or "-" }
    end })
end

--- tupper snapshot rm ID|NAME...
function M.snapshot_rm(c, p) return each_arg(c, p, "snapshot rm", "snapshot.delete", "id") end

--- tupper fork [-n N] ID
function M.fork(c, p)
  local r, err = c:call("sandbox.fork", { id = p.args[1], count = p.opts.count or 1 })
  if not r then return die("%s", errmsg(err)) end
  for _, sb in ipairs(r.sandboxes) do print(sb.id) end
  return 0
end

function M.exec(c, p)
  local o = box_opts(p)
  o.detach = true -- cli-b: the detach keys leave an exec's process running
  return run_in(c, p.args[1], p.cmd, o)
end

function M.pull(c, p)
  local quiet = p.opts.quiet
  local refs = p.args
  -- a progress bar on a terminal, nothing otherwise
  local bar = not quiet and uv.guess_handle(2) == "tty"
  local drawn = false
  if bar then
    c:on("image.progress", function(p)
      local total = math.max(math.tointeger(p.total) or 0, 1)
      local done = math.min(math.tointeger(p.done) or 0, total)
      local width = 30
      local fill = math.floor(width * done / total)
      io.stderr:write(("\r%s [%s%s] %s / %s %3d%%"):format(refs[1]:sub(1, 40), ("="):rep(fill),
        (" "):rep(width - fill), units.human(done), units.human(total), math.floor(100 * done / total)))
      io.stderr:flush()
      drawn = true
    end)
  end
  local r, err = c:call("image.pull", { ref = refs[1], progress = bar or nil })
  if drawn then io.stderr:write("\n") end
  if not r then return die("pull %s: %s", refs[1], errmsg(err)) end
  print(r.ref .. "@" .. r.digest)
  return 0
end

function M.ls(c, p)
  return list_verb(c, p, { method = "sandbox.list", field = "sandboxes",
    quiet = function(s) return s.id end,
    headers = { "ID", "IMAGE", "STATE", "CREATED", "PROCESSES" },
    row = function(s)
      return { tostring(s.id), M.trunc(s.image, M.TRUNC_REF, p.opts.no_trunc), tostring(s.state),
        tostring(s.created_at), tostring(math.tointeger(s.processes) or 0) }
    end })
end

function M.kill(c, p)
  return each_arg(c, p, "kill", "sandbox.kill", "id", function(r, id)
    if not r.killed then return nil, "no such sandbox" end
    return id
  end)
end

--- tupper attach ID PID (client/cli_tty.lua).
function M.attach(c, p)
  return cli_tty.attach(c, { detach_keys = p.opts.detach_keys }, p.args)
end

--- tupper logs [--network] [--json] [-f] [--tail N] ID [PID]
-- (client/cli_logs.lua).
function M.logs(c, p)
  local o = p.opts
  local cli_logs = require("tupper.client.cli_logs") -- lazy: start-up cost of every other verb
  return cli_logs.logs(c, { network = o.network, json = o.json, follow = o.follow, tail = o.tail }, p.args)
end

function M.port(c, p)
  local id, port = p.args[1], math.tointeger(tonumber(p.args[2]))
  if not port then return die("port: PORT wants a port number, got %q", p.args[2]) end
  local r, err = c:call("sandbox.expose", { id = id, port = port })
  if not r then return die("port %s %d: %s", id, port, errmsg(err)) end
  print(("%s:%d"):format(r.host, math.tointeger(r.port)))
  return 0
end

function M.pause(c, p)
  local o = p.opts
  if o.keep_memory and o.files_only then return die("pause: --keep-memory or --files-only, not both") end
  local keep
  if o.keep_memory then keep = true elseif o.files_only then keep = false end
  return each_arg(c, p, "pause", "sandbox.pause", "id", nil, { keep_memory = keep })
end
function M.resume(c, p) return each_arg(c, p, "resume", "sandbox.resume", "id") end

local function num(v) return tostring(math.tointeger(v) or v or "-") end

-- The counters of the sandboxes named, or of every sandbox (one gone
-- between the list and its counters is left out): the list (each with its
-- id) and the exit code so far (125 when a named one failed).
local function gather_stats(c, named)
  local ids, all = named, #named == 0
  if all then
    local r, err = c:call("sandbox.list", {})
    if not r then return {}, die("%s", errmsg(err)) end
    ids = {}
    for _, s in ipairs(r.sandboxes) do ids[#ids + 1] = s.id end
  end
  local results, code = {}, 0
  for _, id in ipairs(ids) do
    local r, err = c:call("sandbox.metrics", { id = id })
    if r then
      r.id = id
      results[#results + 1] = r
    elseif not all then
      code = die("stats %s: %s", id, errmsg(err))
    end
  end
  return results, code
end

local function stats_table(results)
  local rows = {}
  for _, r in ipairs(results) do
    rows[#rows + 1] = { r.id, ("%.2fs"):format((tonumber(r.cpu_usage_usec) or 0) / 1e6),
      units.human(math.tointeger(r.memory_bytes) or 0), units.human(math.tointeger(r.memory_peak) or 0),
      num(r.pids), num(r.nr_throttled), num(r.oom_kills) }
  end
  M.print_table({ "ID", "CPU", "MEMORY", "PEAK", "PIDS", "THROTTLED", "OOM KILLS" }, rows)
end

M.STATS_INTERVAL_MS = 2000

--- tupper stats [ID...]: one table (or a JSON array) of the sandboxes
-- named, or of every sandbox; one ID: its counters one a line (or its JSON
-- object), as before.  On a terminal, without --no-stream or --json, the
-- table is redrawn every STATS_INTERVAL_MS until ^C (docker stats' habit).
function M.stats(c, p)
  if not p.opts.no_stream and not p.opts.json and uv.guess_handle(1) == "tty" then
    while not c.closed do
      local results, code = gather_stats(c, p.args)
      if code ~= 0 then return code end
      io.stdout:write("\27[H\27[2J")
      stats_table(results)
      io.stdout:flush()
      async.sleep(M.STATS_INTERVAL_MS)
    end
    return die("lost the connection to the daemon")
  end
  local results, code = gather_stats(c, p.args)
  if #p.args == 1 then
    local r = results[1]
    if not r then return code end
    r.id = nil
    if p.opts.json then print(json.encode(r)); return 0 end
    local keys = {}
    for k in pairs(r) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do print(("%-16s %s"):format(k, num(r[k]))) end
    return 0
  end
  if p.opts.json then
    print(json.encode(json.array(results)))
    return code
  end
  stats_table(results)
  return code
end

function M.import(c, p)
  local args = p.args
  local path = uv.fs_realpath(args[1])
  if not path then return die("import: no such file or directory: %s", args[1]) end
  local r, err = c:call("image.import", { path = path, ref = args[2] })
  if not r then return die("%s", errmsg(err)) end
  print(("%s %s"):format(r.ref, r.digest))
  return 0
end

function M.images(c, p)
  local keep = p.opts.no_trunc
  return list_verb(c, p, { method = "image.list", field = "images",
    quiet = function(i) return i.ref end,
    headers = { "REF", "DIGEST", "SIZE", "LAYERS", "CREATED" },
    row = function(i)
      return { M.trunc(i.ref, M.TRUNC_REF, keep),
        keep and tostring(i.digest) or tostring(i.digest):sub(1, M.TRUNC_DIGEST),
        units.human(i.size, { si = true }), num(i.layers), type(i.created) == "string" and i.created or "-" }
    end })
end

function M.rmi(c, p)
  return each_arg(c, p, "rmi", "image.remove", "ref", function(r) return r.ref end)
end

-- A verb that prints what method returns for its one argument (params
-- { [key] = arg }) as indented JSON.  Returns the exit code.
local function inspect_verb(c, p, method, key)
  local r, err = c:call(method, { [key] = p.args[1] })
  if not r then return die("%s", errmsg(err)) end
  print(json.pretty(r))
  return 0
end

function M.image_inspect(c, p) return inspect_verb(c, p, "image.inspect", "ref") end

function M.image_prune(c, p)
  local r, err = c:call("image.prune", { all = p.opts.all or false })
  if not r then return die("%s", errmsg(err)) end
  for _, ref in ipairs(r.refs) do print("removed " .. ref) end
  print(("%d blobs and %d layers removed"):format(math.tointeger(r.blobs) or 0, math.tointeger(r.layers) or 0))
  return 0
end

-- tupper volume create|ls|inspect|rm (daemon/volumes.lua)
function M.volume_create(c, p)
  local r, err = c:call("volume.create", { name = p.args[1], size = p.opts.size })
  if not r then return die("%s", errmsg(err)) end
  if p.opts.json then print(json.pretty(r)) else print(r.name) end
  return 0
end

local function mounts_of(v)
  local out = {}
  for _, m in ipairs(v.mounted_by or {}) do out[#out + 1] = m.sandbox .. ":" .. m.path end
  return #out > 0 and table.concat(out, ",") or "-"
end

function M.volume_ls(c, p)
  return list_verb(c, p, { method = "volume.list", field = "volumes", json = json.pretty,
    quiet = function(v) return v.name end,
    headers = { "NAME", "ID", "SIZE", "CREATED", "MOUNTED BY" },
    row = function(v) return { v.name, v.id, units.human(v.size), tostring(v.created_at), mounts_of(v) } end })
end

function M.volume_inspect(c, p) return inspect_verb(c, p, "volume.get", "name") end

function M.volume_rm(c, p) return each_arg(c, p, "volume rm", "volume.destroy", "name") end

--- tupper cp [-r] [-a] SRC DST (client/cli_cp.lua).
function M.cp(c, p)
  local cli_cp = require("tupper.client.cli_cp") -- lazy: start-up cost of every other verb
  return cli_cp.cp(c, { recursive = p.opts.recursive, archive = p.opts.archive }, p.args)
end

return M
