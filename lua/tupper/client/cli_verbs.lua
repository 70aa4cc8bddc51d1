--- The `tupper` verbs that talk to the daemon (run, create, exec, ls, cp,
-- kill, pause/resume, stats, pull, logs, port, import, images, rmi, image,
-- build): each takes the connection and its arguments and returns the exit
-- code.  A process's output streams to stdout and stderr as it comes.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local units = require("tupper.util.units")
local cli_args = require("tupper.client.cli_args")

local M = {}

local die, errmsg, parse_opts = cli_args.die, cli_args.errmsg, cli_args.parse_opts
local RUN_OPTS, CREATE_OPTS, EXEC_OPTS = cli_args.RUN_OPTS, cli_args.CREATE_OPTS, cli_args.EXEC_OPTS
local split_remote = cli_args.split_remote

local function write_out(stream, p)
  local data = p.data
  if p.encoding ~= "utf8" then data = core.b64decode(data) or "" end
  local f = stream == "stderr" and io.stderr or io.stdout
  if not f:write(data) or not f:flush() then
    -- our reader went away (`tupper run -- yes | head -1`): end as a
    -- SIGPIPE would; the daemon kills the box when we disconnect
    os.exit(141)
  end
end

-- Feeds the CLI's stdin to the process, then closes its stdin.
local function pump_stdin(c, sandbox, pid)
  local function send(chunk)
    return c:call("process.stdin", { sandbox = sandbox, pid = pid, data = core.b64encode(chunk) })
  end
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
  c:call("process.close_stdin", { sandbox = sandbox, pid = pid })
end

-- Runs argv in sandbox id, streaming output; returns the exit code.
local function run_in(c, id, argv, o)
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
  local r, err = c:call("process.start", { sandbox = id, argv = argv, env = o.env,
    cwd = o.workdir, stdin = o.interactive })
  if not r then
    io.stderr:write("tupper: ", errmsg(err), "\n")
    local code = type(err) == "table" and err.data and err.data.code
    return (code == "ENOENT") and 127 or (code == "EACCES" and 126 or 125)
  end
  pid = r.pid
  -- forward ^C and friends to the process, as docker run does
  local sigs = {}
  for _, name in ipairs({ "sigint", "sigterm", "sighup" }) do
    local s = uv.new_signal()
    s:start(name, function(signame)
      async.spawn(function()
        c:call("process.signal", { sandbox = id, pid = pid, signal = signame:upper():sub(4) })
      end)
    end)
    sigs[#sigs + 1] = s
  end
  if o.interactive then async.spawn(pump_stdin, c, id, pid) end
  if not exited and not c.closed then async.wait(function(cb) done_cb = cb end) end
  for _, s in ipairs(sigs) do s:close() end
  if not exited then
    io.stderr:write("tupper: lost the connection to the daemon\n")
    return 125
  end
  local sig = math.tointeger(exited.signal) or 0
  if sig > 0 then return 128 + sig end
  return math.tointeger(exited.exit_code) or 125
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
function M.build(c, args)
  if #args ~= 1 then return die("build wants one recipe file") end
  local path = args[1]
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

function M.run(c, args)
  local o, rest = parse_opts(args, 1, RUN_OPTS)
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
    policy = pol, recipe = spec, network = o.network, backend = o.backend, accel = o.accel })
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

function M.create(c, args)
  local o, rest = parse_opts(args, 1, CREATE_OPTS)
  if #rest > 0 then return die("create takes no arguments") end
  local spec, serr = recipe_spec(o)
  if serr then return die("%s", serr) end
  local sb, err = c:call("sandbox.create", { image = o.image, env = next(o.env) and o.env or nil,
    metadata = next(o.metadata) and o.metadata or nil, cwd = o.workdir,
    limits = next(o.limits) and o.limits or nil, policy = policy_param(o), recipe = spec,
    network = o.network, backend = o.backend, accel = o.accel })
  if not sb then return die("%s", errmsg(err)) end
  print(sb.id)
  return 0
end

function M.exec(c, args)
  local o, rest = parse_opts(args, 1, EXEC_OPTS)
  local id = table.remove(rest, 1)
  if not id then return die("exec needs a sandbox id") end
  if rest[1] == "--" then table.remove(rest, 1) end
  if #rest == 0 then return die("exec needs a command") end
  return run_in(c, id, rest, o)
