--- The microvm backend: one QEMU `microvm` machine per sandbox, with its own
-- kernel, the same agent as PID 1, the same frame protocol over a
-- virtio-serial port (docs/microvm.md).  start() returns a box with the
-- linux backend's interface (on/send/pid/destroy/freeze/stats, from
-- core.start) for the daemon's sandbox; the interface every backend has is
-- described in backend/registry.lua.  Its parts are in backend/microvm/.
-- Call from a coroutine.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local kernel = require("tupper.backend.microvm.kernel")
local qemu = require("tupper.backend.microvm.qemu")
local console = require("tupper.backend.microvm.console")
local image = require("tupper.backend.microvm.image")
local launch = require("tupper.backend.microvm.launch")
local snapshot = require("tupper.backend.microvm.snapshot")
local vmstate = require("tupper.backend.microvm.vmstate")
local qmp = require("tupper.backend.microvm.qmp")

local MSG = core.MSG
local M = {}

M.name = "microvm"
-- the guest's agent may take a cold boot under TCG emulation
M.ready_timeout_ms = qemu.READY_TIMEOUT_MS
-- how long a guest keeps running with no daemon attached (a crash) before
-- it powers off
M.GRACE_S = (function()
  local g = math.tointeger(tonumber(os.getenv("TUPPER_VM_GRACE") or ""))
  return g and g >= 0 and g <= 86400 and g or 60
end)()
-- the box's processes run in the guest's own kernel: the host's cgroup of
-- the box holds QEMU, not one cgroup per process tree
M.guest_kernel = true
-- a pause freezes the guest whole, its agent too
M.agent_frozen = true
-- the pids limit is enforced by the guest's own cgroups (agent_cgroup.c),
-- wherever the host's cgroups can or cannot
M.guest_pids = true
-- memory, vCPUs and disk are the VM's shape: a live VM keeps them
M.live_limits = false
-- microVMs kept started (from the snapshot) and frozen, for fast creates of
-- the default VM shape (tupper daemon --vm-pool N; docs/microvm.md).  A
-- start is far costlier than a linux box's (a QEMU start, a restore and the
-- guest's first requests under TCG: 0.4 s of CPU here): the pool refills
-- once the daemon has been quiet for delay_ms, so that it does not compete
-- with the first commands in the VM just taken.
M.pool = { option = "vm_pool", size = 0, delay_ms = 1500, label = "microVM pool" }
-- a create may ask for an accelerator (`accel`: kvm, tcg, auto)
M.takes_accel = true

