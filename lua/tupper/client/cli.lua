--- The `tupper` command line: client verbs over the socket API.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local client = require("tupper.wire.client")
local json = require("tupper.util.json")
local schema = require("tupper.wire.schema")

local M = {}

local recipe_spec

local USAGE = [[
usage: tupper [--socket PATH] [--state-dir DIR] COMMAND [ARGS]

Sandboxes for AI agents, on your own machine.

commands:
  run [OPTIONS] [--] CMD...     run CMD in a new sandbox, then remove it
  create [OPTIONS]              create a sandbox and print its id
  exec [OPTIONS] ID [--] CMD... run CMD in a sandbox
  ls [--json]                   list sandboxes
  cp SRC DST                    copy a file: FILE ID:/path or ID:/path FILE
  kill ID...                    kill sandboxes and remove them
  pause ID... / resume ID...    freeze and thaw every process of sandboxes
  stats [--json] ID             resource counters of a sandbox
  pull [-q] REF                 pull an image (linux/amd64) from its registry
                                into the daemon's store; prints REF@DIGEST
  logs --network [--json] ID    the sandbox's network decisions (allow/deny)
  port ID PORT                  forward PORT of the sandbox to the host's
                                loopback; prints 127.0.0.1:HOSTPORT
  import PATH [NAME]            import an image: an OCI layout, a `docker save`
                                tar, or a rootfs tar or directory
  images [--json]               list the images of the store
  rmi NAME...                   remove images
  image inspect NAME            an image's digest, layers and config (JSON)
  image prune [--all]           remove blobs and layers no image needs
                                (--all: also images no sandbox uses and no
                                lockfile pins)
  daemon [--socket PATH] [--state-dir DIR] [--log FILE] [--pool N]
         [--vm-pool M] [--policy FILE] [--max-layer SIZE]
                                run the daemon in the foreground; it keeps
                                N boxes started for fast creates (default 2)
                                and M microVMs frozen (default 0);
                                FILE's policy binds every sandbox; an image
                                layer may unpack to SIZE (default 16G)
  repl [-e CODE] [SCRIPT ARG...]
                                a Lua prompt with the client API loaded as
                                `tupper` (docs/repl.md); -e and SCRIPT run
                                without a prompt
  build RECIPE.lua              run a recipe's files and setup once (a cached
                                layer) and write RECIPE.lock pinning them
  schema                        print the socket API's schema (JSON)
  mcp [--socket PATH]           serve MCP on stdio (docs/mcp.md; needs node)
  http [--listen ADDR:PORT] [--token T]
                                serve the HTTP API (docs/http.md; needs node)
  version                       print the version

options of run, create and exec:
  -i, --interactive     pass stdin through (run, exec)
  -e, --env K=V         set an environment variable (repeatable)
  -w, --workdir DIR     working directory (run, exec; create: the default)
  --image NAME          image (run, create; default: the embedded 'default');
                        run with no CMD runs the image's Entrypoint + Cmd
  --backend NAME        linux (namespaces, the default) or microvm (a VM with
                        its own kernel, docs/microvm.md) (run, create)
  --metadata K=V        attach metadata (run, create; repeatable)
  --rm                  remove the sandbox after run (the default)
  --memory SIZE         memory limit, e.g. 256M (run, create)
  --cpus N              CPU quota in cores, e.g. 0.5 (run, create)
  --pids N              most processes at once (run, create)
  --disk SIZE           most the box can write, e.g. 1G (run, create)
  --timeout DURATION    lifetime, e.g. 10m; 0 = until killed (create: 5m,
                        run: none)
  --policy FILE         policy file for the sandbox (run, create; default:
                        the nearest tupper.lua from here upward)
  --no-policy           send no policy file (run, create)
  --allow RULE          let the box reach RULE, e.g. pypi.org:443 or
                        10.0.0.0/8:5432 (run, create; repeatable;
                        docs/network.md)
  --deny RULE           never let it reach RULE (run, create; repeatable)
  --network all|none    every public address, or nothing (the default)
  --recipe FILE|NAME    make the sandbox from a recipe (run, create): a Lua
                        file, honouring FILE's .lock beside it, or a shipped
                        recipe's name (docs/recipes.md); the options above
                        override the recipe's fields

The client finds the daemon through --socket, $TUPPER_SOCKET or the default
socket, and starts one when none is listening.
]]

