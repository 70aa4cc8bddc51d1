--- The microvm backend: one QEMU `microvm` machine per sandbox, with its own
-- kernel, the same agent as PID 1, the same frame protocol over a
-- virtio-serial port (docs/microvm.md).  start() returns a box with the
-- linux backend's interface (on/send/pid/destroy/freeze/stats, from
-- core.start) for sandbox.lua.  Call from a coroutine.
local uv = require("luv")
local core = require("tupper.core")
local vmkernel = require("tupper.backend.microvm.kernel")

local M = {}

M.QEMU = "/usr/bin/qemu-system-x86_64"
M.MKFS = "/usr/sbin/mkfs.ext4"
M.DEBUGFS = "/usr/sbin/debugfs"
M.MOUNT = "/bin/mount"
M.UMOUNT = "/bin/umount"
M.TAR = "/bin/tar"
M.DU = "/usr/bin/du"
M.UID_BASE = 100065536   -- QEMU's host uids: just above the boxes' mapped range
M.UID_COUNT = 65536
M.DEFAULT_MEMORY = 512 * 1024 * 1024
M.MIN_MEMORY = 128 * 1024 * 1024
M.MAX_MEMORY = 64 * 1024 * 1024 * 1024
M.MEMORY_OVERHEAD = 256 * 1024 * 1024 -- QEMU's own memory, on top of the guest's, in its cgroup
M.DEFAULT_DISK = 1024 * 1024 * 1024  -- the writable layer, sparse
M.MAX_VCPUS = 16
M.QEMU_PIDS = 256         -- QEMU's threads, in its cgroup
M.CONSOLE_KEEP = 8192     -- bytes of the serial console kept for error messages
M.CONSOLE_WAIT_MS = 2000  -- for QEMU to exit and the console to end, once the guest is down
M.IMAGE_SIZE_MIN = 64 * 1024 * 1024
M.IMAGE_SIZE_MAX = 64 * 1024 * 1024 * 1024 -- a root image (sparse), TUPPER_VM_IMAGE_MAX to choose
M.QMP_LINE_MAX = 1024 * 1024

local warned = false
local used_uids = {}

--- "kvm" or "tcg": $TUPPER_VM_ACCEL, else kvm when /dev/kvm opens for
-- reading and writing, else tcg (with a warning, once: for testing only).
function M.accel()
  local env = os.getenv("TUPPER_VM_ACCEL")
  if env == "kvm" or env == "tcg" then return env end
  local fd = uv.fs_open("/dev/kvm", "r+", 0)
  if fd then uv.fs_close(fd); return "kvm" end
  if not warned then
    warned = true
    io.stderr:write("tupper: warning: no usable /dev/kvm: microVMs run under TCG emulation, ",
      "which is slow and meant for testing (docs/microvm.md)\n")
  end
  return "tcg"
end

-- The host's TSC rate in kHz: a TCG guest reads the host's TSC, and without
-- tsc_early_khz and tsc=reliable its calibration hangs or takes seconds.
local tsc_cached
local function tsc_khz()
  -- read once per daemon: the command line is part of the snapshot key, and
  -- a host whose reported MHz moves would otherwise change it start by start
  if tsc_cached ~= nil then return tsc_cached or nil end
  local f = io.open("/proc/cpuinfo")
  if not f then return nil end
  local s = f:read(65536) or ""
  f:close()
  local mhz = tonumber(s:match("cpu MHz%s*:%s*([%d%.]+)"))
  tsc_cached = mhz and math.floor(mhz * 1000 + 0.5) or false
  return tsc_cached or nil
end

local function check(ok, err, what)
  if not ok then error((what and (what .. ": ") or "") .. tostring(err), 0) end
  return ok
end

