--- microVM snapshots: a VM of each shape booted once to agent-ready and
-- saved (device state, guest memory, writable disk), so that later VMs
-- of that shape start from it in a fraction of a cold boot.  Call from a
-- coroutine.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local qemu = require("tupper.backend.microvm.qemu")
local console = require("tupper.backend.microvm.console")
local qmp = require("tupper.backend.microvm.qmp")
local launch = require("tupper.backend.microvm.launch")

local M = {}

local check = qemu.check

-- The guest memory is not in the migration stream (x-ignore-shared): the
-- template's is a shared file, saved beside the device state.
local IGNORE_SHARED = { capabilities = { { capability = "x-ignore-shared", state = true } } }

M.SNAPSHOT_FORMAT = "2" -- 2: guest memory in vm.ram, device state in vm.state

-- What a snapshot depends on besides its shape: the initramfs (kernel
-- version, agent), the kernel command line, QEMU's binary (its migration
-- format and machine model) and this file's snapshot format.  Snapshots
-- whose tag differs are never used, and the next daemon's sweep removes them.
function M.tag(initrd_name, accel)
  local st = uv.fs_stat(qemu.QEMU)
  local bin = st and ("%d-%d-%d"):format(st.size, st.mtime.sec, st.ino) or "none"
  return (initrd_name:match("^initramfs%-(.-)%.cpio$") or "x") .. "-" ..
    core.sha256(qemu.cmdline(accel or qemu.accel()), "\0", bin, "\0", M.SNAPSHOT_FORMAT):sub(1, 8)
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
  local key = ("%s-%s-%d-%d-%d-r%s"):format(M.tag(p.initrd:match("[^/]+$"), shape.accel), shape.accel,
    shape.mem // 1048576, shape.cpus, shape.disk // 1048576, p.root_id)
  local snap = state_dir .. "/microvm/snap-" .. key
  if uv.fs_stat(snap .. "/vm.state") then return snap end
  if snap_inflight[snap] then
    local w = snap_inflight[snap]
    return async.wait(function(cb) w[#w + 1] = cb end)
  end
  local waiters = {}
  snap_inflight[snap] = waiters
  local tmp = state_dir .. "/microvm/tmp-snap-" .. core.random_hex(4)
  local uid = qemu.alloc_uid("snap" .. key)
  local ram
  local res, err = pcall(function()
    check(uv.fs_mkdir(tmp, 448))
    check(uv.fs_mkdir(tmp .. "/vm", 448))
    check(qemu.make_rw(tmp .. "/rw.ext4", shape.disk))
    uv.fs_chown(tmp .. "/rw.ext4", uid, uid)
    ram = check(core.vm_ram_new(shape.mem))
    local box, con, q = launch.launch(p, { id = "snap-" .. core.random_hex(4), dir = tmp .. "/vm", uid = uid,
      mem = shape.mem, cpus = shape.cpus, rw = tmp .. "/rw.ext4", accel = shape.accel, template = true,
      ram_fd = ram, share = "on" })
    if not box then error(con, 0) end
    local sfd = check(uv.fs_open(tmp .. "/vm.state", "w", 384))
    local ready = async.wait(function(cb)
      local t = uv.new_timer()
      t:start(qemu.READY_TIMEOUT_MS, 0, function() t:close(); cb(false) end)
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
      ok, why = qmp.until_ready(q, "query-migrate", function(r)
        if r.status == "completed" then return true end
        if r.status == "failed" or r.status == "cancelled" then return false, "migration " .. r.status end
      end, 120000)
    end
    q.close()
    local hint = not ok and console.last_words(con, 0) or ""
    con.close()
    -- QEMU gone, nothing maps the memory any more: what it holds is the
    -- guest's memory at the stop
    async.wait(function(cb) box:destroy(cb) end)
    if not ok then error("snapshot: " .. tostring(why) .. hint, 0) end
    check(core.vm_ram_save(ram, tmp .. "/vm.ram"))
    check(uv.fs_chown(tmp .. "/rw.ext4", 0, 0))
    check(uv.fs_rename(tmp, snap))
  end)
  if ram then uv.fs_close(ram) end
  qemu.free_uid(uid)
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
-- full: the stream holds the guest memory too (a running VM's memory
-- snapshot, backend/microvm/vmstate.lua): x-ignore-shared stays off, as it
-- was on the VM that wrote it (the stream's format depends on it).
local function restore(q, full)
  local r, err = true, nil
  if not full then r, err = q.cmd("migrate-set-capabilities", IGNORE_SHARED) end
  if r then r, err = q.cmd("migrate-incoming", { uri = "fd:9" }) end
  if r then
    -- the guest stays paused (it was stopped for the snapshot) until cont
    r, err = qmp.until_ready(q, "query-status", function(st)
      if st.status == "inmigrate" then return false end
      if st.status == "paused" or st.status == "postmigrate" or st.status == "prelaunch" then return true end
      return false, "unexpected state " .. tostring(st.status)
    end, 60000, 2)
  end
  return r, err
end

--- The snapshot's guest memory as a sealed memfd (loaded once per daemon).
-- Returns the fd or nil, err.
M.ram = snapshot_ram

--- Loads a snapshot's device state into a QEMU started with -incoming
-- defer and waits until the guest is ready to resume.
M.restore = restore

return M
