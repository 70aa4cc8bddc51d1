--- The `tupper` command line's argument parsing and error reporting,
-- driven by the verb table (client/cli_table.lua) and shared by
-- client/cli.lua and the verbs (client/cli_verbs.lua).
--
-- Options: `--long VALUE`, `--long=VALUE`, `-s VALUE`, `-sVALUE`, and
-- bundled short flags (`-it` is `-i -t`; a bundle ends at the first letter
-- that takes a value, the rest of the word being that value).  `--` ends
-- the options.  A verb whose arguments end in a command (run, exec) or a
-- script (repl) stops at it: what follows is the command's own.
local units = require("tupper.util.units")

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

local function shown(o)
  return o.long and ("--" .. o.long) or ("-" .. o.short)
end
M.shown = shown

-- Checks and stores one option's value into opts; returns nil or an error.
local function store(opts, o, v)
  local name = shown(o)
  local k = o.kind
  if k == nil then
    opts[o.key] = true
    return nil
  end
  local val = v
  if k == "int" then
    val = math.tointeger(tonumber(v))
    if not val or (o.min and val < o.min) or (o.max and val > o.max) then
      if o.min and o.max then return ("%s wants a whole number in %d..%d, got %q"):format(name, o.min, o.max, v) end
      if o.min then return ("%s wants a whole number of at least %d, got %q"):format(name, o.min, v) end
      return ("%s wants a whole number, got %q"):format(name, v)
    end
  elseif k == "number" then
    val = tonumber(v)
    if not val or val ~= val then return ("%s wants a number, e.g. 0.5, got %q"):format(name, v) end
  elseif k == "size" then
    local _, err = units.size(v)
    if err then return ("%s: %s"):format(name, err) end
  elseif k == "duration" then
    local _, err = units.duration(tonumber(v) or v)
    if err then return ("%s: %s"):format(name, err) end
    val = tonumber(v) or v
  elseif k == "enum" then
    local ok = false
    for _, c in ipairs(o.values) do ok = ok or c == v end
    if not ok then return ("%s wants %s, got %q"):format(name, table.concat(o.values, " or "), v) end
  elseif k == "kv" then
    local key, value = v:match("^([^=]+)=(.*)$")
    if not key then return ("%s wants K=V, got %q"):format(name, v) end
    opts[o.key] = opts[o.key] or {}
    opts[o.key][key] = value
    return nil
  end
  if o.repeatable then
    opts[o.key] = opts[o.key] or {}
    table.insert(opts[o.key], val)
  else
    opts[o.key] = val
  end
  return nil
end

--- Parses args (the words after the verb) by the verb entry v (a
-- cli_table.VERBS item).  Returns { opts = { key = value }, args = {
-- positional... }, cmd = { command words } or nil, help = true when -h or
-- --help came, raw = args }, or nil and an error message.
function M.parse(v, args)
  local long, short = {}, {}
  for _, o in ipairs(v.options) do
    if o.long then long[o.long] = o end
    if o.short then short[o.short] = o end
  end
  -- how many positionals come before the command (or script), if any
  local cmd_at
  for n, a in ipairs(v.args) do
    if a.kind == "command" or a.kind == "script" then cmd_at = n - 1; break end
  end
  local opts, pos, cmd = {}, {}, nil
  local no_opts = false
  local i = 1
  local function value(o, attached)
    if attached then return attached end
    i = i + 1
    if args[i] == nil then return nil, ("option %s needs a value (%s)"):format(shown(o), o.value) end
    return args[i]
  end
  while i <= #args do
    local a = args[i]
    if not no_opts and a == "--" then
      no_opts = true
    elseif not no_opts and a:sub(1, 2) == "--" then
      local name, attached = a:sub(3), nil
      local eq = name:find("=", 1, true)
      if eq then name, attached = name:sub(1, eq - 1), name:sub(eq + 1) end
      local o = long[name]
      if not o then return nil, ("unknown option --%s"):format(name) end
      if o.key == "help" then return { help = true, opts = opts, args = pos, raw = args } end
      if o.kind == nil then
        if attached then return nil, ("option --%s takes no value"):format(name) end
        store(opts, o)
      else
        local val, err = value(o, attached)
        if not val then return nil, err end
        err = store(opts, o, val)
        if err then return nil, err end
      end
    elseif not no_opts and a:sub(1, 1) == "-" and #a > 1 then
      local j = 2
      while j <= #a do
        local ch = a:sub(j, j)
        local o = short[ch]
        if not o then
          return nil, #a > 2 and ("unknown option -%s (in %s)"):format(ch, a) or ("unknown option -%s"):format(ch)
        end
        if o.key == "help" then return { help = true, opts = opts, args = pos, raw = args } end
        if o.kind == nil then
          store(opts, o)
          j = j + 1
        else
          local rest = a:sub(j + 1)
          local val, err = value(o, rest ~= "" and rest or nil)
          if not val then return nil, err end
          err = store(opts, o, val)
          if err then return nil, err end
          break
        end
      end
    elseif cmd_at and #pos == cmd_at then
      cmd = {}
      for k = i, #args do cmd[#cmd + 1] = args[k] end
      break
    else
      pos[#pos + 1] = a
    end
    i = i + 1
  end
  -- the positionals against what the verb takes
  local need, max = 0, 0
  for _, a in ipairs(v.args) do
    if a.kind == "command" or a.kind == "script" then break end
    if not a.optional then need = need + 1 end
    max = a.repeatable and math.huge or max + 1
  end
  if #pos < need then
    return nil, ("missing %s"):format(v.args[#pos + 1].name)
  end
  if #pos > max then
    return nil, ("unexpected argument '%s'"):format(pos[max + 1])
  end
  if cmd_at and not cmd and not v.args[cmd_at + 1].optional then
    return nil, ("missing %s"):format(v.args[cmd_at + 1].name)
  end
  return { opts = opts, args = pos, cmd = cmd, raw = args }
end

--- The options of a sandbox (run, create, exec) in the form the verbs
-- send: env, metadata, interactive, tty, workdir, image, backend, accel, rm,
-- limits = { memory, cpus, pids, disk, timeout }, policy (false for
-- --no-policy), recipe, network ("all", "none" or { allow, deny }).
-- Raises (a string) when --network is mixed with --allow/--deny.
function M.box_opts(p)
  local o = p.opts
  local b = { env = o.env or {}, metadata = o.metadata or {}, interactive = o.interactive or false,
    tty = o.tty or false, detach_keys = o.detach_keys, workdir = o.workdir, image = o.image,
    backend = o.backend, accel = o.accel, rm = o.rm, recipe = o.recipe, json = o.json, limits = {} }
  -- --volume NAME:/PATH: sandbox.create's volumes (path -> name)
  for _, v in ipairs(o.volume or {}) do
    local name, path = v:match("^([^:]+):(/.*)$")
    if not name then error(("--volume wants NAME:/PATH, got %q"):format(v), 0) end
    b.volumes = b.volumes or {}
    if b.volumes[path] then error(("--volume: two volumes at %s"):format(path), 0) end
    b.volumes[path] = name
  end
  for _, k in ipairs({ "memory", "cpus", "pids", "disk", "timeout" }) do b.limits[k] = o[k] end
  b.policy = o.policy
  if o.no_policy then b.policy = false end
  if o.allow or o.deny then
    if o.network then error("--allow/--deny and --network do not mix", 0) end
    b.network = { allow = o.allow, deny = o.deny }
  else
    b.network = o.network
  end
  return b
end

return M
