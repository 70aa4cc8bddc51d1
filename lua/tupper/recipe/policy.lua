--- Policy files: `tupper.lua` next to an agent project says what its
-- sandboxes may ask for, and can hold hooks the daemon calls.
--
--     return policy {
--       max = { memory = "1G", cpus = 2, timeout = "1h" },
--       network = "none",
--       on_exec = function(argv) if argv[1] == "rm" then return false, "no rm" end return true end,
--     }
--
-- Loaded in the locked-down VM (tupper.vm); each hook call runs under
-- vm.CALL_LIMITS.  A hook that fails, loops or returns nothing refuses
-- (fail closed).  docs/policy.md.
local uv = require("luv")
local schema = require("tupper.wire.schema")
local units = require("tupper.util.units")
local recipe = require("tupper.recipe.file")
local vm = require("tupper.recipe.jail")

local M = {}

M.FILENAME = "tupper.lua"
M.FIELDS = { "max", "network", "on_create", "on_exec", "on_file", "on_connect" }
M.FILE_OPS = { "read", "write", "list", "stat", "mkdir", "remove", "rename" }

local HOOKS = { on_create = true, on_exec = true, on_file = true, on_connect = true }

local function constructor(seen, chunkname)
  return function(body)
    if type(body) ~= "table" then error("policy { ... }: expected a table", 2) end
    if seen.count then error("a policy file defines one policy", 2) end
    -- `return policy {...}` is a tail call: the caller's frame may be gone,
    -- and then the line is left to the field search of recipe.where
    local info = debug.getinfo(2, "Sl")
    seen.count = 1
    if info and info.source == "@" .. chunkname then seen.line = info.currentline end
    return body
  end
end

