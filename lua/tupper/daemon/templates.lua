--- Templates: recipes registered with the daemon under a name
-- (recipe.register / recipe.list / recipe.remove), kept in the state dir
-- (<state>/templates/<name>.json, written atomically) so they outlive the
-- daemon, and the name resolution of sandbox.create's `template`: a
-- registered recipe, else a shipped one, else an image.  docs/recipes.md
-- ("Templates").
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")
local rpc = require("tupper.wire.rpc")
local build = require("tupper.recipe.build")
local recipe = require("tupper.recipe.file")
local records = require("tupper.daemon.records")
local log = require("tupper.daemon.log").log

local M = {}

M.NAME_MAX = 128     -- bytes of a template's name
M.MAX = 1024         -- templates one daemon keeps
M.RECORD_MAX = 3 * 1024 * 1024 -- bytes of one record (source and lock, 1 MiB each, JSON-escaped)

--- Checks a template's name: letters, digits, '.', '_', ':' and '-',
-- starting with a letter or digit, no "..", at most NAME_MAX bytes (so
-- no '/', NUL or control character: it names a file of the state dir).
-- Returns true or nil, err.
function M.check_name(name)
  if type(name) ~= "string" or #name == 0 or #name > M.NAME_MAX then
    return nil, ("a template's name must be 1 to %d bytes"):format(M.NAME_MAX)
  end
  if not name:match("^[%w][%w._:-]*$") or name:find("..", 1, true) then
    return nil, ("bad template name %q: use letters, digits, '.', '_', ':' and '-', starting with a letter or digit, without '..'")
      :format(name:gsub("[%c]", "?"):sub(1, 140))
  end
  return true
end

local Registry = {}
Registry.__index = Registry

-- Reads what the state dir keeps; a record that does not parse is skipped
-- (and logged), never fatal.
local function load_all(dir)
  local out = {}
  local h = uv.fs_scandir(dir)
  while h do
    local name, typ = uv.fs_scandir_next(h)
    if not name then break end
    local base = name:match("^(.*)%.json$")
    if typ == "file" and base and M.check_name(base) then
      out[base] = records.pick(dir .. "/" .. name, M.RECORD_MAX, function(rec)
        return rec.name == base and type(rec.source) == "string"
      end, "template")
    end
  end
  return out
end

--- The registry of daemon d, opened on first use (<state>/templates).
function M.of(d)
  if d._templates then return d._templates end
  local dir = d.state .. "/templates"
  local reg = setmetatable({ dir = dir, entries = load_all(dir) }, Registry)
  d._templates = reg
  return reg
end

--- The recipe spec (as sandbox.create's `recipe`) of a registered name, or nil.
function Registry:spec(name)
  local rec = self.entries[name]
  if not rec then return nil end
  return { name = rec.file or ("template " .. name), source = rec.source,
           lock = type(rec.lock) == "string" and rec.lock or nil }
end

-- Writes rec to <dir>/<name>.json atomically.  Returns true or nil, err.
function Registry:_write(rec)
  local ok, err = paths.mkdirs(self.dir, tonumber("700", 8))
  if not ok then return nil, ("cannot create %s: %s"):format(self.dir, tostring(err)) end
  return records.save(self.dir .. "/" .. rec.name .. ".json", rec)
end

--- Registers (or replaces) a template.  Returns the record or nil, err.
function Registry:put(rec)
  if not self.entries[rec.name] then
    local n = 0
    for _ in pairs(self.entries) do n = n + 1 end
    if n >= M.MAX then return nil, ("the daemon keeps at most %d templates: remove one first"):format(M.MAX) end
  end
  local ok, err = self:_write(rec)
  if not ok then return nil, err end
  self.entries[rec.name] = rec
  return rec
end

--- Removes a template; true when there was one.
function Registry:remove(name)
  if not self.entries[name] then return false end
  local ok, err, ename = uv.fs_unlink(self.dir .. "/" .. name .. ".json")
  if not ok and ename ~= "ENOENT" then return nil, err end
  self.entries[name] = nil
  return true
end

local function summary(rec)
  return { name = rec.name, recipe = rec.recipe, file = rec.file or json.null, sha256 = rec.sha256,
           registered_at = rec.registered_at, locked = type(rec.lock) == "string" }
end

--- Whether name is a recipe, and which, for sandbox.create's `template`:
-- a registered one, else a shipped one (recipes/, `base` included), else
-- nil (then it is an image's name).  Returns the recipe spec or nil.
function M.resolve(d, name)
  local spec = M.of(d):spec(name)
  if spec then return spec end
  if name ~= "default" and recipe.embedded_source(name) then return { name = name } end
  return nil
end

-- ---------------------------------------------------------- the handlers

local h = {}
M.handlers = h

-- Bytes for a client, as api.encode_data makes them (text when they are
-- UTF-8, else base64); not required from daemon/api.lua, which requires this.
local function api_encode(data)
  if utf8.len(data) and not data:find("\0", 1, true) then return data, "utf8" end
  return core.b64encode(data), "base64"
end

--- recipe.register {name, source, file, lock, build}: checks the recipe
-- (it must load), builds its layer first when `build` says so (the
-- daemon's policy judges the setup, as for recipe.build), then keeps it.
function h.recipe_register(d, conn, p)
  local ok, nerr = M.check_name(p.name)
  if not ok then return nil, rpc.INVALID_PARAMS, nerr end
  local file = p.file or ("template " .. p.name)
  local loaded, err = build.load({ name = file, source = p.source, lock = p.lock })
  if not loaded then return nil, rpc.SANDBOX_ERROR, err end
  local built
  if p.build then
    local plan
    local on_log
    if p.logs then
      -- routed by the client as a process's output: sandbox = the token, pid 0
      on_log = function(stream, data)
        if conn.closed then return end
        local out, enc = api_encode(data)
        conn:notify("recipe.log", { sandbox = p.logs, pid = 0, stream = stream, data = out, encoding = enc })
      end
    end
    plan, err = build.prepare(d, loaded, { build = true, policies = d.policy and { d.policy } or {}, on_log = on_log })
    if not plan then return nil, rpc.SANDBOX_ERROR, err end
    built = { image = plan.image.ref, image_digest = plan.image.digest, layer = plan.layer or json.null,
              cached = plan.cached == true }
  end
  local rec = { name = p.name, recipe = loaded.recipe.name, file = p.file, source = p.source, lock = p.lock,
                sha256 = core.sha256(p.source), registered_at = os.date("!%Y-%m-%dT%H:%M:%SZ") }
  local saved, serr = M.of(d):put(rec)
  if not saved then return nil, rpc.SANDBOX_ERROR, serr end
  log("template %s registered (recipe %s)", p.name, rec.recipe)
  local out = summary(rec)
  out.build = built or json.null
  return out
end

function h.recipe_list(d, conn, p)
  local list = {}
  for _, rec in pairs(M.of(d).entries) do list[#list + 1] = summary(rec) end
  table.sort(list, function(a, b) return a.name < b.name end)
  return { recipes = json.array(list) }
end

function h.recipe_remove(d, conn, p)
  local ok, nerr = M.check_name(p.name)
  if not ok then return nil, rpc.INVALID_PARAMS, nerr end
  local removed, err = M.of(d):remove(p.name)
  if removed == nil then return nil, rpc.SANDBOX_ERROR, err end
  if removed then log("template %s removed", p.name) end
  return { removed = removed }
end

return M
