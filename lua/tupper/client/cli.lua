--- The `tupper` command line: the global options, the dispatch of a verb
-- through the verb table (client/cli_table.lua), the verbs that need no
-- daemon (help, version, schema, completion, doctor, daemon, mcp/http,
-- repl), and the connection every other verb (client/cli_verbs.lua) runs
-- over.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local client = require("tupper.wire.client")
local json = require("tupper.util.json")
local units = require("tupper.util.units")
local cli_args = require("tupper.client.cli_args")
local cli_table = require("tupper.client.cli_table")
local cli_doc = require("tupper.client.cli_doc")
local verbs = require("tupper.client.cli_verbs")

local M = {}

local die = cli_args.die

-- the global options: a verb entry of their own, for the parser
local GLOBAL = { name = "", args = {}, options = {} }
local GLONG = {}
for _, name in ipairs(cli_table.GLOBAL) do
  local o = cli_table.OPTIONS[name]
  GLOBAL.options[#GLOBAL.options + 1] = o
  GLONG[o.long] = o
end

-- image's sub-verbs under their other names
local SUB_ALIAS = { list = "ls", remove = "rm" }

local function client_main(v, p, g)
  local code = 125
  async.spawn(function()
    local c, err = client.connect({ socket = g.socket, state_dir = g.state_dir, autostart = g.autostart })
    if not c then
      code = die("%s", err)
      return
    end
    -- "image prune" is verbs.image_prune; "image ls" is verbs.images
    local fn = verbs[v.alias or (v.name:gsub(" ", "_"))]
    local ok, res = pcall(fn, c, p)
    if not ok then code = die("%s", tostring(res)) else code = res end
    c:close()
  end)
  uv.run()
  uv.walk(function(h) if not h:is_closing() then h:close() end end)
  uv.run()
  return code
end

-- `tupper daemon`'s options into the daemon's opts: each under its key;
-- --max-layer in bytes, and the limits and caps (--default-memory,
-- --max-sandboxes, ...) as daemon/limits.lua parses them.  Returns opts,
-- or nil and what is wrong.
local function daemon_opts(p, g)
  local dlimits = require("tupper.daemon.limits") -- lazy: only `tupper daemon` needs its options
  local o = { socket = g.socket, state_dir = g.state_dir }
  for _, opt in ipairs(cli_table.verb("daemon").options) do
    local val = p.opts[opt.key]
    if val ~= nil and opt.long and dlimits.OPTIONS["--" .. opt.long] then
      local key, parsed = dlimits.parse_option("--" .. opt.long, val)
      if not key then return nil, parsed end
      o[key] = parsed
    elseif val ~= nil then
      o[opt.key] = val
    end
  end
  if o.max_layer then o.max_layer = units.size(o.max_layer) end
  return o
end

-- `tupper help [VERB...] [--scdoc]`
local function help(p)
  if p.opts.scdoc then
    io.stdout:write(cli_doc.scdoc())
    return 0
  end
  if #p.args == 0 then
    io.stdout:write(cli_doc.overview())
    return 0
  end
  local name = table.concat(p.args, " ")
  local v = cli_table.verb(name)
  if v then io.stdout:write(cli_doc.verb_help(v)); return 0 end
  if #cli_table.subverbs(name) > 0 then io.stdout:write(cli_doc.group_help(name)); return 0 end
  return die("help: no command '%s' (see tupper --help)", name)
end

local LOCAL = {}
function LOCAL.help(p) return help(p) end
function LOCAL.version() print("tupper " .. core.version); return 0 end
function LOCAL.schema() print(json.pretty(require("tupper.wire.schema").export())); return 0 end
function LOCAL.completion(p)
  local shell = p.args[1]
  local gen = require("tupper.client.cli_complete") -- lazy: start-up cost of the other verbs
  if shell == "bash" then io.stdout:write(gen.bash()); return 0 end
  if shell == "zsh" then io.stdout:write(gen.zsh()); return 0 end
  return die("completion: want bash or zsh, got '%s'", shell)
end
function LOCAL.doctor(p, g)
  return require("tupper.client.doctor").main(p, g) -- lazy: start-up cost, as above
end
function LOCAL.daemon(p, g)
  local o, err = daemon_opts(p, g)
  if not o then return die("daemon: %s (see tupper daemon --help)", err) end
  -- lazy: start-up cost, only `tupper daemon` loads the daemon
  return require("tupper.daemon.main").run(o)
end
-- mcp and http: their options, checked here, go to the node server in
-- the one spelling it reads (`--listen X`, never `--listen=X`)
function LOCAL.mcp(p, g, verb)
  local args = {}
  for _, o in ipairs(cli_table.verb(verb).options) do
    if p.opts[o.key] ~= nil then
      args[#args + 1] = "--" .. o.long
      if o.kind then args[#args + 1] = p.opts[o.key] end
    end
  end
  return require("tupper.client.nodejs").main(verb, args, g) -- lazy: start-up cost, as above
end
LOCAL.http = LOCAL.mcp

function LOCAL.repl(p, g)
  local ok, code = pcall(require("tupper.client.repl").main, p.raw, g) -- lazy: start-up cost, as above
  uv.walk(function(h) if not h:is_closing() then h:close() end end)
  uv.run()
  if not ok then return die("%s", tostring(code)) end
  return code
end

--- Entry point: argv as given to main (argv[0] is the program).
function M.main(argv)
  -- the global options: up to the first word that is not one
  local i = 1
  local gwords = {}
  while argv[i] and argv[i]:sub(1, 1) == "-" and argv[i] ~= "-" do
    local a = argv[i]
    gwords[#gwords + 1] = a
    local o = GLONG[a:match("^%-%-([^=]+)$") or ""]
    if o and o.kind then
      gwords[#gwords + 1] = argv[i + 1]
      i = i + 1
    end
    i = i + 1
  end
  local gp, gerr = cli_args.parse(GLOBAL, gwords)
  if not gp then return die("%s (see tupper --help)", gerr) end
  if gp.help then io.stdout:write(cli_doc.overview()); return 0 end
  if gp.opts.version then return LOCAL.version() end
  local g = { socket = gp.opts.socket, state_dir = gp.opts.state_dir, autostart = gp.opts.autostart }
  local verb = argv[i]
  if verb == nil then
    io.stderr:write(cli_doc.overview())
    return 2
  end
  i = i + 1
  local name = verb
  local groups = { image = "ls, inspect, rm, import or prune", volume = "create, ls, inspect or rm" }
  if groups[verb] then
    local sub = argv[i]
    if sub == nil or sub == "--help" or sub == "-h" then
      -- asked for, on stdout; a usage error, on stderr
      local out = sub and io.stdout or io.stderr
      out:write(cli_doc.group_help(verb))
      return sub and 0 or 2
    end
    name = verb .. " " .. (SUB_ALIAS[sub] or sub)
    if not cli_table.verb(name) then
      return die("%s: no command '%s': want %s (see tupper %s --help)", verb, sub, groups[verb], verb)
    end
    i = i + 1
  elseif verb == "snapshot" and (argv[i] == "ls" or argv[i] == "list" or argv[i] == "rm" or argv[i] == "remove") then
    -- `tupper snapshot ID [NAME]` takes one; `snapshot ls|rm` are its sub-verbs
    name = "snapshot " .. (SUB_ALIAS[argv[i]] or argv[i])
    i = i + 1
  end
  local v = cli_table.verb(name)
  if not v then return die("unknown command '%s' (see tupper --help)", verb) end
  local args = {}
  for k = i, #argv do args[#args + 1] = argv[k] end
  local p, err = cli_args.parse(v, args)
  if not p then return die("%s: %s (see tupper %s --help)", v.name, err, v.name) end
  if p.help then io.stdout:write(cli_doc.verb_help(v)); return 0 end
  if not v.daemon then return LOCAL[v.name](p, g, v.name) end
  local ok, code = pcall(client_main, v, p, g)
  if not ok then return die("%s", tostring(code)) end
  return code
end

return M
