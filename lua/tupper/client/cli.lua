--- The `tupper` command line: its usage, the global options, the verbs
-- that need no daemon (help, version, schema, daemon, mcp/http, repl), and
-- the connection every other verb (client/cli_verbs.lua) runs over.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local client = require("tupper.wire.client")
local json = require("tupper.util.json")
local schema = require("tupper.wire.schema")
local units = require("tupper.util.units")
local cli_args = require("tupper.client.cli_args")
local verbs = require("tupper.client.cli_verbs")

local M = {}

local die = cli_args.die

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
         [--accel kvm|tcg|auto]
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
  --accel kvm|tcg|auto  a microVM's accelerator (run, create; default auto)
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
        o.max_layer = units.size(v or "")
        if not o.max_layer then return die("daemon: --max-layer wants a size, e.g. 4G") end
      elseif a == "--pool" then
        o.pool = math.tointeger(tonumber(v))
        if not o.pool or o.pool < 0 or o.pool > 64 then return die("daemon: --pool wants 0..64") end
      elseif a == "--accel" then
        if v ~= "kvm" and v ~= "tcg" and v ~= "auto" then return die("daemon: --accel wants kvm, tcg or auto") end
        o.accel = v
      elseif a == "--vm-pool" then
        o.vm_pool = math.tointeger(tonumber(v))
        if not o.vm_pool or o.vm_pool < 0 or o.vm_pool > 16 then return die("daemon: --vm-pool wants 0..16") end
      else return die("daemon: unknown option %s", a) end
      if v == nil then return die("daemon: %s needs a value", a) end
      k = k + 2
    end
    -- lazy: start-up cost, only `tupper daemon` loads the daemon
    return require("tupper.daemon.main").run(o)
  elseif verb == "mcp" or verb == "http" then
    return require("tupper.client.nodejs").main(verb, args, g) -- lazy: start-up cost of the other verbs
  elseif verb == "repl" then
    local ok, code = pcall(require("tupper.client.repl").main, args, g) -- lazy: start-up cost, as above
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
