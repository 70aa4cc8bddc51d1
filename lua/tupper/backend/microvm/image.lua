--- A microVM's disks and boot files under <state>/microvm: the ext4 root
-- images (the default image's, and one per stack of image layers, built on
-- first use), their garbage collection, and the initramfs.  Call from a
-- coroutine.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local kernel = require("tupper.backend.microvm.kernel")
local qemu = require("tupper.backend.microvm.qemu")
local snapshot = require("tupper.backend.microvm.snapshot")

local M = {}

local check = qemu.check

--- The ext4 image of the default image (one per state dir, built on first
-- use): root-owned files, as the guest's root sees them.
function M.base_image(state_dir)
  local dir = state_dir .. "/microvm"
  local path = dir .. "/default.ext4"
  if uv.fs_stat(path) then return path end
  check(kernel.mkdirs(dir, 448))
  local tmp = dir .. "/tmp-" .. core.random_hex(4)
  local ok, err = pcall(function()
    check(kernel.mkdirs(tmp, 448))
    check(core.default_image(tmp .. "/root", 0, 0))
    local fd = check(uv.fs_open(tmp .. "/root.ext4", "w", 420))
    check(uv.fs_ftruncate(fd, qemu.IMAGE_SIZE_MIN))
    uv.fs_close(fd)
    check(kernel.run(qemu.MKFS, { "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "tupper-root",
      "-E", "root_owner=0:0", "-d", tmp .. "/root", tmp .. "/root.ext4" }))
    -- mkfs's lost+found is not part of the image
    check(kernel.run(qemu.DEBUGFS, { "-w", "-R", "rmdir /lost+found", tmp .. "/root.ext4" }))
    check(uv.fs_chmod(tmp .. "/root.ext4", 420))
    check(uv.fs_rename(tmp .. "/root.ext4", path))
  end)
  core.rmtree(tmp)
  if not ok then return nil, "build the microVM root image: " .. tostring(err) end
  return path
end

--- Bytes: $TUPPER_VM_IMAGE_MAX (a number, or with K/M/G), else IMAGE_SIZE_MAX.
function M.image_max()
  local env = os.getenv("TUPPER_VM_IMAGE_MAX")
  if env then
    local n, unit = env:match("^(%d+)([KMG]?)$")
    if n then return math.tointeger(tonumber(n)) * (({ K = 1024, M = 1048576, G = 1073741824 })[unit] or 1) end
  end
  return qemu.IMAGE_SIZE_MAX
end

-- The identity of a layer dir: its path and the (inode, change time) of
-- the dir itself.  A store layer's path is its diff id already; a recipe
-- layer rebuilt under the same key is a new dir, so a new identity.
local function layer_identity(path)
  local st = uv.fs_lstat(path)
  if not st or st.type ~= "directory" then return nil end
  return ("%s\0%d\0%d.%09d"):format(path, st.ino, st.ctime.sec, st.ctime.nsec)
end