--- The daemon's options this backend reads: accel (`tupper daemon --accel
-- kvm|tcg|auto`).  Returns true or nil, err.
function M.configure(opts)
  return qemu.set_accel(opts.accel)
end

-- What every start needs: the kernel, the initramfs, the image disk (the
-- default image's, or the one of o.layers built on first use).
local function prepare(state_dir, o)
  local k, kerr = kernel.ensure_kernel()
  if not k then return nil, kerr end
  -- before anything keyed by the kernel command line (the initramfs sweep,
  -- the snapshot): it differs between KVM and TCG
  qemu.decide_accel(state_dir, k.vmlinuz)
  local initrd, ierr = image.initramfs(state_dir, k)
  if not initrd then return nil, ierr end
  local root, rerr
  if o.layers and not (#o.layers == 1 and o.layers[1] == o.default_layer) then
    root, rerr = image.root_image(state_dir, o.layers, { uid_base = o.uid_base, id_count = o.id_count })
  else
    root, rerr = image.base_image(state_dir)
  end
  if not root then return nil, rerr end
  local rid = image.root_id(root)
  if not rid then return nil, "the microVM root image " .. root .. " is gone" end
  return { k = k, initrd = initrd, root = root, root_id = rid }
end

-- The box the sandbox sees: core's box, whose down reasons carry the end of
-- the console (a guest panic says so), and which frees its uid once gone.
-- con is nil for a re-adopted VM (its console went with the dead daemon).
-- q: QEMU's monitor, kept for memory snapshots (nil for a re-adopted VM).
local function wrap(box, uid, con, q)
  -- core: the channel's own box, for what relays frames in C (the data
  -- plane's file streams, daemon/api_stream.lua)
  local w = { uid = uid, core = box, qmp = q }
  if con then w.start_time = core.proc_start_time(box:pid()) end
  function w.on(_, on_frame, on_down)
    return box:on(on_frame, function(reason)
      if reason == "box init exited" or reason == "agent channel closed" then
        reason = "the VM stopped (guest power-off, panic or QEMU crash)"
      end
      if not con then return on_down(reason) end
      -- the console's last words come once QEMU is gone (its stdout closes)
      con.closed(console.CONSOLE_WAIT_MS, function() on_down(reason .. console.hint(con)) end)
    end)
  end
  function w.destroy(_, cb)
    if w.qmp then w.qmp.close() end
    return box:destroy(function(...)
      if con then con.close() end
      qemu.free_uid(uid)
      cb(...)
    end)
  end
  function w.console() return con and con.tail or "" end
  function w.hint() return con and console.hint(con) or "" end
  for _, name in ipairs({ "send", "pid", "queued", "freeze", "stats", "has_cgroup", "set_limits", "resolv" }) do
    w[name] = function(_, ...) return box[name](box, ...) end
  end
  return w
end

M._wrap = wrap -- for the box contract's test (backend/registry.lua)

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
  local mem, cpus = qemu.sizes(limits)
  local acc = qemu.accel_for(opts.accel, opts.state_dir, p.k.vmlinuz)
  local shape = { mem = mem, cpus = cpus, disk = limits.disk or qemu.DEFAULT_DISK, accel = acc }
  local snap, ram, own_ram
  local from = opts.vm_state -- a running VM's memory snapshot (vmstate.lua): its shape
  if from then
    local sh, serr = vmstate.shape(from)
    if not sh then return nil, serr end
    if sh.root_id ~= p.root_id then return nil, "the memory snapshot's root image is gone or was rebuilt" end
    shape = { mem = sh.mem, cpus = sh.cpus, disk = sh.disk, accel = sh.accel }
    mem, cpus = sh.mem, sh.cpus
    if sh.ram == "memfd" then
      -- the same memory backend as the VM that was saved (a fresh memfd:
      -- the stream holds every page)
      local rerr
      ram, rerr = core.vm_ram_new(mem)
      if not ram then return nil, rerr end
      own_ram = true
    end
  elseif os.getenv("TUPPER_VM_SNAPSHOT") ~= "0" then
    local serr
    snap, serr = snapshot.snapshot(opts.state_dir, p, shape)
    if snap then ram, serr = snapshot.ram(snap, shape.mem) end
    if not ram then
      snap = nil
      io.stderr:write("tupper: microVM snapshot unavailable, cold boot: ", tostring(serr), "\n")
    end
  end
  mark()
  local uid, uerr = qemu.alloc_uid(opts.id)
  if not uid then return nil, uerr end
  local dir = opts.dir
  local function fail(e)
    if own_ram then uv.fs_close(ram) end
    qemu.free_uid(uid)
    core.rmtree(dir)
    return nil, e
  end
  local ok, err = uv.fs_mkdir(dir, 448)
  if not ok then if own_ram then uv.fs_close(ram) end; qemu.free_uid(uid); return nil, err end
  local rw = dir .. "/rw.ext4"
  if from then
    local cok, cerr = core.vm_copy_sparse(from .. "/rw.ext4", rw)
    if not cok then return fail(cerr) end
  elseif snap then
    -- the writable disk as the snapshot's guest left it (a sparse copy:
    -- the blocks mkfs and the template wrote, hundreds of KiB)
    local cok, cerr = core.vm_copy_sparse(snap .. "/rw.ext4", rw)
    if not cok then return fail(cerr) end
  else
    local mok, merr = qemu.make_rw(rw, shape.disk)
    if not mok then return fail(merr) end
  end
  uv.fs_chown(rw, uid, uid)
  mark()
  local incoming = (from and from .. "/vm.state") or (snap and snap .. "/vm.state") or nil
  local box, con, q = launch.launch(p, { id = opts.id, dir = dir, uid = uid, cgroup = opts.cgroup, limits = limits,
    mem = mem, cpus = cpus, rw = rw, accel = shape.accel, incoming = incoming,
    ram_fd = ram, share = "off" })
  if own_ram then uv.fs_close(ram); own_ram = false end -- QEMU has its own
  if not box then return fail(con) end
  mark()
  if incoming then
    local r, lerr = snapshot.restore(q, from ~= nil)
    mark()
    if r then r, lerr = q.cmd("cont") end
    if not r then
      q.close()
      local hint = console.last_words(con)
      con.close()
      async.wait(function(cb) box:destroy(cb) end)
      qemu.free_uid(uid)
      return nil, "start from the snapshot: " .. tostring(lerr) .. hint
    end
  end
  -- the monitor stays, for memory snapshots of this VM (vmstate.lua); pause
  -- is the cgroup freezer's
  mark()
  if snap then
    local function ms(i) return (t[i + 1] - t[i]) // 1000000 end
    io.stderr:write(os.date("!%Y-%m-%dT%H:%M:%SZ "), "sandbox ", opts.id, " started from snapshot ",
      snap:match("[^/]+$"), (" in %d ms: prepare %d, disk %d, QEMU and its monitor %d, load %d, cont %d\n")
      :format((t[#t] - t[1]) // 1000000, ms(1), ms(2), ms(3), ms(4), ms(5)))
  end
  local w = wrap(box, uid, con, q)
  w.restored = incoming ~= nil
  -- from a running VM's memory: its agent still holds the saved VM's
  -- session (handshake below), and may send frames of it
  w.from_memory = from ~= nil
  w.shape = { mem = mem, cpus = cpus, disk = shape.disk, accel = shape.accel, root_id = p.root_id,
              ram = ram and "memfd" or "anon" }
  w.rw = rw
  return w
end

--- Saves a running VM's memory snapshot into dir (vmstate.lua); the guest
-- is left stopped: cont() after, or destroy.  QEMU must not be frozen.
function M.save_memory(box, dir)
  return vmstate.save(box, dir)
end

--- Lets a VM stopped by save_memory run on.
function M.cont(box)
  return vmstate.cont(box)
end

--- Re-adopts a VM a previous daemon started (after a crash).  opts: id,
-- dir and cgroup (the daemon's, from the id), pid, saved (what record()
-- returned, from the sandbox's record: QEMU's uid and start time; hostile:
-- core.adopt proves pid is this VM's QEMU before anything is done with
-- it).  Returns a box (no console: the previous daemon read it) or nil, err.
function M.adopt(opts)
  local saved = type(opts.saved) == "table" and opts.saved or {}
  local uid = math.tointeger(saved.uid)
  if not uid or uid < qemu.UID_BASE or uid >= qemu.UID_BASE + qemu.UID_COUNT then
    return nil, "QEMU's uid in the record is not one of the microVM uids"
  end
  if not qemu.take_uid(uid) then return nil, "QEMU's uid " .. uid .. " is taken by another VM" end
  local box, err = core.adopt("microvm", { id = opts.id, dir = opts.dir, cgroup = opts.cgroup,
    pid = math.tointeger(opts.pid) or -1, uid = uid, start_time = math.tointeger(saved.start_time) or -1 })
  if not box then qemu.free_uid(uid); return nil, err end
  local w = wrap(box, uid, nil)
  w.start_time = math.tointeger(saved.start_time)
  w.adopted = true
  -- for memory snapshots: its monitor is reached again in the handshake
  -- (QEMU may be frozen now); its shape is the record's (checked: a lie
  -- only makes a start from its snapshot fail), its disk is in its dir
  w.shape = saved.shape and vmstate.check_shape(saved.shape) or nil
  w.rw = opts.dir .. "/rw.ext4"
  w.dir = opts.dir
  return w
end

--- What a box that failed to come up printed (QEMU's output and the
-- guest's console), as " (...)": for the error of a start.
function M.last_words(box)
  return box.hint and box.hint() or ""
end

--- What the sandbox's record keeps of the box (its `vm` field): what
-- proves QEMU's pid is still this VM's after a crash.
function M.record(box)
  return { uid = box.uid, start_time = box.start_time, shape = box.shape }
end

-- A re-adopted VM's monitor, through the socket QEMU listens on
-- (launch.lua's second monitor): a guest a dead daemon left stopped (it
-- died between a snapshot's stop and its cont) is let run on.
local function reattach_monitor(w)
  if not w.dir or w.qmp then return end
  local q, err = qmp.connect(w.dir .. "/" .. launch.MONITOR_SOCK, 5000)
  if not q then
    io.stderr:write("tupper: re-adopted microVM without its monitor (no snapshots of it): ", tostring(err), "\n")
    return
  end
  local st = q.cmd("query-status")
  if st and st.running == false and st.status ~= "inmigrate" then
    q.cmd("migrate_cancel") -- a migration the dead daemon began, if any
    local ok, cerr = q.cmd("cont")
    if not ok then io.stderr:write("tupper: cont a re-adopted microVM: ", tostring(cerr), "\n") end
  end
  w.qmp = q
end

--- Waits for the agent's READY unless the box's agent said it already: a
-- VM started from a snapshot said it before the snapshot (VM_INIT is the
-- handshake), a re-adopted one long ago (VM_ATTACH is).
function M.awaits_ready(box, adopting)
  return not (box.restored or adopting)
end

--- The first requests to a VM's agent, once it is up (sb: the sandbox,
-- opts: its start options).  Returns true or nil, err.
function M.handshake(sb, opts, adopting)
  local from_memory = not adopting and sb.box.from_memory
  if adopting then reattach_monitor(sb.box) end
  if adopting or from_memory then
    -- the guest's agent may or may not have seen the dead daemon's
    -- connection close: VM_ATTACH makes it drop what was that one's.  Its
    -- id is random: a reply the agent still owed the dead daemon (sent as
    -- the port reopened) is not taken for this one's
    sb.next_id = 0x10000 + (tonumber(core.random_hex(3), 16) % 0x7fff0000)
    local r, aerr = sb:request(MSG.VM_ATTACH, {})
    if not r then return nil, "re-attach to the VM's agent: " .. tostring(aerr) end
    if not from_memory then return true end
  end
  -- the guest's clock, hostname and random pool are its own (and, from a
  -- snapshot, the snapshot's): the daemon sets them
  local ent = uv.random(64) or core.random_hex(32)
  local sec, usec = uv.gettimeofday()
  local r, ierr = sb:request(MSG.VM_INIT, { name = opts.id, data = ent, grace = M.GRACE_S,
                                             mtime = sec * 1000000000 + usec * 1000 })
  -- an integer: limits read back from a record (a create from a snapshot)
  -- come as floats from JSON
  local pids = opts.limits and math.tointeger(opts.limits.pids)
  if r and pids then
    -- enforced by the guest's own cgroups (agent_cgroup.c)
    r, ierr = sb:request(MSG.VM_LIMITS, { pids = pids })
  end
  if not r then return nil, "set up the VM: " .. tostring(ierr) end
  if from_memory then
    -- a VM started from another's memory: the processes it had run on,
    -- with no client; they can be listed, signalled, killed
    local ps, perr = sb:request(MSG.PS, {})
    if not ps then return nil, "list the VM's processes: " .. tostring(perr) end
    for _, e in ipairs(ps.entries or {}) do
      local pid = math.tointeger(e.pid)
      if pid and pid > 0 then sb.procs[pid] = { pid = pid, argv = e.args or {}, cwd = "?", started_at = "?" } end
    end
    sb.adopting = nil
  end
  return true
end

--- Readies a box just started for the pool: the lookup of the default
-- account every create makes (two file reads through the agent), once
-- before the VM waits (under TCG the guest's first file reads after a
-- restore are its slowest), then the freeze (its cgroup) until taken.
-- stopping() says whether the daemon began to stop.  Returns true or nil, err.
function M.pool_park(sb, stopping)
  if stopping() then return true end
  sb:account("user")
  if stopping() then return true end
  return sb:freeze(true)
end

--- A pooled microVM, thawed, for a create of the default VM shape: its
-- guest memory and vCPUs are the VM's own, so no limit but pids can be
-- met (pids: the guest's cgroup's, set on the taken VM).  boxes: the pool
-- (taken from its head); lim: the create's limits.  Returns a sandbox or
-- nil (none fits: start one).
function M.pool_take(boxes, lim, _, log)
  if lim.memory or lim.cpus or lim.disk then return nil end
  while #boxes > 0 do
    local sb = table.remove(boxes, 1)
    if sb.state == "paused" then
      local ok, err = sb:freeze(false)
      if ok and lim.pids then ok, err = sb:request(MSG.VM_LIMITS, { pids = lim.pids }) end
      if ok then return sb end
      log("%s: %s", M.pool.label, err)
      async.spawn(function() sb:destroy() end)
    end
  end
end

--- Removes the root images whose layers are gone and the snapshots of
-- removed root images (after an image remove or prune).
function M.gc(state_dir)
  return image.gc(state_dir)
end

return M