local function die(fmt, ...)
  io.stderr:write("tupper: ", fmt:format(...), "\n")
  return 125
end

-- Parses options shared by run/create/exec; returns opts, rest or nil, err.
local function parse_opts(args, i, allowed)
  local o = { env = {}, metadata = {}, interactive = false, limits = {} }
  while i <= #args do
    local a = args[i]
    local function value()
      i = i + 1
      if args[i] == nil then error(("option %s needs a value"):format(a), 0) end
      return args[i]
    end
    local function kv(t, s)
      local k, v = s:match("^([^=]+)=(.*)$")
      if not k then error(("%s wants K=V, got %q"):format(a, s), 0) end
      t[k] = v
    end
    if a == "--" then
      i = i + 1
      break
    elseif a:sub(1, 1) ~= "-" or a == "-" then
      break
    elseif not allowed[a] then
      error(("unknown option %s"):format(a), 0)
    elseif a == "-i" or a == "--interactive" then o.interactive = true
    elseif a == "-e" or a == "--env" then kv(o.env, value())
    elseif a == "--metadata" then kv(o.metadata, value())
    elseif a == "-w" or a == "--workdir" then o.workdir = value()
    elseif a == "--image" then o.image = value()
    elseif a == "--backend" then o.backend = value()
    elseif a == "--rm" then o.rm = true
    elseif a == "--memory" or a == "--disk" then o.limits[a:sub(3)] = value()
    elseif a == "--cpus" then
      o.limits.cpus = tonumber(value()) or error("--cpus wants a number, e.g. 0.5", 0)
    elseif a == "--pids" then
      o.limits.pids = math.tointeger(tonumber(value())) or error("--pids wants a whole number", 0)
    elseif a == "--timeout" then
      local v = value()
      o.limits.timeout = tonumber(v) or v
    elseif a == "--json" then o.json = true
    elseif a == "--policy" then o.policy = value()
    elseif a == "--no-policy" then o.policy = false
    elseif a == "--recipe" then o.recipe = value()
    elseif a == "--allow" or a == "--deny" then
      local key = a:sub(3)
      if type(o.network) ~= "table" then
        if o.network ~= nil then error("--allow/--deny and --network do not mix", 0) end
        o.network = {}
      end
      o.network[key] = o.network[key] or {}
      table.insert(o.network[key], value())
    elseif a == "--network" then
      local v = value()
      if v ~= "all" and v ~= "none" then error("--network wants all or none (rules: --allow)", 0) end
      if type(o.network) == "table" then error("--allow/--deny and --network do not mix", 0) end
      o.network = v
    end
    i = i + 1
  end
  local rest = {}
  for k = i, #args do rest[#rest + 1] = args[k] end
  return o, rest
end

local LIMIT_OPTS = { "--memory", "--cpus", "--pids", "--disk", "--timeout", "--policy", "--no-policy",
  "--allow", "--deny", "--network", "--backend" }
local RUN_OPTS = { ["-i"] = 1, ["--interactive"] = 1, ["-e"] = 1, ["--env"] = 1, ["-w"] = 1,
  ["--workdir"] = 1, ["--image"] = 1, ["--metadata"] = 1, ["--rm"] = 1 }
local CREATE_OPTS = { ["-e"] = 1, ["--env"] = 1, ["--image"] = 1, ["--metadata"] = 1,
  ["-w"] = 1, ["--workdir"] = 1, ["--recipe"] = 1 }
RUN_OPTS["--recipe"] = 1
for _, o in ipairs(LIMIT_OPTS) do RUN_OPTS[o] = 1; CREATE_OPTS[o] = 1 end
local EXEC_OPTS = { ["-i"] = 1, ["--interactive"] = 1, ["-e"] = 1, ["--env"] = 1, ["-w"] = 1,
  ["--workdir"] = 1 }

local function errmsg(e)
  return type(e) == "table" and tostring(e.message) or tostring(e)
end

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
  local policy = require("tupper.recipe.policy")
  if o.policy == false then return nil end
  local path = o.policy or policy.find()
  if not path then return nil end
  local text, err = require("tupper.recipe.jail").read_source(path)
  if not text then error(("policy: %s"):format(err), 0) end
  return { source = text, name = path }
end

local verbs = {}

-- The `recipe` param of --recipe FILE|NAME, or nil.
recipe_spec = function(o)
  if not o.recipe then return nil end
  return require("tupper.recipe.file").client_spec(o.recipe)
end