--- The key of the root image of layers (dirs, lowest first), or nil when
-- a layer dir is gone.
function M.root_key(layers, uid_base)
  local parts = { "tupper-vmroot-1", tostring(math.tointeger(uid_base)) }
  for _, l in ipairs(layers) do
    local id = layer_identity(l)
    if not id then return nil end
    parts[#parts + 1] = id
  end
  return core.sha256(table.concat(parts, "\0")):sub(1, 32)
end

-- The short identity of a root image file, for snapshot keys: a rebuilt
-- file (same key, other bytes: mkfs is not reproducible) is another root.
local function root_id(path)
  local st = uv.fs_stat(path)
  if not st then return nil end
  return core.sha256(("%s\0%d\0%d.%09d"):format(path:match("[^/]+$"), st.ino, st.mtime.sec,
    st.mtime.nsec)):sub(1, 12)
end
M.root_id = root_id

local function is_mountpoint(path)
  local st, pst = uv.fs_lstat(path), uv.fs_lstat(path .. "/..")
  return st and pst and st.type == "directory" and st.dev ~= pst.dev
end

local root_inflight = {}

-- Builds <dir>/root-<key>.ext4 from layers: the host's overlay of them,
-- read-only (whiteouts and opaque dirs applied by the same kernel code the
-- linux backend's boxes use), tarred with owners shifted back to the
-- guest's (core.tar_dir), unpacked as root into a tree mkfs.ext4 copies.
local function build_root(dir, key, layers, o)
  local tmp = dir .. "/tmp-root-" .. core.random_hex(4)
  local mounted = false
  local ok, err = pcall(function()
    check(kernel.mkdirs(tmp .. "/l", 448))
    check(uv.fs_mkdir(tmp .. "/m", 448))
    check(uv.fs_mkdir(tmp .. "/e", 448))
    check(uv.fs_mkdir(tmp .. "/r", 493))
    -- short names for the lower dirs (top first), whatever their paths
    local lower = {}
    for i = #layers, 1, -1 do
      check(uv.fs_symlink(layers[i], tmp .. "/l/" .. (i - 1)))
      lower[#lower + 1] = "l/" .. (i - 1)
    end
    if #layers == 1 then lower[#lower + 1] = "e" end -- overlay needs two lower dirs without an upper
    check(kernel.run(qemu.MOUNT, { "-t", "overlay", "-o",
      "ro,index=off,xino=off,lowerdir=" .. table.concat(lower, ":"), "overlay", "m" }, { cwd = tmp }))
    mounted = true
    local tok, terr = async.wait(function(cb)
      local qok, e = core.tar_dir(tmp .. "/m", tmp .. "/root.tar", o.uid_base, o.uid_base, o.id_count, cb)
      if not qok then cb(nil, e) end
    end)
    kernel.run(qemu.UMOUNT, { tmp .. "/m" })
    mounted = false
    check(tok, terr, "copy the image's files")
    -- as root, owners as they are in the tar (the guest's own ids)
    check(kernel.run(qemu.TAR, { "-x", "-f", tmp .. "/root.tar", "-C", tmp .. "/r", "--numeric-owner",
      "--same-owner", "--same-permissions", "--no-overwrite-dir" }), nil, "unpack the image's files")
    uv.fs_unlink(tmp .. "/root.tar")
    -- the size: what the files take on the host's disk, with room for
    -- ext4's own metadata, inode tables and a margin
    local kib = tonumber((check(kernel.run(qemu.DU, { "-s", "-x", "-B", "1024", tmp .. "/r" })):match("^(%d+)")))
    local inodes = tonumber((check(kernel.run(qemu.DU, { "-s", "-x", "--inodes", tmp .. "/r" })):match("^(%d+)")))
    if not kib or not inodes then error("cannot measure the image's files", 0) end
    local n_inodes = math.floor(inodes * 1.25) + 1024
    local size = math.floor(kib * 1024 * 1.1) + n_inodes * 256 + 32 * 1048576
    size = ((size + 1048575) // 1048576) * 1048576
    if size < qemu.IMAGE_SIZE_MIN then size = qemu.IMAGE_SIZE_MIN end
    local max = M.image_max()
    if size > max then
      error(("the image's files need a %d MiB disk image, more than the microVM image limit of %d MiB")
        :format(size // 1048576, max // 1048576), 0)
    end
    local fs = uv.fs_statfs(dir)
    if fs and fs.bavail * fs.bsize < size then
      error(("the image needs a %d MiB disk image; %s has %d MiB free")
        :format(size // 1048576, dir, fs.bavail * fs.bsize // 1048576), 0)
    end
    local fd = check(uv.fs_open(tmp .. "/root.ext4", "w", 420))
    check(uv.fs_ftruncate(fd, size))
    uv.fs_close(fd)
    check(kernel.run(qemu.MKFS, { "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "tupper-root",
      "-m", "0", "-N", tostring(n_inodes), "-E", "root_owner=0:0", "-d", tmp .. "/r", tmp .. "/root.ext4" }),
      nil, "make the image's ext4 file")
    if not uv.fs_lstat(tmp .. "/r/lost+found") then
      check(kernel.run(qemu.DEBUGFS, { "-w", "-R", "rmdir /lost+found", tmp .. "/root.ext4" }))
    end
    check(uv.fs_chmod(tmp .. "/root.ext4", 420))
    local fd2 = check(uv.fs_open(tmp .. "/root.json", "w", 384))
    check(uv.fs_write(fd2, json.encode({ layers = layers, uid_base = o.uid_base, size = size })))
    uv.fs_close(fd2)
    check(uv.fs_rename(tmp .. "/root.json", dir .. "/root-" .. key .. ".json"))
    check(uv.fs_rename(tmp .. "/root.ext4", dir .. "/root-" .. key .. ".ext4"))
  end)
  if mounted then kernel.run(qemu.UMOUNT, { "-l", tmp .. "/m" }) end
  if is_mountpoint(tmp .. "/m") then kernel.run(qemu.UMOUNT, { "-l", tmp .. "/m" }) end
  core.rmtree(tmp)
  if not ok then return nil, tostring(err) end
  return dir .. "/root-" .. key .. ".ext4"
end

--- The ext4 image (read-only in the guest) of an image's layer dirs
-- (lowest first, as the linux backend stacks them; a recipe's layer on
-- top), built on first use and shared by every VM of those layers.
-- o: uid_base, id_count (the range the store's files are owned by).
-- Returns its path, or nil, err.
function M.root_image(state_dir, layers, o)
  if #layers < 1 or #layers > 128 then return nil, "a microVM image has 1 to 128 layers" end
  local dir = state_dir .. "/microvm"
  check(kernel.mkdirs(dir, 448))
  local key = M.root_key(layers, o.uid_base)
  if not key then return nil, "a layer of the image is gone (removed meanwhile?)" end
  local path = dir .. "/root-" .. key .. ".ext4"
  if uv.fs_stat(path) then return path end
  if root_inflight[key] then
    local w = root_inflight[key]
    return async.wait(function(cb) w[#w + 1] = cb end)
  end
  local waiters = {}
  root_inflight[key] = waiters
  io.stderr:write(os.date("!%Y-%m-%dT%H:%M:%SZ "), "building the microVM image root-", key, ".ext4 (",
    #layers, " layers)\n")
  local t0 = uv.hrtime()
  local res, err = build_root(dir, key, layers, o)
  root_inflight[key] = nil
  if res then
    local st = uv.fs_stat(res)
    io.stderr:write(os.date("!%Y-%m-%dT%H:%M:%SZ "), ("microVM image root-%s.ext4 built in %.1f s (%d MiB, sparse)\n")
      :format(key, (uv.hrtime() - t0) / 1e9, st and st.size // 1048576 or 0))
  end
  if not res then err = "build the microVM root image: " .. tostring(err) end
  for _, cb in ipairs(waiters) do cb(res, err) end
  return res, err
end

--- Removes the root images whose layers are gone or changed (an image
-- removed from the store, a recipe layer rebuilt) and the snapshots of
-- root images that are gone.  A running VM keeps its open file.  Returns
-- the number of root images removed.
function M.gc(state_dir)
  local dir = state_dir .. "/microvm"
  local removed, live = 0, {}
  local req = uv.fs_scandir(dir)
  local names = {}
  while req do
    local n = req and uv.fs_scandir_next(req)
    if not n then break end
    names[#names + 1] = n
  end
  local have = {}
  for _, n in ipairs(names) do have[n] = true end
  for _, n in ipairs(names) do
    local key = n:match("^root%-(%x+)%.json$") or n:match("^root%-(%x+)%.ext4$")
    if key and live[key] == nil then
      local keep = false
      local fd = uv.fs_open(dir .. "/root-" .. key .. ".json", "r", 0)
      if fd and have["root-" .. key .. ".ext4"] then
        local text = uv.fs_read(fd, 1048576, 0)
        local t = text and json.decode(text)
        if type(t) == "table" and type(t.layers) == "table" and math.tointeger(t.uid_base) then
          keep = M.root_key(t.layers, t.uid_base) == key
        end
      end
      if fd then uv.fs_close(fd) end
      live[key] = keep
      if not keep then
        if uv.fs_unlink(dir .. "/root-" .. key .. ".ext4") then removed = removed + 1 end
        uv.fs_unlink(dir .. "/root-" .. key .. ".json")
      end
    end
  end
  -- snapshots name the root image they booted (-r<id>): one whose root is
  -- gone can never be started again
  local ids = {}
  for _, n in ipairs(names) do
    local key = n:match("^root%-(%x+)%.ext4$")
    if (key and live[key]) or n == "default.ext4" then
      local id = root_id(dir .. "/" .. n)
      if id then ids[id] = true end
    end
  end
  for _, n in ipairs(names) do
    local id = n:match("^snap%-.*%-r(%x+)$")
    if n:match("^snap%-") and not (id and ids[id]) then core.rmtree(dir .. "/" .. n) end
  end
  return removed
end

local swept = {}

-- Once per daemon and state dir: what an earlier daemon left half-made
-- (tmp-*), and the initramfs files and snapshots of other agents, kernels
-- or kernel command lines (keep: the current initramfs's name).
local function sweep(dir, keep)
  if swept[dir] then return end
  swept[dir] = true
  local tag = snapshot.tag(keep)
  local req = uv.fs_scandir(dir)
  while req do
    local n = uv.fs_scandir_next(req)
    if not n then break end
    if n:match("^initramfs%-.*%.cpio") and n ~= keep then
      uv.fs_unlink(dir .. "/" .. n)
    elseif n:match("^tmp%-") or (n:match("^snap%-") and n:sub(6, 5 + #tag) ~= tag) then
      -- a root image build a crash interrupted may have left its overlay mounted
      if is_mountpoint(dir .. "/" .. n .. "/m") then kernel.run(qemu.UMOUNT, { "-l", dir .. "/" .. n .. "/m" }) end
      core.rmtree(dir .. "/" .. n)
    end
  end
  M.gc(dir:match("^(.*)/microvm$"))
end

--- The initramfs of this daemon (its agent, the cached kernel's modules),
-- named after both: an upgraded daemon never boots an older agent, and its
-- first start removes the older initramfs files and their snapshots.
local agent_hash -- of this daemon's agent, which does not change while it runs

function M.initramfs(state_dir, k)
  local agent
  if not agent_hash then
    agent = core.agent_binary()
    agent_hash = core.sha256(agent):sub(1, 16)
  end
  local dir = state_dir .. "/microvm"
  local name = "initramfs-" .. k.version .. "-" .. agent_hash .. ".cpio"
  local path = dir .. "/" .. name
  check(kernel.mkdirs(dir, 448))
  sweep(dir, name)
  if uv.fs_stat(path) then return path end
  local ok, err = kernel.build_initramfs(k, agent or core.agent_binary(), path)
  if not ok then return nil, "build the initramfs: " .. tostring(err) end
  return path
end


return M