--- Validates a policy table p (plain data); origin = { file, line, text }.
-- Returns the normalised policy, or nil, err.
function M.validate(p, origin)
  if type(p) ~= "table" then
    return nil, recipe.where(origin, nil, "a policy file must return policy { ... } or a table")
  end
  local out = { file = origin.file }
  for k, v in pairs(p) do
    local err, val, path
    if k == "max" then
      err, val = schema.check("max", schema.LIMITS, v)
      if err then
        path = {}
        for key in (err:match("^'([^']+)'") or "max"):gmatch("[^.]+") do path[#path + 1] = key end
      end
    elseif k == "network" then
      if v == "all" then
        err, path = "'network' = \"all\" is not a cap; leave network out to allow what recipes ask", { k }
      else
        err, val, path = recipe.check_network("network", v)
      end
    elseif type(k) == "string" and HOOKS[k] then
      if type(v) ~= "function" then err = ("'%s' must be a function"):format(k) end
      val = v
    else
      err = ("unknown field '%s' (expected one of: %s)"):format(tostring(k), table.concat(M.FIELDS, ", "))
    end
    if err then return nil, recipe.where(origin, path or { k }, err) end
    out[k] = val
  end
  return out
end

--- Loads a policy from text; chunkname names it in messages.
function M.load_string(text, chunkname)
  local seen = {}
  local p, err = vm.load_string(text, chunkname, { policy = constructor(seen, chunkname) })
  if err then return nil, err end
  return M.validate(p, { file = chunkname, line = seen.line, text = text })
end

--- Loads and validates a policy file.  Returns the policy, or nil, err.
function M.load(path)
  local text, err = vm.read_source(path)
  if not text then return nil, err end
  return M.load_string(text, path)
end

--- The path of the nearest tupper.lua from start_dir upward, or nil.
function M.find(start_dir)
  local cwd = uv.cwd() or os.getenv("PWD") or "."
  local dir = start_dir or cwd
  if dir:sub(1, 1) ~= "/" then dir = cwd .. "/" .. dir end
  dir = dir:gsub("/+$", "")
  while true do
    local path = (dir == "" and "" or dir) .. "/" .. M.FILENAME
    local f = io.open(path, "rb")
    if f then
      f:close()
      return path
    end
    if dir == "" then return nil end
    dir = dir:gsub("/[^/]*$", "")
  end
end

-- ------------------------------------------------------------- decisions

local function fmt_duration(s)
  for _, u in ipairs({ { "d", 86400 }, { "h", 3600 }, { "m", 60 } }) do
    if s >= u[2] and s % u[2] == 0 then return ("%d%s"):format(s // u[2], u[1]) end
  end
  return ("%gs"):format(s)
end

local FORMAT = {
  memory = units.format_size, disk = units.format_size,
  cpus = function(n) return ("%g"):format(n) end, pids = tostring,
  timeout = function(s) return s == 0 and "0 (no timeout)" or fmt_duration(s) end,
}
local LIMIT_ORDER = { "memory", "cpus", "pids", "disk", "timeout" }

local function refuse(pol, fmt, ...)
  return nil, ("policy %s: " .. fmt):format(pol.file, ...)
end

-- Caps limits (normalised numbers) at pol.max: a limit left out gets the
-- daemon's default for it (defaults, docs/limits.md) or the cap, whichever
-- is lower; one above the cap is refused.  0 means none (no limit, no
-- timeout), above any cap.  A cap of 0 caps nothing.
local function cap_limits(pol, limits, defaults)
  local out = {}
  for k, v in pairs(limits or {}) do out[k] = v end
  for _, k in ipairs(LIMIT_ORDER) do
    local max = pol.max and pol.max[k]
    if max and max ~= 0 then
      local asked = out[k]
      if asked == nil then
        local def = defaults and defaults[k]
        if def == nil and k == "timeout" then def = schema.DEFAULT_TIMEOUT end
        out[k] = (def and def ~= 0) and math.min(def, max) or max
      elseif asked > max or asked == 0 then
        return refuse(pol, "max.%s is %s, asked %s", k, FORMAT[k](max),
                      asked == 0 and (k == "timeout" and FORMAT[k](0) or "0 (no limit)") or FORMAT[k](asked))
      else
        out[k] = asked
      end
    end
  end
  return out
end

-- Calls hook name with args; returns ok, results...  A failed call refuses.
local function call_hook(pol, name, ...)
  local res = table.pack(vm.call(pol[name], ...))
  if not res[1] then return refuse(pol, "%s failed: %s", name, tostring(res[2])) end
  return table.unpack(res, 1, res.n)
end

local function reason_of(pol, name, why)
  if type(why) == "string" and why ~= "" then return refuse(pol, "%s refused: %s", name, why) end
  return refuse(pol, "%s refused", name)
end

--- Applies the policy to sandbox.create params (as schema.validate
-- returns them): limits capped at max (refused above it), then on_create
-- may allow (true), refuse (false/nil[, reason]) or return new params
-- (validated, and capped again).  defaults: the daemon's default limits
-- (a limit left out gets the lower of its default and the cap).  Returns
-- params, or nil, err.
function M.apply_create(pol, params, defaults)
  params = params or {}
  local limits, err = cap_limits(pol, params.limits, defaults)
  if not limits then return nil, err end
  local out = {}
  for k, v in pairs(params) do out[k] = v end
  out.limits = limits
  if not pol.on_create then return out end

  local ok, verdict, why = call_hook(pol, "on_create", out)
  if not ok then return nil, verdict end
  if verdict == true then return out end
  if type(verdict) ~= "table" then return reason_of(pol, "on_create", why) end
  local spec, verr = schema.validate("sandbox.create", verdict)
  if not spec then return refuse(pol, "on_create returned bad params: %s", verr) end
  local capped, cerr = cap_limits(pol, spec.limits, defaults)
  if not capped then return nil, cerr end
  spec.limits = capped
  return spec
end

local function check_argv(argv)
  if type(argv) ~= "table" or #argv == 0 then return false end
  for k, v in pairs(argv) do
    if math.type(k) ~= "integer" or k < 1 or k > #argv then return false end
    if type(v) ~= "string" or #v > 32768 or v:find("\0", 1, true) then return false end
  end
  return #argv <= 4096
end

--- Runs on_exec(argv): true allows argv, a table replaces it (a non-empty
-- list of strings), false or nil[, reason] refuses.  Returns argv or nil,
-- err.  Without a hook, argv passes.
function M.check_exec(pol, argv)
  if not pol.on_exec then return argv end
  local ok, verdict, why = call_hook(pol, "on_exec", argv)
  if not ok then return nil, verdict end
  if verdict == true then return argv end
  if type(verdict) == "table" then
    if not check_argv(verdict) then return refuse(pol, "on_exec returned a bad argv") end
    return verdict
  end
  return reason_of(pol, "on_exec", why)
end

--- Runs on_file(op, path) for a file operation (one of M.FILE_OPS): true
-- allows; anything else refuses.  Returns true, or nil, err.
--- Runs on_connect(host, port, addr) for a connection the network rules
-- allowed (host: the name the box asked for, or the address; addr: the
-- address the daemon will connect to).  true allows; anything else
-- refuses.  Returns true or nil, err.  Without a hook, it passes.
function M.check_connect(pol, host, port, addr)
  if not pol.on_connect then return true end
  local ok, verdict, why = call_hook(pol, "on_connect", host, port, addr)
  if not ok then return nil, verdict end
  if verdict == true then return true end
  return reason_of(pol, "on_connect", why)
end

function M.check_file(pol, op, path)
  if not pol.on_file then return true end
  local ok, verdict, why = call_hook(pol, "on_file", op, path)
  if not ok then return nil, verdict end
  if verdict == true then return true end
  return reason_of(pol, "on_file", why)
end

return M
