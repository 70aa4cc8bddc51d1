--- microVM memory snapshots (docs/snapshots.md, "microVM memory snapshots
-- and fork"): sandbox.snapshot and fork of a microvm-backend sandbox keep
-- its memory, devices and disk, and a sandbox made from one resumes every
-- process it had.  Methods of the daemon (daemon/main.lua mixes them in).
--
-- The snapshot is a layer of the layer store like a filesystem snapshot
-- (kind "snapshot", the same crash-safe order: a tmp-* dir, renamed into
-- place, then the record), whose fs/ holds the VM's files instead of a
-- tree: vm.state (the migration stream: device state and guest memory),
-- rw.ext4 (the writable disk as it was), vm.json (its shape).  The record
-- says vm = true and keeps the image layers the VM ran on (its root image).
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")
local log = require("tupper.daemon.log").log
local records = require("tupper.daemon.records") -- temp file, fsync, rename, fsync of the dir

local D = {}

local function du(path)
  local total = 0
  for _, f in ipairs({ "vm.state", "rw.ext4" }) do
    local st = uv.fs_stat(path .. "/" .. f)
    -- the blocks it holds (the disk copy is sparse)
    if st then total = total + (st.blocks or 0) * 512 end
  end
  return total
end

--- Takes a memory snapshot of microVM sandbox sb (running or paused),
-- named name (optional); extra: fields for its record.  leave_stopped:
-- the guest stays stopped after (a pause to disk, which removes the VM
-- next; cont with _vm_cont otherwise).  Returns the record or nil, message.
function D:_vm_snapshot(sb, name, extra, leave_stopped)
  local ok, err = self.check_snapshot_name(name)
  if not ok then return nil, err end
  if name and self:snapshot_find(name) then return nil, ("a snapshot is already named '%s'"):format(name) end
  if sb.snapshotting then return nil, ("sandbox '%s' is being snapshotted already"):format(sb.id) end
  if not sb.impl.save_memory then return nil, "this backend has no memory snapshots" end
  if not sb.box.qmp then
    return nil, "this microVM has no monitor (re-adopted after a daemon crash, its monitor socket did not answer): it cannot be snapshotted"
  end
  sb.snapshotting = true
  local was_paused = sb.state == "paused"
  -- a frozen QEMU answers no monitor command: thawed, the guest is
  -- stopped by QMP at once
  if was_paused then
    ok, err = sb:gated_freeze(false)
    if not ok then sb.snapshotting = nil; return nil, "thaw the VM: " .. tostring(err) end
  end
  local tmp, terr = self.layer_store:tmp()
  if tmp then
    ok, err = uv.fs_mkdir(tmp .. "/fs", tonumber("700", 8))
    if ok then ok, err = sb.impl.save_memory(sb.box, tmp .. "/fs") end
  else
    ok, err = nil, terr
  end
  local function back()
    -- as before the snapshot: running, or paused (frozen again)
    if leave_stopped and ok then return end
    if sb.state ~= "running" and sb.state ~= "paused" then return end
    sb.impl.cont(sb.box)
    if was_paused or sb.state == "paused" then sb:gated_freeze(true) end
  end
  back()
  sb.snapshotting = nil
  if not ok then
    self.layer_store:discard(tmp)
    return nil, "snapshot: " .. tostring(err)
  end
  if self.stopping or (sb.state ~= "running" and sb.state ~= "paused") then
    self.layer_store:discard(tmp)
    return nil, ("sandbox '%s' went away during its snapshot"):format(sb.id)
  end
  local size = du(tmp .. "/fs")
  if name and self:snapshot_find(name) then
    self.layer_store:discard(tmp)
    return nil, ("a snapshot is already named '%s'"):format(name)
  end
  local id
  repeat id = "s" .. core.random_hex(6) until not self.snapshots[id]
  local key = core.sha256("tupper-snapshot\0" .. id .. "\0" .. core.random_hex(16))
  local layer, cerr = self.layer_store:commit(tmp, key, { kind = "snapshot", snapshot = id, sandbox = sb.id, vm = true })
  if not layer then return nil, "snapshot: " .. tostring(cerr) end
  -- a create from it runs on the image's layers (rec.layers): they stay in
  -- the image store while the snapshot lives (an image remove or prune
  -- leaves them; snapshot_delete and the start's sweep unpin)
  local pinned = false
  if sb.image_digest and self.images then
    local pok, perr = self.images:pin(sb.image_digest, "snapshot " .. id)
    if not pok then
      self.layer_store:discard(layer.fs:sub(1, -4))
      return nil, "snapshot: pin its image: " .. tostring(perr)
    end
    pinned = true
  end
  local rec = {
    id = id, names = name and { name } or {}, layer = key, sandbox = sb.id, vm = true,
    created_at = os.date("!%Y-%m-%dT%H:%M:%SZ"), size = size,
    image = sb.image, image_digest = sb.image_digest, backend = sb.backend, layers = sb.layers,
    env = sb.env, cwd = sb.cwd, workdir = sb.workdir, user = sb.user, cred = sb.cred,
    default_user = sb.default_user, home = sb.home, limits = sb.limits,
    network = sb.network, policy = sb.policy_source, metadata = sb.metadata,
  }
  for k, v in pairs(extra or {}) do rec[k] = v end
  local wok, werr = records.write(self.snapdir .. "/" .. id .. ".json", json.encode(rec))
  if not wok then
    if pinned then self.images:unpin(sb.image_digest, "snapshot " .. id) end
    self.layer_store:discard(layer.fs:sub(1, -4))
    return nil, "snapshot: write its record: " .. tostring(werr)
  end
  self.snapshots[id] = rec
  log("memory snapshot %s of microVM sandbox %s (%d bytes)", id, sb.id, size)
  return rec
end

--- Lets a VM that _vm_snapshot left stopped run on (paused: frozen again).
function D:_vm_cont(sb)
  local ok, err = sb.impl.cont(sb.box)
  if ok and sb.state == "paused" then ok, err = sb:gated_freeze(true) end
  return ok, err
end

--- The image a create from a memory snapshot uses: the image layers the
-- VM ran on, and its memory snapshot's dir (vm_state), with the settings
-- the sandbox had.
function D:_vm_snapshot_image(rec)
  local l = self.layer_store:get(rec.layer)
  if not l then return nil, ("snapshot '%s' has lost its layer"):format(rec.id) end
  if type(rec.layers) ~= "table" or #rec.layers == 0 then
    return nil, ("snapshot '%s' does not name its image layers"):format(rec.id)
  end
  local env = {}
  for k, v in pairs(rec.env or {}) do env[#env + 1] = k .. "=" .. v end
  table.sort(env)
  return { ref = rec.image, digest = rec.image_digest, layers = rec.layers, snapshot = rec.id, vm_state = l.fs,
           cred = rec.cred, config = { env = env, workdir = rec.cwd or "", user = rec.user } }
end

return D