--- tupper build RECIPE: builds the recipe's layer and writes RECIPE.lock.
function verbs.build(c, args)
  if #args ~= 1 then return die("build wants one recipe file") end
  local path = args[1]
  local rec = require("tupper.recipe.file")
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

function verbs.run(c, args)
  local o, rest = parse_opts(args, 1, RUN_OPTS)
  local image_cmd = #rest == 0 and o.image and o.image ~= "default"
  if #rest == 0 then rest = { "/bin/sh" } end
  local pol = policy_param(o)
  -- a run box lives as long as its command, as with docker run; a policy
  -- with max.timeout refuses "forever", so it lives as long as that allows
  if o.limits.timeout == nil then
    o.limits.timeout = 0
    local p = pol and require("tupper.recipe.policy").load_string(pol.source, pol.name)
    if p and p.max and p.max.timeout then o.limits.timeout = p.max.timeout end
  end
  -- the box goes with this client, even if it is killed (docker run --rm
  -- without leaving a container behind)
  local spec, serr = recipe_spec(o)
  if serr then return die("%s", serr) end
  local sb, err = c:call("sandbox.create", { image = o.image, env = next(o.env) and o.env or nil,
    metadata = next(o.metadata) and o.metadata or nil, limits = o.limits, kill_on_disconnect = true,
    policy = pol, recipe = spec, network = o.network, backend = o.backend })
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

function verbs.create(c, args)
  local o, rest = parse_opts(args, 1, CREATE_OPTS)
  if #rest > 0 then return die("create takes no arguments") end
  local spec, serr = recipe_spec(o)
  if serr then return die("%s", serr) end
  local sb, err = c:call("sandbox.create", { image = o.image, env = next(o.env) and o.env or nil,
    metadata = next(o.metadata) and o.metadata or nil, cwd = o.workdir,
    limits = next(o.limits) and o.limits or nil, policy = policy_param(o), recipe = spec,
    network = o.network, backend = o.backend })
  if not sb then return die("%s", errmsg(err)) end
  print(sb.id)
  return 0
end

function verbs.exec(c, args)
  local o, rest = parse_opts(args, 1, EXEC_OPTS)
  local id = table.remove(rest, 1)
  if not id then return die("exec needs a sandbox id") end
  if rest[1] == "--" then table.remove(rest, 1) end
  if #rest == 0 then return die("exec needs a command") end
  return run_in(c, id, rest, o)
end

local function human(n)
  local units = { "B", "KiB", "MiB", "GiB", "TiB" }
  local u = 1
  while n >= 1024 and u < #units do n = n / 1024; u = u + 1 end
  return u == 1 and ("%d B"):format(n) or ("%.1f %s"):format(n, units[u])
end

function verbs.pull(c, args)
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
        (" "):rep(width - fill), human(done), human(total), math.floor(100 * done / total)))
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

function verbs.ls(c, args)
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

function verbs.kill(c, args)
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

function verbs.logs(c, args)
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

function verbs.port(c, args)
  local id, port = args[1], math.tointeger(tonumber(args[2] or ""))
  if not id or not port or #args ~= 2 then return die("usage: tupper port ID PORT") end
  local r, err = c:call("sandbox.expose", { id = id, port = port })
  if not r then return die("port %s %d: %s", id, port, errmsg(err)) end
  print(("%s:%d"):format(r.host, math.tointeger(r.port)))
  return 0
end

function verbs.pause(c, args) return each_id(c, args, "sandbox.pause", "pause") end
function verbs.resume(c, args) return each_id(c, args, "sandbox.resume", "resume") end

function verbs.stats(c, args)
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

local function human_size(n)
  n = tonumber(n) or 0
  for _, u in ipairs({ "B", "KB", "MB", "GB" }) do
    if n < 1000 or u == "GB" then return u == "B" and ("%d B"):format(n) or ("%.1f %s"):format(n, u) end
    n = n / 1000
  end
end

function verbs.import(c, args)
  if #args < 1 or #args > 2 then return die("import wants PATH [NAME]") end
  local path = uv.fs_realpath(args[1])
  if not path then return die("import: no such file or directory: %s", args[1]) end
  local r, err = c:call("image.import", { path = path, ref = args[2] })
  if not r then return die("%s", errmsg(err)) end
  print(("%s %s"):format(r.ref, r.digest))
  return 0
end