end

function M.pull(c, args)
  local quiet = false
  local refs = {}
  for _, a in ipairs(args) do
    if a == "-q" or a == "--quiet" then quiet = true
    elseif a:sub(1, 1) == "-" then return die("pull: unknown option %s", a)
    else refs[#refs + 1] = a end
  end
  if #refs ~= 1 then return die("pull wants one image reference, e.g. alpine or ghcr.io/org/app:1.2") end
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

function M.ls(c, args)
  local as_json = false
  for _, a in ipairs(args) do
    if a == "--json" then as_json = true else return die("ls: unknown argument %s", a) end
  end
  local r, err = c:call("sandbox.list", {})
  if not r then return die("%s", errmsg(err)) end
  if as_json then
    print(json.encode(json.array(r.sandboxes)))
    return 0
  end
  print(("%-14s %-10s %-9s %-20s %s"):format("ID", "IMAGE", "STATE", "CREATED", "PROCESSES"))
  for _, s in ipairs(r.sandboxes) do
    print(("%-14s %-10s %-9s %-20s %d"):format(s.id, s.image, s.state, s.created_at,
      math.tointeger(s.processes) or 0))
  end
  return 0
end

function M.kill(c, args)
  if #args == 0 then return die("kill needs a sandbox id") end
  local code = 0
  for _, id in ipairs(args) do
    local r, err = c:call("sandbox.kill", { id = id })
    if not r then
      code = die("kill %s: %s", id, errmsg(err))
    elseif not r.killed then
      code = die("kill %s: no such sandbox", id)
    else
      print(id)
    end
  end
  return code
end

local function each_id(c, args, method, verb)
  if #args == 0 then return die("%s needs a sandbox id", verb) end
  local code = 0
  for _, id in ipairs(args) do
    local r, err = c:call(method, { id = id })
    if not r then code = die("%s %s: %s", verb, id, errmsg(err)) else print(id) end
  end
  return code
end

function M.logs(c, args)
  local network, as_json, id = false, false, nil
  for _, a in ipairs(args) do
    if a == "--network" then network = true
    elseif a == "--json" then as_json = true
    elseif id == nil and a:sub(1, 1) ~= "-" then id = a
    else return die("logs: unexpected argument '%s'", a) end
  end
  if not network then return die("logs: only --network is supported (process output streams with exec)") end
  if not id then return die("logs needs a sandbox id") end
  local r, err = c:call("sandbox.network_log", { id = id })
  if not r then return die("logs %s: %s", id, errmsg(err)) end
  if as_json then
    print(json.encode(json.array(r.entries)))
    return 0
  end
  for _, e in ipairs(r.entries) do
    local port = math.tointeger(e.port)
    print(("%s %-5s %-11s %s%s%s%s"):format(e.time, e.action, e.via, tostring(e.host or "?"),
      port and (":" .. port) or "", e.addr and (" -> " .. e.addr) or "",
      e.reason and ("  (" .. e.reason .. ")") or ""))
  end
  return 0
end

function M.port(c, args)
  local id, port = args[1], math.tointeger(tonumber(args[2] or ""))
  if not id or not port or #args ~= 2 then return die("usage: tupper port ID PORT") end
  local r, err = c:call("sandbox.expose", { id = id, port = port })
  if not r then return die("port %s %d: %s", id, port, errmsg(err)) end
  print(("%s:%d"):format(r.host, math.tointeger(r.port)))
  return 0
end

function M.pause(c, args) return each_id(c, args, "sandbox.pause", "pause") end
function M.resume(c, args) return each_id(c, args, "sandbox.resume", "resume") end

function M.stats(c, args)
  local as_json = args[1] == "--json"
  if as_json then table.remove(args, 1) end
  if #args ~= 1 then return die("stats wants one sandbox id") end
  local r, err = c:call("sandbox.metrics", { id = args[1] })
  if not r then return die("%s", errmsg(err)) end
  if as_json then print(json.encode(r)); return 0 end
  local keys = {}
  for k in pairs(r) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do print(("%-16s %s"):format(k, tostring(math.tointeger(r[k]) or r[k]))) end
  return 0
end

function M.import(c, args)
  if #args < 1 or #args > 2 then return die("import wants PATH [NAME]") end
  local path = uv.fs_realpath(args[1])
  if not path then return die("import: no such file or directory: %s", args[1]) end
  local r, err = c:call("image.import", { path = path, ref = args[2] })
  if not r then return die("%s", errmsg(err)) end
  print(("%s %s"):format(r.ref, r.digest))
  return 0
end

function M.images(c, args)
  local as_json = false
  for _, a in ipairs(args) do
    if a == "--json" then as_json = true else return die("images: unknown argument %s", a) end
  end
  local r, err = c:call("image.list", {})
  if not r then return die("%s", errmsg(err)) end
  if as_json then
    print(json.encode(json.array(r.images)))
    return 0
  end
  print(("%-48s %-19s %-10s %-6s %s"):format("REF", "DIGEST", "SIZE", "LAYERS", "CREATED"))
  for _, i in ipairs(r.images) do
    print(("%-48s %-19s %-10s %-6d %s"):format(i.ref, i.digest:sub(1, 19), units.human(i.size, { si = true }),
      math.tointeger(i.layers) or 0, type(i.created) == "string" and i.created or "-"))
  end
  return 0
end

function M.rmi(c, args)
  if #args == 0 then return die("rmi needs an image name") end
  local code = 0
  for _, ref in ipairs(args) do
    local r, err = c:call("image.remove", { ref = ref })
    if not r then code = die("rmi %s: %s", ref, errmsg(err)) else print(r.ref) end
  end
  return code
end

function M.image(c, args)
  local sub = table.remove(args, 1)
  if sub == "ls" or sub == "list" then return M.images(c, args)
  elseif sub == "rm" or sub == "remove" then return M.rmi(c, args)
  elseif sub == "import" then return M.import(c, args)
  elseif sub == "inspect" then
    if #args ~= 1 then return die("image inspect wants one image name") end
    local r, err = c:call("image.inspect", { ref = args[1] })
    if not r then return die("%s", errmsg(err)) end
    print(json.pretty(r))
    return 0
  elseif sub == "prune" then
    local all = false
    for _, a in ipairs(args) do
      if a == "--all" or a == "-a" then all = true else return die("image prune: unknown argument %s", a) end
    end
    local r, err = c:call("image.prune", { all = all })
    if not r then return die("%s", errmsg(err)) end
    for _, ref in ipairs(r.refs) do print("removed " .. ref) end
    print(("%d blobs and %d layers removed"):format(math.tointeger(r.blobs) or 0, math.tointeger(r.layers) or 0))
    return 0
  end
  return die("image: want ls, inspect, rm, import or prune")
end

function M.cp(c, args)
  if #args ~= 2 then return die("cp wants SRC DST") end
  local sid, spath = split_remote(args[1])
  local did, dpath = split_remote(args[2])
  if (sid and did) or (not sid and not did) then
    return die("cp copies between the host and a sandbox: FILE ID:/path or ID:/path FILE")
  end
  local chunk = core.CHUNK_MAX
  if did then
    local f, err = io.open(args[1], "rb")
    if not f then return die("%s", err) end
    local offset = 0
    repeat
      local data = f:read(chunk) or ""
      local r, e = c:call("fs.write", { sandbox = did, path = dpath, data = core.b64encode(data),
        offset = offset, truncate = offset == 0 })
      if not r then f:close(); return die("cp: %s", errmsg(e)) end
      offset = offset + #data
    until #data < chunk
    f:close()
    return 0
  end
  local st, serr = c:call("fs.stat", { sandbox = sid, path = spath })
  if not st then return die("cp: %s", errmsg(serr)) end
  if st.type ~= "file" then return die("cp: %s is a %s; only files are copied", spath, st.type) end
  local f, err = io.open(args[2], "wb")
  if not f then return die("%s", err) end
  local offset = 0
  while true do
    local r, e = c:call("fs.read", { sandbox = sid, path = spath, offset = offset, length = chunk })
    if not r then f:close(); return die("cp: %s", errmsg(e)) end
    local data = core.b64decode(r.data) or ""
    f:write(data)
    offset = offset + #data
    if r.eof or #data == 0 then break end
  end
  f:close()
  return 0
end

return M
