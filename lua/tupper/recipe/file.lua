--- Recipes: what a sandbox is made of, as a Lua file (DESIGN §6).
--
--     return recipe "python" {
--       image = "default", limits = { memory = "512M", timeout = "30m" },
--       env = { PYTHONUNBUFFERED = "1" }, setup = function(box) ... end,
--     }
--
-- Files load in the locked-down VM (tupper.vm) and are validated strictly:
-- an unknown field, a wrong type or a bad size fails with the file, the
-- line and what was expected.  Whether the runtime can honour a valid
-- recipe is a separate question: M.check_enforceable.  docs/recipes.md.
local debian_lock = require("tupper.image.debian_lock")
local json = require("tupper.util.json")
local rules = require("tupper.net.rules")
local schema = require("tupper.wire.schema")
local vm = require("tupper.recipe.jail")

local M = {}

--- The fields of a recipe, in the order messages list them.
M.FIELDS = { "name", "image", "backend", "limits", "network", "env", "workdir", "user", "files", "setup",
             "start" }

--- Other names of shipped recipes: `base` (E2B's default template) is the
-- shipped Python recipe.
M.ALIASES = { base = "python" }

--- Bounds of a start command's ready check (start.timeout), in seconds.
M.START_TIMEOUT, M.START_TIMEOUT_MAX = 60, 3600

local MAX_FILES, MAX_FILE_CONTENT = 1024, 1024 * 1024
local NAME_PATTERN = "^[%w][%w._-]*$"

-- ------------------------------------------------------------ locations

--- The line of a field in a chunk's text: from line `from` on, the line of
-- each key of `keys` in turn ("limits", then "memory").  A heuristic over
-- the text (Lua keeps no line for table fields); `from` when nothing fits.
local function find_line(text, from, keys)
  if not text then return from end
  local lines = {}
  for l in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local line = from
  for _, key in ipairs(keys) do
    if type(key) ~= "string" or not key:match("^[%a_][%w_]*$") then break end
    local found
    for i = line or 1, #lines do
      if lines[i]:find("%f[%w_]" .. key .. "%s*=%f[^=]") then found = i; break end
    end
    if not found then break end
    line = found
  end
  return line
end

--- Formats a validation error at its place: "file:line: field: msg".
-- origin = { file, line (of the constructor, or nil), text }; path = the
-- field's keys ({ "limits", "memory" }) or nil.
function M.where(origin, path, msg)
  local line = find_line(origin.text, origin.line, path or {})
  if line then return ("%s:%d: %s"):format(origin.file, line, msg) end
  return ("%s: %s"):format(origin.file, msg)
end

-- Runs a schema check; on failure returns the message and the field path
-- schema's message names ("'limits.memory': ..." -> { "limits", "memory" }).
local function schema_check(name, spec, v)
  local err, val = schema.check(name, spec, v)
  if not err then return nil, val end
  local path = {}
  for k in (err:match("^'([^']+)'") or name):gmatch("[^.%[]+") do path[#path + 1] = k end
  return err, nil, path
end

-- ------------------------------------------------------------- checks

local is_array = json.is_array -- a list: keys 1..#t only

--- Checks a network field: "none", "all", or { allow = {rule...}, deny =
-- {rule...} } with rules like "pypi.org:443" or "10.0.0.0/8".  Returns
-- nil, the normalised value; or err, nil, path.
function M.check_network(name, v)
  if v == "none" or v == "all" then return nil, v end
  if type(v) ~= "table" then
    return ("'%s' must be \"none\", \"all\" or { allow = {...}, deny = {...} }"):format(name), nil, { name }
  end
  local out = {}
  for k, list in pairs(v) do
    if k ~= "allow" and k ~= "deny" then
      return ("'%s' has an unknown field '%s' (expected allow, deny)"):format(name, tostring(k)), nil, { name, k }
    end
    if type(list) ~= "table" or not is_array(list) then
      return ("'%s.%s' must be a list of rules like \"host:port\""):format(name, k), nil, { name, k }
    end
    for i, rule in ipairs(list) do
      if type(rule) ~= "string" or #rule == 0 or #rule > 300 or rule:find("[%s%z]") then
        return ("'%s.%s[%d]' must be a rule like \"pypi.org:443\" or \"10.0.0.0/8\""):format(name, k, i),
               nil, { name, k }
      end
    end
    out[k] = list
  end
  return nil, out
end

local function check_string(name, v, min, max)
  if type(v) ~= "string" then return ("'%s' must be a string"):format(name) end
  if #v < min or #v > max or v:find("\0", 1, true) then
    return ("'%s' must be %d to %d bytes, without NUL"):format(name, min, max)
  end
  return nil, v
end

local function check_abs_path(name, v)
  local err = check_string(name, v, 1, 4096)
  if err then return err end
  if v:sub(1, 1) ~= "/" then return ("'%s' must be an absolute path"):format(name) end
  for part in v:gmatch("[^/]+") do
    if part == ".." then return ("'%s' must not contain '..'"):format(name) end
  end
  return nil, v
end

local CHECKS = {
  name = function(v)
    local err = check_string("name", v, 1, 64)
    if err then return err end
    if not v:match(NAME_PATTERN) then
      return "'name' must be letters, digits, '.', '_' or '-', starting with a letter or digit"
    end
    return nil, v
  end,
  image = function(v)
    -- an image's name, or a Debian image to build: { debian = "bookworm", packages = {...} }
    if type(v) == "table" then return debian_lock.check_spec(v, "image") end
    if type(v) ~= "string" then
      return "'image' must be an image name or { debian = \"bookworm\", packages = { ... } }"
    end
    return check_string("image", v, 1, 256)
  end,
  backend = function(v) return schema_check("backend", schema.BACKEND, v) end,
  limits = function(v) return schema_check("limits", schema.LIMITS, v) end,
  network = function(v) return M.check_network("network", v) end,
  env = function(v) return schema_check("env", schema.MAP, v) end,
  workdir = function(v) return check_abs_path("workdir", v) end,
  user = function(v)
    if math.type(v) == "integer" then
      if v < 0 or v > 65535 then return "'user' as a uid must be 0..65535" end
      return nil, v
    end
    local err = check_string("user", v, 1, 32)
    if err or not v:match("^[%a_][%w_-]*$") then return "'user' must be a user name or a uid" end
    return nil, v
  end,
  files = function(v)
    if type(v) ~= "table" then return "'files' must map absolute paths to contents" end
    local n = 0
    for path, content in pairs(v) do
      n = n + 1
      local err = check_abs_path("files", path)
      if err then return ("'files' key %q: %s"):format(tostring(path), err:gsub("^'files' ", "")) end
      if type(content) ~= "string" or #content > MAX_FILE_CONTENT then
        return ("'files[%q]' must be a string of at most %d bytes"):format(path, MAX_FILE_CONTENT)
      end
    end
    if n > MAX_FILES then return ("'files' has more than %d entries"):format(MAX_FILES) end
    return nil, v
  end,
  setup = function(v)
    if type(v) ~= "function" then return "'setup' must be a function(box)" end
    return nil, v
  end,
  -- a command started at every create, and a check the create waits for
  start = function(v)
    if type(v) ~= "table" then
      return "'start' must be { cmd = \"...\", ready = \"...\", timeout = \"60s\" }"
    end
    for k in pairs(v) do
      if k ~= "cmd" and k ~= "ready" and k ~= "timeout" then
        return ("'start' has an unknown field '%s' (expected cmd, ready, timeout)"):format(tostring(k)), nil,
               { "start", k }
      end
    end
    local out = {}
    for _, k in ipairs({ "cmd", "ready" }) do
      if v[k] ~= nil then
        local err = check_string("start." .. k, v[k], 1, 32760)
        if err then return err, nil, { "start", k } end
        out[k] = v[k]
      end
    end
    if not out.cmd and not out.ready then return "'start' needs a 'cmd', a 'ready' check or both", nil, { "start" } end
    out.timeout = M.START_TIMEOUT
    if v.timeout ~= nil then
      local err, t = schema_check("start.timeout", { type = "duration" }, v.timeout)
      if err or t <= 0 or t > M.START_TIMEOUT_MAX then
        return ("'start.timeout' must be a duration above 0 and at most %d s"):format(M.START_TIMEOUT_MAX), nil,
               { "start", "timeout" }
      end
      out.timeout = t
    end
    return nil, out
  end,
}

--- Validates a recipe table r (plain data, as vm.load_string returns it).
-- origin = { file, line, text } places the messages.  Returns the
-- normalised recipe (sizes in bytes, durations in seconds, network
-- defaulting to "none", image to "default"), or nil, err.
function M.validate(r, origin)
  origin = origin or { file = "recipe" }
  if type(r) ~= "table" then
    return nil, M.where(origin, nil, "a recipe file must return recipe \"name\" { ... } or a table")
  end
  local out = {}
  for k, v in pairs(r) do
    local check = type(k) == "string" and CHECKS[k]
    if not check then
      return nil, M.where(origin, { k }, ("unknown field '%s' (expected one of: %s)")
        :format(tostring(k), table.concat(M.FIELDS, ", ")))
    end
    local err, val, path = check(v)
    if err then return nil, M.where(origin, path or { k }, err) end
    out[k] = val
  end
  if out.name == nil then return nil, M.where(origin, nil, "'name' is missing") end
  out.image = out.image or "default"
  out.network = out.network or "none"
  out.origin = { file = origin.file, line = origin.line }
  return out
end

--- Checks what a valid recipe asks of the runtime that it cannot do yet.
-- Network rules are enforced (docs/network.md); a rule the daemon cannot
-- parse is refused here, naming the file and line.  Returns true, or nil, err.
function M.check_enforceable(r)
  if r.network ~= nil and r.network ~= "none" then
    local ok, err = rules.compile(r.network)
    if not ok then
      local o = r.origin or { file = "recipe" }
      return nil, M.where({ file = o.file, line = o.line }, nil, err)
    end
  end
  return true
end

--- The sandbox.create parameters a recipe stands for (setup and files are
-- the caller's to run and write after the box starts).
function M.create_params(r)
  return { image = r.image, backend = r.backend, env = r.env, cwd = r.workdir, limits = r.limits,
           network = r.network ~= "none" and r.network or nil }
end

-- ---------------------------------------------------------------- loading

--- The `recipe "name" { ... }` constructor of one load, and what it saw:
-- the caller's line (the real debug library runs here, on the daemon's
-- side of the VM; the chunk never sees it).
local function constructor(seen)
  return function(name)
    -- `return recipe "x" {...}` makes the second call a tail call, which
    -- leaves no frame of the chunk: the line is taken at the first call
    local info = debug.getinfo(2, "l")
    if type(name) ~= "string" then error('recipe "name" { ... }: the name comes first', 2) end
    return function(body)
      if type(body) ~= "table" then error("recipe \"name\" { ... }: expected a table", 2) end
      if seen.count then error("a recipe file defines one recipe", 2) end
      seen.count, seen.line = 1, info and info.currentline
      local r = {}
      for k, v in next, body do r[k] = v end
      if rawget(body, "name") ~= nil and rawget(body, "name") ~= name then
        error(("recipe %q: the table names it %q"):format(tostring(name), tostring(rawget(body, "name"))), 2)
      end
      r.name = name
      return r
    end
  end
end

--- Loads and validates a recipe from text; chunkname names it in messages.
function M.load_string(text, chunkname)
  local seen = {}
  local r, err = vm.load_string(text, chunkname, { recipe = constructor(seen) })
  if err then return nil, err end
  return M.validate(r, { file = chunkname, line = seen.line, text = text })
end

--- Loads and validates a recipe file.  Returns the recipe, or nil, err
-- ("recipes/x.lua:12: 'limits.memory': bad size ...").
function M.load(path)
  local text, err = vm.read_source(path)
  if not text then return nil, err end
  return M.load_string(text, path)
end

-- The recipes/ directory of the source tree, next to lua/ (development and
-- the specs; the binary carries its recipes embedded).
local function tree_recipes_dir()
  local src = debug.getinfo(1, "S").source
  local dir = src:match("^@(.*)/lua/tupper/recipe/file%.lua$") or src:match("^@(.*)lua/tupper/recipe/file%.lua$")
  if dir == nil then return nil end
  return (dir == "" and "." or dir) .. "/recipes"
end

--- The text of a recipe compiled into the binary (recipes/<name>.lua), or,
-- out of the binary, of the source tree's recipes/<name>.lua.  Returns
-- text, chunkname ("recipes/<name>.lua"), or nil, err.
function M.embedded_source(name)
  if type(name) ~= "string" or not name:match(NAME_PATTERN) then
    return nil, ("no shipped recipe %q"):format(tostring(name))
  end
  name = M.ALIASES[name] or name
  local chunkname = "recipes/" .. name .. ".lua"
  -- lazy: tupper.core exists only in the binary (the specs load recipes under plain lua5.4)
  local ok, core = pcall(require, "tupper.core")
  local text = ok and core.embedded_source and core.embedded_source("recipes/" .. name)
  if text then return text, chunkname end
  local dir = tree_recipes_dir()
  local path = dir and dir .. "/" .. name .. ".lua"
  local f = path and io.open(path, "rb")
  if not f then return nil, ("no shipped recipe %q"):format(name) end
  f:close()
  local err
  text, err = vm.read_source(path)
  if not text then return nil, err end
  return text, chunkname
end

--- Loads a recipe compiled into the binary (recipes/<name>.lua), or, out of
-- the binary, from the source tree's recipes/.
function M.load_embedded(name)
  local text, chunkname = M.embedded_source(name)
  if not text then return nil, chunkname end
  return M.load_string(text, chunkname)
end

-- ------------------------------------------------------------ clients

--- The lockfile of a recipe file: python.lua -> python.lock, beside it.
function M.lock_path(path)
  return (path:gsub("%.lua$", "")) .. ".lock"
end

--- What a client sends as sandbox.create's `recipe`: for a file (a path
-- that exists, or any argument with a '/' or ending in .lua) its source text
-- and name, and its lockfile's text when there is one beside it; else the
-- name of a shipped recipe.  Returns the spec or nil, err.
function M.client_spec(arg, opts)
  if type(arg) ~= "string" or arg == "" then return nil, "recipe: expected a file or a shipped recipe's name" end
  local f = io.open(arg, "rb")
  if f then f:close() end
  if not f and not arg:find("/", 1, true) and not arg:match("%.lua$") and arg:match(NAME_PATTERN) then
    return { name = arg }
  end
  local text, err = vm.read_source(arg)
  if not text then return nil, "recipe: " .. tostring(err) end
  if text == "" then return nil, ("recipe: %s is empty"):format(arg) end
  local spec = { name = arg, source = text }
  if not (opts and opts.no_lock) then
    local lock = vm.read_source(M.lock_path(arg))
    if lock and lock ~= "" then spec.lock = lock end
  end
  return spec
end

return M
