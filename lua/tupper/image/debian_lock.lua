--- What a Debian image is made of, checked (image/debian.lua): the spec a
-- recipe gives (`image = { debian = "bookworm", packages = {...} }`, with
-- package names and versions as Debian policy spells them), the packages a
-- build installed (dpkg's status), and the lock that pins them.  Recipes
-- and lock files are hostile: everything is validated before it reaches apt.
local json = require("tupper.util.json")
local apt = require("tupper.image.debian_apt")

local M = {}

M.MAX_PACKAGES = 1024         -- names a recipe may ask for
M.MAX_LOCKED = 8192           -- name=version pairs a lock may hold

local SUITE_PATTERN = "^[a-z][a-z0-9]*$"
-- Debian policy 5.6.1: lowercase letters, digits, '+', '-', '.'; two or
-- more; starting with a letter or digit.  A trailing '-' is refused too:
-- apt reads "pkg-" as "remove pkg" (a trailing '+', "install", is g++).
local PACKAGE_PATTERN = "^[a-z0-9][a-z0-9+.-]*[a-z0-9.+]$"
-- Debian policy 5.6.12: [epoch:]upstream[-revision], of [A-Za-z0-9.+~:-].
local VERSION_PATTERN = "^[0-9][A-Za-z0-9.+~:-]*$"

--- Whether s is a Debian package name tupper passes to apt.
function M.valid_package(s)
  return type(s) == "string" and #s >= 2 and #s <= 128 and s:match(PACKAGE_PATTERN) ~= nil
end

--- Whether s is a Debian version.
function M.valid_version(s)
  return type(s) == "string" and #s >= 1 and #s <= 256 and s:match(VERSION_PATTERN) ~= nil
end

--- Checks an image spec { debian = "bookworm", packages = { names } } (the
-- recipe field, hostile).  Returns nil, the normalised spec (packages
-- sorted); or err, nil, path (the field's keys, for the file:line).
function M.check_spec(v, name)
  name = name or "image"
  if type(v) ~= "table" then
    return ("'%s' must be { debian = \"bookworm\", packages = { ... } }"):format(name), nil, { name }
  end
  for k in pairs(v) do
    if k ~= "debian" and k ~= "packages" then
      return ("'%s' has an unknown field '%s' (expected debian, packages)"):format(name, tostring(k)), nil,
             { name, k }
    end
  end
  local suite = v.debian
  if type(suite) ~= "string" or #suite > 32 or not suite:match(SUITE_PATTERN) then
    return ("'%s.debian' must be a Debian suite's codename like \"bookworm\""):format(name), nil,
           { name, "debian" }
  end
  local pkgs = v.packages
  if pkgs == nil then pkgs = {} end
  if type(pkgs) ~= "table" or not json.is_array(pkgs) then
    return ("'%s.packages' must be a list of package names"):format(name), nil, { name, "packages" }
  end
  if #pkgs > M.MAX_PACKAGES then
    return ("'%s.packages' has more than %d entries"):format(name, M.MAX_PACKAGES), nil, { name, "packages" }
  end
  local out, seen = {}, {}
  for i = 1, #pkgs do
    local p = pkgs[i]
    if not M.valid_package(p) then
      return ("'%s.packages[%d]' must be a Debian package name (lowercase letters, digits, '+', '-', '.'), not %s")
               :format(name, i, type(p) == "string" and ("%q"):format(p:sub(1, 64)) or "a " .. type(p)),
             nil, { name, "packages" }
    end
    if seen[p] then
      return ("'%s.packages' names %q twice"):format(name, p), nil, { name, "packages" }
    end
    seen[p] = true
    out[#out + 1] = p
  end
  table.sort(out)
  return nil, { debian = suite, packages = out }
end

--- Parses a dpkg status file: the sorted "name=version" of every package
-- whose status is "install ok installed".
function M.parse_status(text)
  local out = {}
  for para in (text .. "\n\n"):gmatch("(.-)\n\n+") do
    local name = para:match("^Package: (%S+)") or para:match("\nPackage: (%S+)")
    local version = para:match("\nVersion: (%S+)")
    local status = para:match("\nStatus: ([^\n]+)")
    if name and version and status == "install ok installed" then
      out[#out + 1] = name .. "=" .. version
    end
  end
  table.sort(out)
  return out
end

--- The lock of a build: what build_locked takes back.
function M.lock_of(img)
  local mirror = {}
  for i, m in ipairs(img.mirror) do
    mirror[i] = { uri = m.uri, suites = m.suites, components = m.components }
  end
  return { debian = img.suite, packages = img.packages, mirror = mirror, epoch = img.epoch,
           include = img.include }
end

--- Checks a lock (read from a file: hostile).  Returns the normalised lock,
-- or nil, err.
function M.check_lock(lock)
  if type(lock) ~= "table" then return nil, "a Debian image lock must be a table" end
  for k in pairs(lock) do
    if k ~= "debian" and k ~= "packages" and k ~= "mirror" and k ~= "epoch" and k ~= "include" then
      return nil, ("the lock has an unknown field '%s'"):format(tostring(k))
    end
  end
  if type(lock.debian) ~= "string" or #lock.debian > 32 or not lock.debian:match(SUITE_PATTERN) then
    return nil, "the lock's 'debian' must be a suite's codename"
  end
  local epoch = math.tointeger(lock.epoch) -- JSON numbers decode as floats
  if not epoch or epoch < 0 or epoch > 1 << 40 then
    return nil, "the lock's 'epoch' must be a time in seconds"
  end
  local pkgs = lock.packages
  if type(pkgs) ~= "table" or not json.is_array(pkgs) or #pkgs == 0 or #pkgs > M.MAX_LOCKED then
    return nil, ("the lock's 'packages' must be a list of 1 to %d \"name=version\""):format(M.MAX_LOCKED)
  end
  local seen, out = {}, {}
  for i, p in ipairs(pkgs) do
    local name, version
    if type(p) == "string" then name, version = p:match("^([^=]+)=(.+)$") end
    if not (name and M.valid_package(name) and M.valid_version(version)) then
      return nil, ("the lock's 'packages[%d]' must be \"name=version\""):format(i)
    end
    if seen[name] then return nil, ("the lock names package %q twice"):format(name) end
    seen[name] = true
    out[i] = p
  end
  table.sort(out)
  local include = lock.include or {}
  local err, spec = M.check_spec({ debian = lock.debian, packages = include }, "include")
  if err then return nil, "the lock's " .. err end
  for _, p in ipairs(spec.packages) do
    if not seen[p] then return nil, ("the lock's 'include' names %q, which its packages lack"):format(p) end
  end
  local mirror = {}
  if lock.mirror ~= nil then
    if type(lock.mirror) ~= "table" or not json.is_array(lock.mirror) or #lock.mirror > 64 then
      return nil, "the lock's 'mirror' must be a list of { uri, suites, components }"
    end
    for i, m in ipairs(lock.mirror) do
      if type(m) ~= "table" or not apt.valid_uri(m.uri) or type(m.suites) ~= "table"
        or type(m.components) ~= "table" then
        return nil, ("the lock's 'mirror[%d]' must be { uri = \"http(s)://...\", suites = {...}, components = {...} }")
                      :format(i)
      end
      mirror[i] = { uri = m.uri, suites = m.suites, components = m.components }
    end
  end
  return { debian = lock.debian, packages = out, mirror = mirror, epoch = epoch, include = spec.packages }
end

return M
