--- The `tupper` command line's argument parsing and error reporting,
-- shared by client/cli.lua and the verbs (client/cli_verbs.lua).
local M = {}

--- Prints "tupper: <message>" on stderr; returns 125, the exit code of a
-- verb that failed before its command ran.
function M.die(fmt, ...)
  io.stderr:write("tupper: ", fmt:format(...), "\n")
  return 125
end

--- The message of an error a call returned (a JSON-RPC error or a string).
function M.errmsg(e)
  return type(e) == "table" and tostring(e.message) or tostring(e)
end

--- Parses the options of run, create and exec from args[i]: allowed is
-- the set of the verb's options (RUN_OPTS, CREATE_OPTS, EXEC_OPTS).
-- Returns opts, the arguments after them; raises (a string) on a bad one.
function M.parse_opts(args, i, allowed)
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
    elseif a == "--accel" then o.accel = value() -- a microVM's: kvm, tcg or auto
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
  "--allow", "--deny", "--network", "--backend", "--accel" }
local RUN_OPTS = { ["-i"] = 1, ["--interactive"] = 1, ["-e"] = 1, ["--env"] = 1, ["-w"] = 1,
  ["--workdir"] = 1, ["--image"] = 1, ["--metadata"] = 1, ["--rm"] = 1 }
local CREATE_OPTS = { ["-e"] = 1, ["--env"] = 1, ["--image"] = 1, ["--metadata"] = 1,
  ["-w"] = 1, ["--workdir"] = 1, ["--recipe"] = 1 }
RUN_OPTS["--recipe"] = 1
for _, o in ipairs(LIMIT_OPTS) do RUN_OPTS[o] = 1; CREATE_OPTS[o] = 1 end
local EXEC_OPTS = { ["-i"] = 1, ["--interactive"] = 1, ["-e"] = 1, ["--env"] = 1, ["-w"] = 1,
  ["--workdir"] = 1 }
M.RUN_OPTS, M.CREATE_OPTS, M.EXEC_OPTS = RUN_OPTS, CREATE_OPTS, EXEC_OPTS

--- The sandbox id and path of "ID:/path" (cp's remote side), or nil.
function M.split_remote(s)
  local id, path = s:match("^([a-z0-9][a-z0-9-]*):(.+)$")
  return id, path
end

return M
