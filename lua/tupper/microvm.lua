--- The microvm backend: one QEMU `microvm` machine per sandbox, with its own
-- kernel, the same agent as PID 1, the same frame protocol over a
-- virtio-serial port (docs/microvm.md).  start() returns a box with the
-- linux backend's interface (on/send/pid/destroy/freeze/stats, from
-- core.vm_start) for sandbox.lua.  Call from a coroutine.
local uv = require("luv")
local core = require("tupper.core")
local vmkernel = require("tupper.vmkernel")

local M = {}

M.QEMU = "/usr/bin/qemu-system-x86_64"
M.MKFS = "/usr/sbin/mkfs.ext4"
M.DEBUGFS = "/usr/sbin/debugfs"
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
local function tsc_khz()
  local f = io.open("/proc/cpuinfo")
  if not f then return nil end
  local s = f:read(65536) or ""
  f:close()
  local mhz = tonumber(s:match("cpu MHz%s*:%s*([%d%.]+)"))
  return mhz and math.floor(mhz * 1000 + 0.5) or nil
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

--- The initramfs of this daemon (its agent, the cached kernel's modules),
-- named after both: an upgraded daemon never boots an older agent.  Older
-- ones are removed when a new one is made.
function M.initramfs(state_dir, k)
  local agent = core.agent_binary()
  local dir = state_dir .. "/microvm"
  local name = "initramfs-" .. k.version .. "-" .. core.sha256(agent):sub(1, 16) .. ".cpio"
  local path = dir .. "/" .. name
  if uv.fs_stat(path) then return path end
  check(vmkernel.mkdirs(dir, 448))
  local ok, err = vmkernel.build_initramfs(k, agent, path)
  if not ok then return nil, "build the initramfs: " .. tostring(err) end
  local req = uv.fs_scandir(dir)
  while req do
    local n = uv.fs_scandir_next(req)
    if not n then break end
    if n:match("^initramfs%-.*%.cpio$") and n ~= name then uv.fs_unlink(dir .. "/" .. n) end
  end
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
-- cmdline.  The agent channel is the socket at QEMU's fd 3.  Nothing beyond what the guest needs: two virtio-blk
-- disks, one virtio-serial port, the serial console; no NIC, no display, no
-- monitor, no defaults, no user config; QEMU's seccomp filter on.
function M.argv(o)
  return {
    M.QEMU,
    "-M", "microvm,accel=" .. o.accel,
    "-m", tostring(o.mem // (1024 * 1024)) .. "M", "-smp", tostring(o.cpus),
    "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
    "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    "-kernel", o.kernel, "-initrd", o.initrd, "-append", o.cmdline,
    "-serial", "stdio",
    "-drive", "id=root,file=" .. o.root .. ",format=raw,if=none,readonly=on",
    "-device", "virtio-blk-device,drive=root,serial=tupper-root",
    "-drive", "id=rw,file=" .. o.rw .. ",format=raw,if=none",
    "-device", "virtio-blk-device,drive=rw,serial=tupper-rw",
    "-device", "virtio-serial-device,max_ports=2",
    "-chardev", "socket,id=agent,fd=3",
    "-device", "virtserialport,chardev=agent,name=tupper.agent,nr=1",
  }
end

-- Reads the console pipe for as long as QEMU lives, keeping only the last
-- CONSOLE_KEEP bytes: a guest flooding its console costs the daemon nothing.
-- con.closed(cb) runs cb once the pipe reached EOF (QEMU exited: all it
-- wrote has been read) or after wait_ms.
local function console_reader(pipe)
  local con = { tail = "", eof = false, waiters = {} }
  local function ended()
    con.eof = true
    if not pipe:is_closing() then pipe:close() end
    local w = con.waiters
    con.waiters = {}
    for _, cb in ipairs(w) do cb() end
  end
  pipe:read_start(function(err, data)
    if err or not data then return ended() end
    local t = con.tail .. data
    if #t > M.CONSOLE_KEEP then t = t:sub(-M.CONSOLE_KEEP) end
    con.tail = t
  end)
  function con.close()
    if not pipe:is_closing() then pipe:close() end
  end
  function con.closed(wait_ms, cb)
    if con.eof then return cb() end
    local timer = uv.new_timer()
    local done = false
    local function once()
      if done then return end
      done = true
      timer:close()
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

--- Starts a VM.  opts: id, dir (must not exist), state_dir, cgroup,
-- limits (backend limits: memory, cpu_quota, cpu_period, disk).  Returns a
-- box (as core.box_start's) or nil, err.
function M.start(opts)
  local limits = opts.limits or {}
  local k, kerr = vmkernel.ensure_kernel()
  if not k then return nil, kerr end
  local initrd, ierr = M.initramfs(opts.state_dir, k)
  if not initrd then return nil, ierr end
  local root, rerr = M.base_image(opts.state_dir)
  if not root then return nil, rerr end
  local uid, uerr = alloc_uid(opts.id)
  if not uid then return nil, uerr end
  local dir = opts.dir
  local mem, cpus = M.sizes(limits)
  local accel = M.accel()
  local function fail(e)
    used_uids[uid] = nil
    core.rmtree(dir)
    return nil, e
  end
  local ok, err = uv.fs_mkdir(dir, 448)
  if not ok then used_uids[uid] = nil; return nil, err end
  -- the writable layer: a sparse ext4 image of the disk limit
  local rw = dir .. "/rw.ext4"
  local fd = uv.fs_open(rw, "w", 384)
  if not fd then return fail("create " .. rw) end
  uv.fs_ftruncate(fd, limits.disk or M.DEFAULT_DISK)
  uv.fs_close(fd)
  local _, merr = vmkernel.run(M.MKFS, { "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "tupper-rw",
    "-E", "lazy_itable_init=1,root_owner=0:0", rw })
  if merr then return fail(merr) end
  uv.fs_chown(rw, uid, uid)
  local cmdline = "console=ttyS0 quiet panic=-1 reboot=t"
  if accel == "tcg" then
    local khz = tsc_khz()
    if khz then cmdline = cmdline .. " tsc_early_khz=" .. khz .. " tsc=reliable" end
  end
  -- QEMU opens nothing by path: the daemon opens, QEMU gets fds 4..7
  local pass = {}
  local function close_pass() for _, f in ipairs(pass) do uv.fs_close(f) end end
  for i, f in ipairs({ { k.vmlinuz, "r" }, { initrd, "r" }, { root, "r" }, { rw, "r+" } }) do
    local pfd, oerr = uv.fs_open(f[1], f[2], 0)
    if not pfd then close_pass(); return fail(oerr) end
    pass[i] = pfd
  end
  local function qfd(i) return "/proc/self/fd/" .. (3 + i) end
  local argv = M.argv({ accel = accel, kernel = qfd(1), initrd = qfd(2), root = qfd(3), rw = qfd(4),
    mem = mem, cpus = cpus, cmdline = cmdline })
  local fds = uv.pipe({ nonblock = true }, { nonblock = false })
  local cpipe = uv.new_pipe()
  cpipe:open(fds.read)
  local con = console_reader(cpipe)
  local box, serr = require("tupper.async").wait(function(cb)
    local sok, e = core.vm_start({ id = opts.id, dir = dir, argv = argv, fds = pass,
      uid = uid, gid = uid, cgroup = opts.cgroup, console_fd = fds.write,
      limits = { memory = mem + M.MEMORY_OVERHEAD, pids = M.QEMU_PIDS,
                 cpu_quota = limits.cpu_quota, cpu_period = limits.cpu_period } }, cb)
    if not sok then cb(nil, e) end
  end)
  uv.fs_close(fds.write)
  close_pass()
  if not box then
    local hint = console_hint(con)
    con.close()
    return fail(tostring(serr) .. hint)
  end
  return M.wrap(box, uid, con)
end

-- The box sandbox.lua sees: core's box, whose down reasons carry the end of
-- the console (a guest panic says so), and which frees its uid once gone.
function M.wrap(box, uid, con)
  local w = { vm = true }
  function w.on(_, on_frame, on_down)
    return box:on(on_frame, function(reason)
      if reason == "box init exited" or reason == "agent channel closed" then
        reason = "the VM stopped (guest power-off, panic or QEMU crash)"
      end
      -- the console's last words come once QEMU is gone (its stdout closes)
      con.closed(M.CONSOLE_WAIT_MS, function() on_down(reason .. console_hint(con)) end)
    end)
  end
  function w.destroy(_, cb)
    return box:destroy(function(...)
      con.close()
      used_uids[uid] = nil
      cb(...)
    end)
  end
  function w.console() return con.tail end
  for _, name in ipairs({ "send", "pid", "queued", "freeze", "stats", "has_cgroup", "set_limits", "is_vm" }) do
    w[name] = function(_, ...) return box[name](box, ...) end
  end
  return w
end

return M
