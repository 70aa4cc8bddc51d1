--- Volumes: named persistent filesystems in the state dir, mounted into
-- sandboxes at create (sandbox.create's `volumes`), kept when the boxes
-- that mounted them die and across daemon restarts.  docs/volumes.md.
--
-- Each volume is <state>/volumes/<name>/ holding volume.json (its record,
-- written atomically: a temp file, fsync, rename) and disk.img, a sparse
-- ext4 image with a journal whose size is the volume's cap (the disk-cap
-- machinery of backends/linux: a full volume says ENOSPC).  A create makes
-- everything in <state>/volumes/.new-<name>-<rand> and renames it into
-- place last, so a crash leaves a whole volume or a leftover the next
-- start removes; a destroy renames the dir to .gone-<name>-<rand> first.
--
-- One box at a time mounts a volume (two loop devices over one ext4 image
-- would be two filesystems writing one disk): a create naming a volume in
-- use by another sandbox, or still attached to a loop device while a dead
-- box's mounts go away, is refused with the sandbox named.  The daemon
-- never walks a volume's contents on the host: the box's mounts of it are
-- nosuid,nodev, and file methods (the SDKs' Volume.readFile ...) run inside
-- a box that mounts it.
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")
local rpc = require("tupper.wire.rpc")
local units = require("tupper.util.units")
local async = require("tupper.util.async")
local records = require("tupper.daemon.records")
local log = require("tupper.daemon.log").log

local M = {}

M.NAME_MAX = 63
M.DEFAULT_SIZE = 1024 * 1024 * 1024       -- 1 GiB
M.MIN_SIZE = 16 * 1024 * 1024             -- 16 MiB (ext4 with its journal)
M.MAX_SIZE = 64 * 1024 * 1024 * 1024      -- 64 GiB per volume
M.MAX_COUNT = 64                          -- volumes one daemon keeps
M.MAX_TOTAL = 256 * 1024 * 1024 * 1024    -- their sizes together (the images are sparse)
M.MOUNTS_MAX = 16                         -- volumes of one sandbox (TP_VOLUMES_MAX)
M.RELEASE_WAIT_MS = 3000                  -- for a dead box's mounts of a volume to go
M.RECORD_MAX = 65536                      -- bytes of a volume.json

--- Checks a volume's name: letters, digits, '.', '_' and '-', starting
-- with a letter or digit, no "..", at most NAME_MAX bytes.  It names a dir
-- of the state dir, so '/', NUL and control characters get their own
-- clear errors.  Returns true or nil, err.
function M.check_name(name)
  if type(name) ~= "string" or #name == 0 or #name > M.NAME_MAX then
    return nil, ("a volume's name must be 1 to %d bytes"):format(M.NAME_MAX)
  end
  local shown = name:gsub("%c", "?"):sub(1, 80)
  if name:find("\0", 1, true) then return nil, ("bad volume name %q: it contains a NUL byte"):format(shown) end
  if name:find("%c") then return nil, ("bad volume name %q: it contains a control character"):format(shown) end
  if name:find("/", 1, true) then return nil, ("bad volume name %q: it contains '/'"):format(shown) end
  if name:find("..", 1, true) then return nil, ("bad volume name %q: it contains '..'"):format(shown) end
  if not name:match("^[%w][%w._-]*$") then
    return nil, ("bad volume name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit")
      :format(shown)
  end
  return true
end

local Store = {}
Store.__index = Store

local function now_iso() return os.date("!%Y-%m-%dT%H:%M:%SZ") end

-- Reads the records; leftovers of a create or destroy cut short are removed,
-- a record that does not parse is skipped (and logged), never fatal.
local function load_all(dir)
  local out = {}
  local h = uv.fs_scandir(dir)
  while h do
    local name, typ = uv.fs_scandir_next(h)
    if not name then break end
    if name:match("^%.new%-") or name:match("^%.gone%-") then
      local ok, err = core.rmtree(dir .. "/" .. name)
      log("volumes: removed leftover %s%s", name, ok and "" or (": " .. tostring(err)))
    elseif typ == "directory" and M.check_name(name) then
      out[name] = records.pick(dir .. "/" .. name .. "/volume.json", M.RECORD_MAX, function(rec)
        return rec.name == name and math.tointeger(rec.size) and type(rec.id) == "string"
      end, "volume")
    end
  end
  return out
end

--- The volume store of daemon d, opened on first use (<state>/volumes).
function M.of(d)
  if d._volumes then return d._volumes end
  local dir = d.state .. "/volumes"
  local st = setmetatable({ d = d, dir = dir, entries = load_all(dir), claims = {} }, Store)
  d._volumes = st
  return st
end

--- The record of a volume named by its name or its id, or nil.
function Store:find(ref)
  if type(ref) ~= "string" then return nil end
  if self.entries[ref] then return self.entries[ref] end
  for _, rec in pairs(self.entries) do
    if rec.id == ref then return rec end
  end
  return nil
end

function Store:image(rec) return self.dir .. "/" .. rec.name .. "/disk.img" end

--- The sandboxes that mount volume name now: { { sandbox =, path = } },
-- those being created included (sandbox "(creating)").
function Store:users(name)
  local out = {}
  for id, sb in pairs(self.d.sandboxes) do
    for path, vname in pairs(sb.volume_mounts or {}) do
      if vname == name then out[#out + 1] = { sandbox = id, path = path } end
    end
  end
  for _, c in pairs(self.claims) do
    if c.names[name] then out[#out + 1] = { sandbox = c.id or "(creating)", path = c.names[name] } end
  end
  table.sort(out, function(a, b) return a.sandbox < b.sandbox end)
  return out
end

-- The loop devices backed by path now (/sys/block/loop*/loop/backing_file),
-- as "loopN" names.
function M.loops_of(path)
  local real = uv.fs_realpath(path) or path
  local out = {}
  local h = uv.fs_scandir("/sys/block")
  while h do
    local name = uv.fs_scandir_next(h)
    if not name then break end
    if name:match("^loop%d+$") then
      local f = io.open("/sys/block/" .. name .. "/loop/backing_file", "r")
      if f then
        local back = (f:read("l") or ""):gsub(" %(deleted%)$", "")
        f:close()
        if back == real then out[#out + 1] = name end
      end
    end
  end
  return out
end

-- Waits (up to RELEASE_WAIT_MS) until no loop device is backed by the
-- volume's image: a killed box's mount namespace goes with its last
-- process, a moment after its PID 1.  Returns true or nil, err.
function Store:_await_release(rec)
  local img = self:image(rec)
  local waited = 0
  while true do
    local loops = M.loops_of(img)
    if #loops == 0 then return true end
    if waited >= M.RELEASE_WAIT_MS then
      return nil, ("volume '%s' is still attached to %s (a box that mounted it has not gone yet)")
        :format(rec.name, table.concat(loops, ", "))
    end
    async.sleep(50)
    waited = waited + 50
  end
end

local function describe(st, rec)
  local users = st:users(rec.name)
  return { name = rec.name, id = rec.id, size = rec.size, created_at = rec.created_at,
           mounted_by = json.array(users) }
end
M.describe = describe

--- Makes a volume.  Returns its record or nil, code, message.
function Store:create(name, size)
  local ok, nerr = M.check_name(name)
  if not ok then return nil, rpc.INVALID_PARAMS, nerr end
  size = size or M.DEFAULT_SIZE
  if size < M.MIN_SIZE or size > M.MAX_SIZE then
    return nil, rpc.INVALID_PARAMS, ("a volume's size must be %s to %s"):format(
      units.format_size(M.MIN_SIZE), units.format_size(M.MAX_SIZE))
  end
  size = (size + 4095) // 4096 * 4096
  if self.entries[name] or self.claims["new:" .. name] then
    return nil, rpc.SANDBOX_ERROR, ("volume '%s' exists already"):format(name)
  end
  local n, total = 0, size
  for _, rec in pairs(self.entries) do n, total = n + 1, total + rec.size end
  if n >= M.MAX_COUNT then
    return nil, rpc.SANDBOX_ERROR, ("the daemon keeps at most %d volumes: destroy one first"):format(M.MAX_COUNT)
  end
  if total > M.MAX_TOTAL then
    return nil, rpc.SANDBOX_ERROR, ("the volumes' sizes would total %s, over the daemon's cap of %s"):format(
      units.format_size(total), units.format_size(M.MAX_TOTAL))
  end
  local mok, merr = paths.mkdirs(self.dir, tonumber("700", 8))
  if not mok then return nil, rpc.SANDBOX_ERROR, ("cannot create %s: %s"):format(self.dir, tostring(merr)) end
  local key = "new:" .. name
  self.claims[key] = { names = {} }
  local tmp = ("%s/.new-%s-%s"):format(self.dir, name, core.random_hex(4))
  local function fail(msg)
    self.claims[key] = nil
    core.rmtree(tmp)
    return nil, rpc.SANDBOX_ERROR, ("volume '%s': %s"):format(name, msg)
  end
  local dok, derr = uv.fs_mkdir(tmp, tonumber("700", 8))
  if not dok then return fail(tostring(derr)) end
  local made, verr = async.wait(function(cb) core.volume_make(tmp .. "/disk.img", size, cb) end)
  if not made then return fail(verr) end
  local rec = { name = name, id = "vol-" .. core.random_hex(8), size = size, created_at = now_iso() }
  local wok, werr = records.save(tmp .. "/volume.json", rec)
  if not wok then return fail(werr) end
  local rok, rerr = uv.fs_rename(tmp, self.dir .. "/" .. name)
  if not rok then return fail(tostring(rerr)) end
  records.fsync_dir(self.dir)
  self.claims[key] = nil
  self.entries[name] = rec
  log("volume %s created (%s)", name, units.format_size(size))
  return rec
end

--- Removes a volume no sandbox mounts.  Returns true or nil, code, message.
function Store:destroy(ref)
  local rec = self:find(ref)
  if not rec then return nil, rpc.NOT_FOUND, ("no volume '%s'"):format(tostring(ref):gsub("%c", "?")) end
  local users = self:users(rec.name)
  if #users > 0 then
    local ids = {}
    for _, u in ipairs(users) do ids[#ids + 1] = u.sandbox end
    return nil, rpc.BUSY, ("volume '%s' is mounted by sandbox %s: kill it first"):format(
      rec.name, table.concat(ids, ", ")), { sandboxes = json.array(ids) }
  end
  local loops = M.loops_of(self:image(rec))
  if #loops > 0 then
    return nil, rpc.BUSY, ("volume '%s' is still attached to %s (a box that mounted it is going away): try again")
      :format(rec.name, table.concat(loops, ", "))
  end
  local gone = ("%s/.gone-%s-%s"):format(self.dir, rec.name, core.random_hex(4))
  local ok, err = uv.fs_rename(self.dir .. "/" .. rec.name, gone)
  if not ok then return nil, rpc.SANDBOX_ERROR, ("volume '%s': %s"):format(rec.name, tostring(err)) end
  records.fsync_dir(self.dir)
  self.entries[rec.name] = nil
  core.rmtree(gone)
  log("volume %s destroyed", rec.name)
  return true
end

--- Claims the volumes of a create: mounts maps a path in the box to a
-- volume's name or id; backend is the create's.  Returns a claim (pass
-- it to bind, then release) whose `spec` is the backend's volumes list
-- (image, target pairs), or nil, code, message.
function Store:claim(mounts, backend)
  local n = 0
  for _ in pairs(mounts) do n = n + 1 end
  if n > M.MOUNTS_MAX then
    return nil, rpc.INVALID_PARAMS, ("a sandbox mounts at most %d volumes"):format(M.MOUNTS_MAX)
  end
  if backend ~= "linux" then
    return nil, rpc.INVALID_PARAMS,
      ("volumes are not supported on the %s backend yet (docs/volumes.md)"):format(tostring(backend))
  end
  local claim = { names = {}, spec = {}, mounts = {} }
  local targets = {}
  for path in pairs(mounts) do targets[#targets + 1] = path end
  table.sort(targets)
  for _, path in ipairs(targets) do
    local ref = mounts[path]
    if type(path) ~= "string" or path:sub(1, 1) ~= "/" or #path > 255 then
      return nil, rpc.INVALID_PARAMS, ("volume mount point %q must be an absolute path of at most 255 bytes")
        :format(tostring(path):gsub("%c", "?"):sub(1, 80))
    end
    local rec = self:find(ref)
    if not rec then
      local ok, nerr = M.check_name(ref)
      if not ok then return nil, rpc.INVALID_PARAMS, nerr end
      return nil, rpc.NOT_FOUND, ("no volume '%s'"):format(ref)
    end
    if claim.names[rec.name] then
      return nil, rpc.INVALID_PARAMS, ("volume '%s' is mounted twice"):format(rec.name)
    end
    local users = self:users(rec.name)
    if #users > 0 then
      return nil, rpc.BUSY, ("volume '%s' is mounted by sandbox %s (one sandbox at a time)"):format(
        rec.name, users[1].sandbox), { sandboxes = json.array({ users[1].sandbox }) }
    end
    claim.names[rec.name] = path
    claim.mounts[path] = rec.name
    claim.spec[#claim.spec + 1] = self:image(rec)
    claim.spec[#claim.spec + 1] = path
  end
  self.claims[claim] = claim
  -- a dead box's mounts of a claimed volume must be gone before the new one
  for name in pairs(claim.names) do
    local ok, err = self:_await_release(self.entries[name])
    if not ok then
      self.claims[claim] = nil
      return nil, rpc.BUSY, err
    end
  end
  return claim
end

--- Ends a claim (the sandbox has its volume_mounts now, or failed).
function Store:release(claim)
  if claim then self.claims[claim] = nil end
end

-- ---------------------------------------------------------- the handlers

local h = {}
M.handlers = h

function h.volume_create(d, conn, p)
  local rec, code, msg = M.of(d):create(p.name, p.size)
  if not rec then return nil, code, msg end
  return describe(M.of(d), rec)
end

function h.volume_list(d, conn, p)
  local st, list = M.of(d), {}
  for _, rec in pairs(st.entries) do list[#list + 1] = describe(st, rec) end
  table.sort(list, function(a, b) return a.name < b.name end)
  return { volumes = json.array(list) }
end

function h.volume_get(d, conn, p)
  local st = M.of(d)
  local rec = st:find(p.name)
  if not rec then
    local ok, nerr = M.check_name(p.name)
    if not ok then return nil, rpc.INVALID_PARAMS, nerr end
    return nil, rpc.NOT_FOUND, ("no volume '%s'"):format(p.name)
  end
  return describe(st, rec)
end

function h.volume_destroy(d, conn, p)
  local st = M.of(d)
  if not st:find(p.name) then
    local ok, nerr = M.check_name(p.name)
    if not ok then return nil, rpc.INVALID_PARAMS, nerr end
  end
  local ok, code, msg, data = st:destroy(p.name)
  if not ok then return nil, code, msg, data end
  return { destroyed = true }
end

return M