--- The ext4 image of the default image (one per state dir, built on first
-- use): root-owned files, as the guest's root sees them.
function M.base_image(state_dir)
  local dir = state_dir .. "/microvm"
  local path = dir .. "/default.ext4"
  if uv.fs_stat(path) then return path end
  check(vmkernel.mkdirs(dir, 448))
  local tmp = dir .. "/tmp-" .. core.random_hex(4)
  local ok, err = pcall(function()
    check(vmkernel.mkdirs(tmp, 448))
    check(core.default_image(tmp .. "/root", 0, 0))
    local fd = check(uv.fs_open(tmp .. "/root.ext4", "w", 420))
    check(uv.fs_ftruncate(fd, M.IMAGE_SIZE_MIN))
    uv.fs_close(fd)
    check(vmkernel.run(M.MKFS, { "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "tupper-root",
      "-E", "root_owner=0:0", "-d", tmp .. "/root", tmp .. "/root.ext4" }))
    -- mkfs's lost+found is not part of the image
    check(vmkernel.run(M.DEBUGFS, { "-w", "-R", "rmdir /lost+found", tmp .. "/root.ext4" }))
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
  return M.IMAGE_SIZE_MAX
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
    check(vmkernel.mkdirs(tmp .. "/l", 448))
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
    check(vmkernel.run(M.MOUNT, { "-t", "overlay", "-o",
      "ro,index=off,xino=off,lowerdir=" .. table.concat(lower, ":"), "overlay", "m" }, { cwd = tmp }))
    mounted = true
    local tok, terr = require("tupper.util.async").wait(function(cb)
      local qok, e = core.tar_dir(tmp .. "/m", tmp .. "/root.tar", o.uid_base, o.uid_base, o.id_count, cb)
      if not qok then cb(nil, e) end
    end)
    vmkernel.run(M.UMOUNT, { tmp .. "/m" })
    mounted = false
    check(tok, terr, "copy the image's files")
    -- as root, owners as they are in the tar (the guest's own ids)
    check(vmkernel.run(M.TAR, { "-x", "-f", tmp .. "/root.tar", "-C", tmp .. "/r", "--numeric-owner",
      "--same-owner", "--same-permissions", "--no-overwrite-dir" }), nil, "unpack the image's files")
    uv.fs_unlink(tmp .. "/root.tar")
    -- the size: what the files take on the host's disk, with room for
    -- ext4's own metadata, inode tables and a margin
    local kib = tonumber((check(vmkernel.run(M.DU, { "-s", "-x", "-B", "1024", tmp .. "/r" })):match("^(%d+)")))
    local inodes = tonumber((check(vmkernel.run(M.DU, { "-s", "-x", "--inodes", tmp .. "/r" })):match("^(%d+)")))
    if not kib or not inodes then error("cannot measure the image's files", 0) end
    local n_inodes = math.floor(inodes * 1.25) + 1024
    local size = math.floor(kib * 1024 * 1.1) + n_inodes * 256 + 32 * 1048576
    size = ((size + 1048575) // 1048576) * 1048576
    if size < M.IMAGE_SIZE_MIN then size = M.IMAGE_SIZE_MIN end
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
    check(vmkernel.run(M.MKFS, { "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "tupper-root",
      "-m", "0", "-N", tostring(n_inodes), "-E", "root_owner=0:0", "-d", tmp .. "/r", tmp .. "/root.ext4" }),
      nil, "make the image's ext4 file")
    if not uv.fs_lstat(tmp .. "/r/lost+found") then
      check(vmkernel.run(M.DEBUGFS, { "-w", "-R", "rmdir /lost+found", tmp .. "/root.ext4" }))
    end
    check(uv.fs_chmod(tmp .. "/root.ext4", 420))
    local json = require("tupper.util.json")
    local fd2 = check(uv.fs_open(tmp .. "/root.json", "w", 384))
    check(uv.fs_write(fd2, json.encode({ layers = layers, uid_base = o.uid_base, size = size })))
    uv.fs_close(fd2)
    check(uv.fs_rename(tmp .. "/root.json", dir .. "/root-" .. key .. ".json"))
    check(uv.fs_rename(tmp .. "/root.ext4", dir .. "/root-" .. key .. ".ext4"))
  end)
  if mounted then vmkernel.run(M.UMOUNT, { "-l", tmp .. "/m" }) end
  if is_mountpoint(tmp .. "/m") then vmkernel.run(M.UMOUNT, { "-l", tmp .. "/m" }) end
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
  check(vmkernel.mkdirs(dir, 448))
  local key = M.root_key(layers, o.uid_base)
  if not key then return nil, "a layer of the image is gone (removed meanwhile?)" end
  local path = dir .. "/root-" .. key .. ".ext4"
  if uv.fs_stat(path) then return path end
  if root_inflight[key] then
    local w = root_inflight[key]
    return require("tupper.util.async").wait(function(cb) w[#w + 1] = cb end)
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
  local json = require("tupper.util.json")
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
  local tag = M.snapshot_tag(keep)
  local req = uv.fs_scandir(dir)
  while req do
    local n = uv.fs_scandir_next(req)
    if not n then break end
    if n:match("^initramfs%-.*%.cpio") and n ~= keep then
      uv.fs_unlink(dir .. "/" .. n)
    elseif n:match("^tmp%-") or (n:match("^snap%-") and n:sub(6, 5 + #tag) ~= tag) then
      -- a root image build a crash interrupted may have left its overlay mounted
      if is_mountpoint(dir .. "/" .. n .. "/m") then vmkernel.run(M.UMOUNT, { "-l", dir .. "/" .. n .. "/m" }) end
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
  check(vmkernel.mkdirs(dir, 448))
  sweep(dir, name)
  if uv.fs_stat(path) then return path end
  local ok, err = vmkernel.build_initramfs(k, agent or core.agent_binary(), path)
  if not ok then return nil, "build the initramfs: " .. tostring(err) end
  return path
end

-- A host uid for this VM's QEMU, unique among this daemon's VMs.
local function alloc_uid(id)
  local h = 0
  for i = 1, #id do h = (h * 31 + id:byte(i)) % M.UID_COUNT end
  for i = 0, M.UID_COUNT - 1 do
    local uid = M.UID_BASE + (h + i) % M.UID_COUNT
    if not used_uids[uid] then used_uids[uid] = true; return uid end
  end
  return nil, "no free uid for QEMU"
end

--- Guest memory (bytes) and vCPUs from the sandbox limits.
function M.sizes(limits)
  local mem = limits.memory or M.DEFAULT_MEMORY
  if mem < M.MIN_MEMORY then mem = M.MIN_MEMORY end
  if mem > M.MAX_MEMORY then mem = M.MAX_MEMORY end
  local cpus = 1
  if limits.cpu_quota and limits.cpu_period then
    cpus = math.ceil(limits.cpu_quota / limits.cpu_period)
  end
  if cpus < 1 then cpus = 1 end
  if cpus > M.MAX_VCPUS then cpus = M.MAX_VCPUS end
  return mem, cpus
end

--- QEMU's argv for a VM.  o: accel, kernel, initrd, root, rw (paths as
-- QEMU opens them: /proc/self/fd/N of fds the daemon passed), mem, cpus,
-- cmdline; ram (a path as well) and share ("on" for the VM a snapshot is
-- made of, "off" for a VM started from one): the guest memory is that
-- file, not anonymous memory.  No kernel: a VM started from a snapshot
-- does not boot.  The agent channel is the listening socket at QEMU's fd 3 (the
-- daemon bound it in the VM's root-only dir and connects to it; a
-- restarted daemon connects again).  Nothing beyond what the guest needs: two virtio-blk
-- disks, one virtio-serial port, the serial console; no NIC, no display, no
-- monitor, no defaults, no user config; QEMU's seccomp filter on.
function M.argv(o)
  local mib = tostring(o.mem // (1024 * 1024)) .. "M"
  local a = {
    M.QEMU,
    "-M", "microvm,accel=" .. o.accel .. (o.ram and ",memory-backend=mem" or ""),
    "-m", mib, "-smp", tostring(o.cpus),
    "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
    "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
  }
  if o.ram then
    a[#a + 1] = "-object"
    a[#a + 1] = "memory-backend-file,id=mem,size=" .. mib .. ",mem-path=" .. o.ram .. ",share=" .. o.share
  end
  if o.kernel then
    for _, v in ipairs({ "-kernel", o.kernel, "-initrd", o.initrd, "-append", o.cmdline }) do a[#a + 1] = v end
  end
  for _, v in ipairs({
    "-serial", "stdio",
    "-drive", "id=root,file=" .. o.root .. ",format=raw,if=none,readonly=on",
    "-device", "virtio-blk-device,drive=root,serial=tupper-root",
    "-drive", "id=rw,file=" .. o.rw .. ",format=raw,if=none",
    "-device", "virtio-blk-device,drive=rw,serial=tupper-rw",
    "-device", "virtio-serial-device,max_ports=2",
    "-chardev", "socket,id=agent,fd=3,server=on,wait=off",
    "-device", "virtserialport,chardev=agent,name=tupper.agent,nr=1",
  }) do a[#a + 1] = v end
  return a
end

-- Reads the console pipe for as long as QEMU lives, keeping only the last
-- CONSOLE_KEEP bytes: a guest flooding its console costs the daemon nothing.
-- con.closed(cb) runs cb once the pipe reached EOF (QEMU exited: all it
-- wrote has been read) or after wait_ms.
local function console_reader(pipe)
  local con = { tail = "", eof = false, waiters = {} }
  -- runs every waiter once; their timers are closed, so that no handle
  -- outlives the VM (a daemon stopping right after a kill must find none)
  local function release()
    local w = con.waiters
    con.waiters = {}
    for _, f in ipairs(w) do f() end
  end
  local function ended()
    con.eof = true
    if not pipe:is_closing() then pipe:close() end
    release()
  end
  pipe:read_start(function(err, data)
    if err or not data then return ended() end
    local t = con.tail .. data
    if #t > M.CONSOLE_KEEP then t = t:sub(-M.CONSOLE_KEEP) end
    con.tail = t
  end)
  function con.close()
    if not pipe:is_closing() then pipe:close() end
    release()
  end
  function con.closed(wait_ms, cb)
    if con.eof then return cb() end
    local timer = uv.new_timer()
    local done = false
    local function once()
      if done then return end
      done = true
      if not timer:is_closing() then timer:close() end
      cb()
    end
    con.waiters[#con.waiters + 1] = once
    timer:start(wait_ms, 0, once)
  end
  return con
end

-- What the console says about the end: the kernel's panic line, else the
-- last lines.
local function console_hint(con)
  local t = con.tail:gsub("\r", ""):gsub("[^%g \n]", "?")
  local panic = t:match("Kernel panic %- not syncing:[^\n]*")
  if panic then return " (guest " .. panic:gsub("^Kernel", "kernel") .. ")" end
  local lines = {}
  for line in t:gmatch("[^\n]+") do lines[#lines + 1] = line end
  local first = math.max(1, #lines - 5)
  local s = table.concat(lines, " | ", first)
  if s == "" then return "" end
  return " (console: " .. s .. ")"
end

-- A QMP client on the socket fd (QEMU's monitor, in control mode): q.cmd
-- (name, args) -> the return value, or nil, err.  Replies come in order;
-- events are skipped.  QEMU may be the guest's by now: every line is
-- bounded, a bad one closes the monitor.
local function qmp_open(fd)
  local json = require("cjson")
  local pipe = uv.new_pipe()
  pipe:open(fd)
  local q = { buf = "", waiters = {} }
  local function fail_all(why)
    q.closed = why
    local w = q.waiters
    q.waiters = {}
    for _, cb in ipairs(w) do cb(nil, why) end
    if not pipe:is_closing() then pipe:close() end
  end
  pipe:read_start(function(err, data)
    if err or not data then return fail_all("QEMU's monitor closed") end
    q.buf = q.buf .. data
    if #q.buf > M.QMP_LINE_MAX then return fail_all("QEMU's monitor sent an oversized line") end
    while true do
      local line, rest = q.buf:match("^([^\n]*)\n(.*)$")
      if not line then break end
      q.buf = rest
      local ok, msg = pcall(json.decode, line)
      if not ok or type(msg) ~= "table" then return fail_all("QEMU's monitor sent a bad line") end
      if msg.event == nil then
        local cb = table.remove(q.waiters, 1)
        if cb then
          if msg.error then cb(nil, tostring(type(msg.error) == "table" and msg.error.desc or "error"))
          else cb(msg["return"] or msg.QMP or {}) end
        end
      end
    end
  end)
  local async = require("tupper.util.async")
  -- with_fd: a file descriptor passed along (SCM_RIGHTS), for getfd
  function q.cmd(name, args, with_fd)
    if q.closed then return nil, q.closed end
    return async.wait(function(cb)
      q.waiters[#q.waiters + 1] = cb
      if not name then return end
      local line = json.encode({ execute = name, arguments = args }) .. "\n"
      if with_fd then
        local ok, err = core.send_with_fd(pipe:fileno(), line, with_fd)
        if not ok then table.remove(q.waiters); cb(nil, err) end
      else
        pipe:write(line)
      end
    end)
  end
  function q.close() if not pipe:is_closing() then pipe:close() end end
  -- the greeting, then capabilities negotiation
  local g, gerr = q.cmd(nil)
  if not g then q.close(); return nil, gerr end
  local c, cerr = q.cmd("qmp_capabilities")
  if not c then q.close(); return nil, cerr end
  return q
end

--- The guest kernel's command line.  init_on_free=1: freed pages are
-- zeroed, which a snapshot then stores as nothing (QEMU skips zero pages).
function M.cmdline(accel)
  local cmdline = "console=ttyS0 quiet panic=-1 reboot=t init_on_free=1"
  if accel == "tcg" then
    local khz = tsc_khz()
    if khz then cmdline = cmdline .. " tsc_early_khz=" .. khz .. " tsc=reliable" end
  end
  return cmdline
end

-- What every start needs: the kernel, the initramfs, the image disk (the
-- default image's, or the one of o.layers built on first use).
local function prepare(state_dir, o)
  local k, kerr = vmkernel.ensure_kernel()
  if not k then return nil, kerr end
  local initrd, ierr = M.initramfs(state_dir, k)
  if not initrd then return nil, ierr end
  local root, rerr
  if o.layers and not (#o.layers == 1 and o.layers[1] == o.default_layer) then
    root, rerr = M.root_image(state_dir, o.layers, { uid_base = o.uid_base, id_count = o.id_count })
  else
    root, rerr = M.base_image(state_dir)
  end
  if not root then return nil, rerr end
  local rid = root_id(root)
  if not rid then return nil, "the microVM root image " .. root .. " is gone" end
  return { k = k, initrd = initrd, root = root, root_id = rid }
end

-- A fresh writable layer at path: a sparse ext4 image of size bytes.
local function make_rw(path, size)
  local fd = uv.fs_open(path, "w", 384)
  if not fd then return nil, "create " .. path end
  uv.fs_ftruncate(fd, size)
  uv.fs_close(fd)
  local _, merr = vmkernel.run(M.MKFS, { "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "tupper-rw",
    "-E", "lazy_itable_init=1,root_owner=0:0", path })
  if merr then return nil, merr end
  return true
end

-- Starts QEMU.  o: id, dir (exists), uid, cgroup, limits, mem, cpus, rw,
-- accel; ram_fd (the guest memory: the template's memfd, or a snapshot's
-- sealed one) and share; incoming (a snapshot's device state file to start
-- from: with -incoming defer, see restore()); template (a snapshot's VM:
-- it dies with the daemon).  Returns core's box, the console reader, the
-- QMP client.
local function launch(p, o)
  local cmdline = M.cmdline(o.accel)
  -- QEMU opens nothing by path: the daemon opens, QEMU gets fds 4..10
  -- (kernel, initramfs, image, writable disk, monitor, state, memory); a
  -- VM started from a snapshot gets no kernel nor initramfs
  local files = { { p.k.vmlinuz, "r" }, { p.initrd, "r" }, { p.root, "r" }, { o.rw, "r+" } }
  if o.incoming then files[1], files[2], files[6] = false, false, { o.incoming, "r" } end

  local pass = {}
  local qpair = uv.socketpair("stream", 0, { cloexec = true }, { cloexec = true })
  local function close_pass()
    for i, f in pairs(pass) do if f ~= qpair[2] and i ~= 7 then uv.fs_close(f) end end
  end
  for i = 1, 7 do
    if i == 5 then
      pass[5] = qpair[2]
    elseif i == 7 and o.ram_fd then
      pass[7] = o.ram_fd -- the caller's
    elseif files[i] then
      local pfd, oerr = uv.fs_open(files[i][1], files[i][2], 384)
      if not pfd then close_pass(); uv.fs_close(qpair[1]); uv.fs_close(qpair[2]); return nil, oerr end
      pass[i] = pfd
    else
      pass[i] = qpair[2] -- a placeholder keeps the numbering: that fd is then unused
    end
  end
  local function qfd(i) return "/proc/self/fd/" .. (3 + i) end
  local argv = M.argv({ accel = o.accel, kernel = not o.incoming and qfd(1) or nil, initrd = qfd(2),
    root = qfd(3), rw = qfd(4), mem = o.mem, cpus = o.cpus, cmdline = cmdline,
    ram = o.ram_fd and qfd(7) or nil, share = o.share })
  argv[#argv + 1] = "-chardev"
  argv[#argv + 1] = "socket,id=qmp,fd=8"
  argv[#argv + 1] = "-mon"
  argv[#argv + 1] = "chardev=qmp,mode=control"
  if o.incoming then
    argv[#argv + 1] = "-incoming"
    argv[#argv + 1] = "defer"
  end
  local fds = uv.pipe({ nonblock = true }, { nonblock = false })
  local cpipe = uv.new_pipe()
  cpipe:open(fds.read)
  local con = console_reader(cpipe)
  local limits = o.limits or {}
  local box, serr = require("tupper.util.async").wait(function(cb)
    local sok, e = core.start("microvm", { id = o.id, dir = o.dir, argv = argv, fds = pass,
      uid = o.uid, gid = o.uid, cgroup = o.cgroup, console_fd = fds.write, die_with_parent = o.template,
      limits = { memory = o.mem + M.MEMORY_OVERHEAD, pids = M.QEMU_PIDS,
                 cpu_quota = limits.cpu_quota, cpu_period = limits.cpu_period } }, cb)
    if not sok then cb(nil, e) end
  end)
  uv.fs_close(fds.write)
  close_pass()
  uv.fs_close(qpair[2])
  if not box then
    local hint = console_hint(con)
    con.close()
    uv.fs_close(qpair[1])
    return nil, tostring(serr) .. hint
  end
  local q, qerr = qmp_open(qpair[1])
  if not q then
    con.close()
    require("tupper.util.async").wait(function(cb) box:destroy(cb) end)
    return nil, "QEMU's monitor: " .. tostring(qerr)
  end
  return box, con, q
end

-- Polls QMP until pred(reply of cmd) is true (bounded: ms, a poll every
-- step_ms).
local function qmp_until(q, cmd, pred, ms, step_ms)
  local async = require("tupper.util.async")
  step_ms = step_ms or 10
  for _ = 1, ms // step_ms do
    local r, err = q.cmd(cmd)
    if not r then return nil, err end
    local done, ferr = pred(r)
    if done then return r end
    if ferr then return nil, ferr end
    async.sleep(step_ms)
  end
  return nil, cmd .. ": timed out"
end

-- The guest memory is not in the migration stream (x-ignore-shared): the
-- template's is a shared file, saved beside the device state.
local IGNORE_SHARED = { capabilities = { { capability = "x-ignore-shared", state = true } } }

M.SNAPSHOT_FORMAT = "2" -- 2: guest memory in vm.ram, device state in vm.state

-- What a snapshot depends on besides its shape: the initramfs (kernel
-- version, agent), the kernel command line, QEMU's binary (its migration
-- format and machine model) and this file's snapshot format.  Snapshots
-- whose tag differs are never used, and the next daemon's sweep removes them.
function M.snapshot_tag(initrd_name)
  local st = uv.fs_stat(M.QEMU)
  local qemu = st and ("%d-%d-%d"):format(st.size, st.mtime.sec, st.ino) or "none"
  return (initrd_name:match("^initramfs%-(.-)%.cpio$") or "x") .. "-" ..
    core.sha256(M.cmdline(M.accel()), "\0", qemu, "\0", M.SNAPSHOT_FORMAT):sub(1, 8)
end

local snap_inflight = {}
local ram_fds = {} -- snapshot dir -> { fd = its sealed guest memory memfd, id = vm.ram's identity }

--- The snapshot for a VM shape (memory, vCPUs, disk size, accel) and root
-- image, made on first use: a VM whose guest memory is a memfd
-- (memory-backend-file, share=on) booted to agent-ready, stopped and
-- migrated with x-ignore-shared into <state>/microvm/snap-<key>/vm.state
-- (the device state: tens of KiB), its memory written beside it (vm.ram,
-- sparse: the non-zero pages) and its writable disk as it was (rw.ext4).
-- The key names the root image file (p.root_id): the guest has it
-- mounted, so a snapshot never starts on another image's disk.  Returns
-- the snapshot dir, or nil, err.  Concurrent callers share one build.
function M.snapshot(state_dir, p, shape)
  local key = ("%s-%s-%d-%d-%d-r%s"):format(M.snapshot_tag(p.initrd:match("[^/]+$")), shape.accel,
    shape.mem // 1048576, shape.cpus, shape.disk // 1048576, p.root_id)
  local snap = state_dir .. "/microvm/snap-" .. key
  if uv.fs_stat(snap .. "/vm.state") then return snap end
  if snap_inflight[snap] then
    local w = snap_inflight[snap]
    return require("tupper.util.async").wait(function(cb) w[#w + 1] = cb end)
  end
  local waiters = {}
  snap_inflight[snap] = waiters
  local tmp = state_dir .. "/microvm/tmp-snap-" .. core.random_hex(4)
  local uid = alloc_uid("snap" .. key)
  local ram
  local res, err = pcall(function()
    check(uv.fs_mkdir(tmp, 448))
    check(uv.fs_mkdir(tmp .. "/vm", 448))
    check(make_rw(tmp .. "/rw.ext4", shape.disk))
    uv.fs_chown(tmp .. "/rw.ext4", uid, uid)
    ram = check(core.vm_ram_new(shape.mem))
    local box, con, q = launch(p, { id = "snap-" .. core.random_hex(4), dir = tmp .. "/vm", uid = uid,
      mem = shape.mem, cpus = shape.cpus, rw = tmp .. "/rw.ext4", accel = shape.accel, template = true,
      ram_fd = ram, share = "on" })
    if not box then error(con, 0) end
    local sfd = check(uv.fs_open(tmp .. "/vm.state", "w", 384))
    local ready = require("tupper.util.async").wait(function(cb)
      local t = uv.new_timer()
      t:start(require("tupper.daemon.sandbox").VM_READY_TIMEOUT_MS, 0, function() t:close(); cb(false) end)
      box:on(function(typ) if typ == core.MSG.READY then if not t:is_closing() then t:close() end; cb(true) end end,
             function() if not t:is_closing() then t:close() end; cb(false) end)
    end)
    local ok, why = ready, "the guest's agent did not come up"
    if ok then ok, why = q.cmd("stop") end
    if ok then ok, why = q.cmd("migrate-set-capabilities", IGNORE_SHARED) end
    -- QMP takes a file only by getfd: the daemon opens it, QEMU receives it
    if ok then ok, why = q.cmd("getfd", { fdname = "snapshot" }, sfd) end
    uv.fs_close(sfd)
    if ok then ok, why = q.cmd("migrate", { uri = "fd:snapshot" }) end
    if ok then
      ok, why = qmp_until(q, "query-migrate", function(r)
        if r.status == "completed" then return true end
        if r.status == "failed" or r.status == "cancelled" then return false, "migration " .. r.status end
      end, 120000)
    end
    q.close()
    con.close()
    -- QEMU gone, nothing maps the memory any more: what it holds is the
    -- guest's memory at the stop
    require("tupper.util.async").wait(function(cb) box:destroy(cb) end)
    if not ok then error("snapshot: " .. tostring(why) .. console_hint(con), 0) end
    check(core.vm_ram_save(ram, tmp .. "/vm.ram"))
    check(uv.fs_chown(tmp .. "/rw.ext4", 0, 0))
    check(uv.fs_rename(tmp, snap))
  end)
  if ram then uv.fs_close(ram) end
  used_uids[uid] = nil
  if uv.fs_stat(tmp) then core.rmtree(tmp) end
  snap_inflight[snap] = nil
  local out = res and snap or nil
  local e = not res and tostring(err) or nil
  for _, cb in ipairs(waiters) do cb(out, e) end
  return out, e
end

-- The snapshot's guest memory as a sealed memfd, loaded once per daemon
-- (the VMs started from it map it privately, copy-on-write).
local function snapshot_ram(snap, mem)
  -- the memfd of a vm.ram that is gone or was replaced (a snapshot removed
  -- with its root image, a new one at the same path) is never used: its
  -- pages would not match the state file beside the new one.  VMs started
  -- from it keep their own mappings.
  for dir, e in pairs(ram_fds) do
    local st = uv.fs_stat(dir .. "/vm.ram")
    local id = st and ("%d:%d:%d.%d:%d"):format(st.dev, st.ino, st.mtime.sec, st.mtime.nsec, st.size)
    if id ~= e.id then
      uv.fs_close(e.fd)
      ram_fds[dir] = nil
    end
  end
  if ram_fds[snap] then return ram_fds[snap].fd end
  local st = uv.fs_stat(snap .. "/vm.ram")
  if not st then return nil, "no " .. snap .. "/vm.ram" end
  local fd, err = core.vm_ram_memfd(snap .. "/vm.ram", mem)
  if not fd then return nil, err end
  ram_fds[snap] = { fd = fd, id = ("%d:%d:%d.%d:%d"):format(st.dev, st.ino, st.mtime.sec, st.mtime.nsec, st.size) }
  return fd
end

-- Loads the snapshot's device state into a QEMU started with -incoming
-- defer (the memory is the snapshot's, mapped), and resumes the guest.
local function restore(q)
  local r, err = q.cmd("migrate-set-capabilities", IGNORE_SHARED)
  if r then r, err = q.cmd("migrate-incoming", { uri = "fd:9" }) end
  if r then
    -- the guest stays paused (it was stopped for the snapshot) until cont
    r, err = qmp_until(q, "query-status", function(st)
      if st.status == "inmigrate" then return false end
      if st.status == "paused" or st.status == "postmigrate" or st.status == "prelaunch" then return true end
      return false, "unexpected state " .. tostring(st.status)
    end, 60000, 2)
  end
  return r, err
end

--- Starts a VM.  opts: id, dir (must not exist), state_dir, cgroup,
-- limits (backend limits: memory, cpu_quota, cpu_period, disk), layers
-- (the image's layer dirs, lowest first; nil or { default_layer }: the
-- default image), uid_base and id_count (who owns the layers' files).  From the
-- shape's snapshot (made on first use) unless TUPPER_VM_SNAPSHOT=0 or the
-- snapshot cannot be made, else by a cold boot.  Returns a box (as
-- core.start's, plus restored = true from a snapshot) or nil, err.
function M.start(opts)
  local t = { uv.hrtime() }
  local function mark() t[#t + 1] = uv.hrtime() end
  local limits = opts.limits or {}
  local p, perr = prepare(opts.state_dir, opts)
  if not p then return nil, perr end
  local mem, cpus = M.sizes(limits)
  local shape = { mem = mem, cpus = cpus, disk = limits.disk or M.DEFAULT_DISK, accel = M.accel() }
  local snap, ram
  if os.getenv("TUPPER_VM_SNAPSHOT") ~= "0" then
    local serr
    snap, serr = M.snapshot(opts.state_dir, p, shape)
    if snap then ram, serr = snapshot_ram(snap, shape.mem) end
    if not ram then
      snap = nil
      io.stderr:write("tupper: microVM snapshot unavailable, cold boot: ", tostring(serr), "\n")
    end
  end
  mark()
  local uid, uerr = alloc_uid(opts.id)
  if not uid then return nil, uerr end
  local dir = opts.dir
  local function fail(e)
    used_uids[uid] = nil
    core.rmtree(dir)
    return nil, e
  end
  local ok, err = uv.fs_mkdir(dir, 448)
  if not ok then used_uids[uid] = nil; return nil, err end
  local rw = dir .. "/rw.ext4"
  if snap then
    -- the writable disk as the snapshot's guest left it (a sparse copy:
    -- the blocks mkfs and the template wrote, hundreds of KiB)
    local cok, cerr = core.vm_copy_sparse(snap .. "/rw.ext4", rw)
    if not cok then return fail(cerr) end
  else
    local mok, merr = make_rw(rw, shape.disk)
    if not mok then return fail(merr) end
  end
  uv.fs_chown(rw, uid, uid)
  mark()
  local box, con, q = launch(p, { id = opts.id, dir = dir, uid = uid, cgroup = opts.cgroup, limits = limits,
    mem = mem, cpus = cpus, rw = rw, accel = shape.accel, incoming = snap and (snap .. "/vm.state"),
    ram_fd = ram, share = "off" })
  if not box then return fail(con) end
  mark()
  if snap then
    local r, lerr = restore(q)
    mark()
    if r then r, lerr = q.cmd("cont") end
    if not r then
      q.close(); con.close()
      require("tupper.util.async").wait(function(cb) box:destroy(cb) end)
      used_uids[uid] = nil
      return nil, "start from the snapshot: " .. tostring(lerr) .. console_hint(con)
    end
  end
  q.close() -- pause is the cgroup freezer's; nothing else needs the monitor
  mark()
  if snap then
    local function ms(i) return (t[i + 1] - t[i]) // 1000000 end
    io.stderr:write(os.date("!%Y-%m-%dT%H:%M:%SZ "), "sandbox ", opts.id, " started from snapshot ",
      snap:match("[^/]+$"), (" in %d ms: prepare %d, disk %d, QEMU and its monitor %d, load %d, cont %d\n")
      :format((t[#t] - t[1]) // 1000000, ms(1), ms(2), ms(3), ms(4), ms(5)))
  end
  local w = M.wrap(box, uid, con)
  w.restored = snap ~= nil
  return w
end

--- Re-adopts a VM a previous daemon started (after a crash).  opts: id,
-- dir and cgroup (the daemon's, from the id), pid, uid, start_time (from
-- the sandbox's record: hostile; core.adopt proves pid is this VM's
-- QEMU before anything is done with it).  Returns a box (no console: the
-- previous daemon read it) or nil, err.
function M.adopt(opts)
  local uid = math.tointeger(opts.uid)
  if not uid or uid < M.UID_BASE or uid >= M.UID_BASE + M.UID_COUNT then
    return nil, "QEMU's uid in the record is not one of the microVM uids"
  end
  if used_uids[uid] then return nil, "QEMU's uid " .. uid .. " is taken by another VM" end
  local box, err = core.adopt("microvm", { id = opts.id, dir = opts.dir, cgroup = opts.cgroup,
    pid = math.tointeger(opts.pid) or -1, uid = uid, start_time = math.tointeger(opts.start_time) or -1 })
  if not box then return nil, err end
  used_uids[uid] = true
  local w = M.wrap(box, uid, nil)
  w.start_time = math.tointeger(opts.start_time)
  w.adopted = true
  return w
end

-- The box sandbox.lua sees: core's box, whose down reasons carry the end of
-- the console (a guest panic says so), and which frees its uid once gone.
-- con is nil for a re-adopted VM (its console went with the dead daemon).
function M.wrap(box, uid, con)
  local w = { vm = true, uid = uid }
  if con then w.start_time = core.proc_start_time(box:pid()) end
  function w.on(_, on_frame, on_down)
    return box:on(on_frame, function(reason)
      if reason == "box init exited" or reason == "agent channel closed" then
        reason = "the VM stopped (guest power-off, panic or QEMU crash)"
      end
      if not con then return on_down(reason) end
      -- the console's last words come once QEMU is gone (its stdout closes)
      con.closed(M.CONSOLE_WAIT_MS, function() on_down(reason .. console_hint(con)) end)
    end)
  end
  function w.destroy(_, cb)
    return box:destroy(function(...)
      if con then con.close() end
      used_uids[uid] = nil
      cb(...)
    end)
  end
  function w.console() return con and con.tail or "" end
  for _, name in ipairs({ "send", "pid", "queued", "freeze", "stats", "has_cgroup", "set_limits" }) do
    w[name] = function(_, ...) return box[name](box, ...) end
  end
  return w
end

return M