function verbs.images(c, args)
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
    print(("%-48s %-19s %-10s %-6d %s"):format(i.ref, i.digest:sub(1, 19), human_size(i.size),
      math.tointeger(i.layers) or 0, type(i.created) == "string" and i.created or "-"))
  end
  return 0
end

function verbs.rmi(c, args)
  if #args == 0 then return die("rmi needs an image name") end
  local code = 0
  for _, ref in ipairs(args) do
    local r, err = c:call("image.remove", { ref = ref })
    if not r then code = die("rmi %s: %s", ref, errmsg(err)) else print(r.ref) end
  end
  return code
end

function verbs.image(c, args)
  local sub = table.remove(args, 1)
  if sub == "ls" or sub == "list" then return verbs.images(c, args)
  elseif sub == "rm" or sub == "remove" then return verbs.rmi(c, args)
  elseif sub == "import" then return verbs.import(c, args)
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

local function split_remote(s)
  local id, path = s:match("^([a-z0-9][a-z0-9-]*):(.+)$")
  return id, path
end

function verbs.cp(c, args)
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

local function client_main(verb, args, g)
  local code = 125
  async.spawn(function()
    local c, err = client.connect({ socket = g.socket, state_dir = g.state_dir })
    if not c then
      code = die("%s", err)
      return
    end
    local ok, res = pcall(verbs[verb], c, args)
    if not ok then code = die("%s", tostring(res)) else code = res end
    c:close()
  end)
  uv.run()
  uv.walk(function(h) if not h:is_closing() then h:close() end end)
  uv.run()
  return code
end

--- Entry point: argv as given to main (argv[0] is the program).
function M.main(argv)
  local g, i = {}, 1
  while argv[i] and argv[i]:sub(1, 2) == "--" do
    local a = argv[i]
    if a == "--socket" then g.socket = argv[i + 1]; i = i + 2
    elseif a == "--state-dir" then g.state_dir = argv[i + 1]; i = i + 2
    elseif a == "--help" then io.stdout:write(USAGE); return 0
    elseif a == "--version" then print("tupper " .. core.version); return 0
    else return die("unknown option %s (see tupper --help)", a) end
  end
  local verb = argv[i]
  local args = {}
  for k = i + 1, #argv do args[#args + 1] = argv[k] end
  if verb == nil or verb == "help" then
    io.stdout:write(USAGE)
    return verb == nil and 2 or 0
  elseif verb == "version" then
    print("tupper " .. core.version)
    return 0
  elseif verb == "schema" then
    print(json.pretty(schema.export()))
    return 0
  elseif verb == "daemon" then
    local o = { socket = g.socket, state_dir = g.state_dir }
    local k = 1
    while k <= #args do
      local a, v = args[k], args[k + 1]
      if a == "--socket" then o.socket = v
      elseif a == "--state-dir" then o.state_dir = v
      elseif a == "--log" then o.log = v
      elseif a == "--policy" then o.policy = v
      elseif a == "--uid-base" then o.uid_base = math.tointeger(tonumber(v))
      elseif a == "--max-layer" then
        o.max_layer = require("tupper.util.units").size(v or "")
        if not o.max_layer then return die("daemon: --max-layer wants a size, e.g. 4G") end
      elseif a == "--pool" then
        o.pool = math.tointeger(tonumber(v))
        if not o.pool or o.pool < 0 or o.pool > 64 then return die("daemon: --pool wants 0..64") end
      elseif a == "--vm-pool" then
        o.vm_pool = math.tointeger(tonumber(v))
        if not o.vm_pool or o.vm_pool < 0 or o.vm_pool > 16 then return die("daemon: --vm-pool wants 0..16") end
      else return die("daemon: unknown option %s", a) end
      if v == nil then return die("daemon: %s needs a value", a) end
      k = k + 2
    end
    return require("tupper.daemon.main").run(o)
  elseif verb == "mcp" or verb == "http" then
    return require("tupper.client.nodejs").main(verb, args, g)
  elseif verb == "repl" then
    local ok, code = pcall(require("tupper.client.repl").main, args, g)
    uv.walk(function(h) if not h:is_closing() then h:close() end end)
    uv.run()
    if not ok then return die("%s", tostring(code)) end
    return code
  elseif verbs[verb] then
    local ok, code = pcall(client_main, verb, args, g)
    if not ok then return die("%s", tostring(code)) end
    return code
  end
  return die("unknown command '%s' (see tupper --help)", verb)
end

return M
