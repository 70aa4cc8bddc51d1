--- The microVM's machine: the host tools and sizes it uses, QEMU's
-- accelerator, its argv and the guest kernel's command line, the host uids
-- QEMU runs as, and the writable disk.  Pure data and small helpers: the
-- parts that start QEMU are launch.lua's.
local uv = require("luv")
local kernel = require("tupper.backend.microvm.kernel")
local accel = require("tupper.backend.microvm.accel")

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
M.IMAGE_SIZE_MIN = 64 * 1024 * 1024
M.IMAGE_SIZE_MAX = 64 * 1024 * 1024 * 1024 -- a root image (sparse), TUPPER_VM_IMAGE_MAX to choose
M.READY_TIMEOUT_MS = 90000 -- for the guest's agent: a cold boot under TCG emulation takes seconds

local used_uids = {}

--- "kvm" or "tcg" (and why, for TCG): what accel.decide chose, or before
-- the first VM start what the host says without a trial.
function M.accel()
  return accel.current()
end

--- Decides the accelerator once per daemon, trying KVM with the guest
-- kernel vmlinuz where the host offers it (accel.lua).  Call from a
-- coroutine, before the first VM of the daemon starts.
function M.decide_accel(state_dir, vmlinuz)
  local uid = M.alloc_uid("accel-trial")
  local a = accel.decide({ state_dir = state_dir, vmlinuz = vmlinuz, qemu = M.QEMU, uid = uid })
  if uid then M.free_uid(uid) end
  return a
end

--- The accelerator of one VM: requested ("kvm", "tcg", "auto" or nil, a
-- create's `accel`) as asked, else the daemon's, decided as decide_accel
-- does.  Call from a coroutine.  Returns the accelerator and why.
function M.accel_for(requested, state_dir, vmlinuz)
  if requested == "kvm" or requested == "tcg" then return accel.choose(requested) end
  local a = M.decide_accel(state_dir, vmlinuz)
  local _, why = accel.current()
  return a, why
end

--- The daemon's accelerator (`tupper daemon --accel`): see accel.set_default.
M.set_accel = accel.set_default

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
M.check = check

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
M.alloc_uid = alloc_uid

--- Gives a uid alloc_uid handed out back (its VM is gone).
function M.free_uid(uid)
  used_uids[uid] = nil
end

--- Marks uid taken (a re-adopted VM's QEMU); false when it already is.
function M.take_uid(uid)
  if used_uids[uid] then return false end
  used_uids[uid] = true
  return true
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


-- A fresh writable layer at path: a sparse ext4 image of size bytes.
local function make_rw(path, size)
  local fd = uv.fs_open(path, "w", 384)
  if not fd then return nil, "create " .. path end
  uv.fs_ftruncate(fd, size)
  uv.fs_close(fd)
  local _, merr = kernel.run(M.MKFS, { "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "tupper-rw",
    "-E", "lazy_itable_init=1,root_owner=0:0", path })
  if merr then return nil, merr end
  return true
end
M.make_rw = make_rw

return M
