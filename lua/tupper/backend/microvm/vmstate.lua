--- A running microVM's memory snapshot (docs/microvm.md, "Memory
-- snapshots and fork"): its device state and guest memory in one
-- migration stream (vm.state), its writable disk as it was (rw.ext4) and
-- its shape (vm.json), in a directory the daemon chose.  VMs started from
-- it resume every process the VM had.  Call from a coroutine.
local uv = require("luv")
local json = require("cjson")
local core = require("tupper.core")
local qmp = require("tupper.backend.microvm.qmp")

local M = {}

M.FORMAT = 1
M.JSON_MAX = 4096
M.MIGRATE_TIMEOUT_MS = 600000 -- the whole guest memory, under TCG on a loaded host

-- The memory of a VM started from the start snapshot is a private
-- mapping, not shared: its pages are in the stream.  x-ignore-shared is
-- set off explicitly (such a VM had it on for its own restore), and a VM
-- started from this stream has it off too: the format depends on it.
local NO_IGNORE_SHARED = { capabilities = { { capability = "x-ignore-shared", state = false } } }

--- Saves the VM of box w (its QMP client w.qmp, its shape w.shape, its
-- writable disk w.rw) into dir (exists, the daemon's): QMP stop (QEMU
-- flushes the disks), the migration into dir/vm.state, a sparse copy of
-- the disk, vm.json.  The guest stays stopped: cont() or destroy after.
-- QEMU must not be frozen (the caller thaws its cgroup first).  Returns
-- true or nil, err.
function M.save(w, dir)
  local q = w.qmp
  if not q or q.closed then
    return nil, "this microVM has no monitor (re-adopted after a daemon crash, its monitor socket did not answer): it cannot be snapshotted"
  end
  if not w.shape or not w.rw then return nil, "this microVM's shape is unknown" end
  local r, err = q.cmd("stop")
  if r then r, err = q.cmd("migrate-set-capabilities", NO_IGNORE_SHARED) end
  if r then
    local sfd, oerr = uv.fs_open(dir .. "/vm.state", "w", 384)
    if not sfd then return nil, "create vm.state: " .. tostring(oerr) end
    -- QMP takes a file only by getfd: the daemon opens it, QEMU receives it
    r, err = q.cmd("getfd", { fdname = "vmstate" }, sfd)
    uv.fs_close(sfd)
  end
  if r then r, err = q.cmd("migrate", { uri = "fd:vmstate" }) end
  if r then
    r, err = qmp.until_ready(q, "query-migrate", function(m)
      if m.status == "completed" then return true end
      if m.status == "failed" or m.status == "cancelled" then
        return false, "migration " .. m.status .. (m["error-desc"] and (": " .. tostring(m["error-desc"])) or "")
      end
    end, M.MIGRATE_TIMEOUT_MS, 20)
  end
  if not r then return nil, "save the VM: " .. tostring(err) end
  local cok, cerr = core.vm_copy_sparse(w.rw, dir .. "/rw.ext4")
  if not cok then return nil, "copy the VM's disk: " .. tostring(cerr) end
  local fd = uv.fs_open(dir .. "/vm.json", "w", 384)
  if not fd then return nil, "create vm.json" end
  local sh = w.shape
  local ok, werr = uv.fs_write(fd, json.encode({ format = M.FORMAT, mem = sh.mem, cpus = sh.cpus, disk = sh.disk,
    accel = sh.accel, root_id = sh.root_id, ram = sh.ram }))
  if ok then ok, werr = uv.fs_fsync(fd) end
  uv.fs_close(fd)
  if not ok then return nil, "write vm.json: " .. tostring(werr) end
  for _, f in ipairs({ "vm.state", "rw.ext4" }) do
    local ffd = uv.fs_open(dir .. "/" .. f, "r", 0)
    if ffd then uv.fs_fsync(ffd); uv.fs_close(ffd) end
  end
  return true
end

--- Lets a VM that save() stopped run on.  Returns true or nil, err.
function M.cont(w)
  if not w.qmp or w.qmp.closed then return nil, "no monitor" end
  return w.qmp.cmd("cont")
end

--- The shape a memory snapshot in dir was made with (vm.json), checked:
-- { mem, cpus, disk, accel, root_id, ram } or nil, err.
function M.shape(dir)
  local fd = uv.fs_open(dir .. "/vm.json", "r", 0)
  if not fd then return nil, "the memory snapshot has no vm.json" end
  local text = uv.fs_read(fd, M.JSON_MAX, 0)
  uv.fs_close(fd)
  local ok, v = pcall(json.decode, text or "")
  if not ok or type(v) ~= "table" or v.format ~= M.FORMAT then return nil, "the memory snapshot's vm.json is unreadable" end
  return M.check_shape(v)
end

--- A VM's shape from hostile input (vm.json, a sandbox's record), checked:
-- { mem, cpus, disk, accel, root_id, ram } or nil, err.
function M.check_shape(v)
  if type(v) ~= "table" then return nil, "no VM shape" end
  local function int(x, lo, hi)
    x = math.tointeger(x)
    return x and x >= lo and x <= hi and x or nil
  end
  local sh = { mem = int(v.mem, 1048576, 1 << 40), cpus = int(v.cpus, 1, 64), disk = int(v.disk, 1048576, 1 << 44),
               accel = (v.accel == "kvm" or v.accel == "tcg") and v.accel or nil,
               root_id = type(v.root_id) == "string" and #v.root_id <= 256 and v.root_id or nil,
               ram = (v.ram == "memfd" or v.ram == "anon") and v.ram or nil }
  for _, k in ipairs({ "mem", "cpus", "disk", "accel", "root_id", "ram" }) do
    if sh[k] == nil then return nil, "the memory snapshot's vm.json has no valid " .. k end
  end
  return sh
end

return M
