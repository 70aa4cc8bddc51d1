--- Pause that outlives the box (E2B's pause): `sandbox.pause` with
-- keep_memory records enough that a paused sandbox survives a daemon
-- restart and a host reboot (docs/snapshots.md, "Pause to disk").  Methods
-- of the daemon (daemon/main.lua mixes them in).
--
-- On the linux backend the box is frozen (the cgroup freezer), then a
-- filesystem snapshot of it is taken (daemon/snapshots.lua; its record
-- says pause_of = the sandbox), then the sandbox's record is written with
-- `persist = { snapshot = <id> }` (fsync'd).  keep_memory = true keeps the
-- frozen box (its processes and memory, for as long as the host runs);
-- keep_memory = false removes it at once ("parks" it).  A parked sandbox,
-- or one whose box is gone after a reboot, is *dormant*: listed as paused,
-- with no box; resume makes a new box of the same id from the snapshot
-- (its files; no processes).
--
-- Order on disk, so that a daemon killed at any point loses nothing it
-- acknowledged and shows no half state: the snapshot (its own order, see
-- snapshots.lua), then the sandbox's record naming it.  A pause snapshot
-- that no record names is the leftover of a killed pause (or resume): the
-- next start removes it (_pause_sweep).  A dormant record is written before
-- the box it replaces is removed.
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")
local log = require("tupper.daemon.log").log
local records = require("tupper.daemon.records") -- temp file, fsync, rename, fsync of the dir

local D = {}

D.PAUSE_LEFT_MAX = 100 * 366 * 86400 -- seconds of lifetime a record may say are left

local function now_iso() return os.date("!%Y-%m-%dT%H:%M:%SZ") end

-- A sandbox paused to disk whose box is gone (parked, or lost with a
-- reboot): listed and described as paused; resume gives it a box again.
local Dormant = {}
Dormant.__index = Dormant

-- (into: as Sandbox:info's)
function Dormant:info(into)
  local t = into or {}
  t.id, t.image, t.backend, t.state, t.created_at = self.id, self.image, self.backend, "paused", self.created_at
  t.metadata, t.processes, t.limits = self.metadata, 0, self.limits or {}
  t.timeout, t.policy = self.timeout or 0, self.policy_source and self.policy_source.name
  t.recipe, t.default_user, t.home = self.recipe, self.default_user, self.home
  t.workdir, t.network, t.volumes, t.persisted = self.workdir, self.network or "none", nil, true
  t.expires_at = self.expires_at and os.date("!%Y-%m-%dT%H:%M:%SZ", self.expires_at) or nil
  return t
end

function Dormant:record()
  local r = {}
  for k, v in pairs(self.rec) do r[k] = v end
  r.pid, r.vm, r.paused = nil, nil, true
  r.network, r.metadata, r.timeout, r.expires_at = self.network, self.metadata, self.timeout, self.expires_at
  r.persist = self.persist
  return r
end

function Dormant:destroy()
  self.state = "gone"
  return true
end

local function gone(self)
  return nil, ("sandbox '%s' is paused to disk: resume it first"):format(self.id)
end
Dormant.freeze, Dormant.stats, Dormant.request = gone, gone, gone

function Dormant:set_network(spec)
  self.network = spec
  return true
end

-- A dormant sandbox from its record (rec: as Sandbox:record() wrote it,
-- validated by the caller: id, persist), on the layer of snapshot snap.
local function dormant(d, rec, snap, pol)
  local l = d.layer_store:get(snap.layer)
  return setmetatable({
    id = rec.id, rec = rec, dormant = true, state = "paused", persist = rec.persist,
    image = rec.image, image_digest = rec.image_digest, backend = rec.backend or "linux",
    -- what it runs on once resumed: its snapshot's layer, or a microVM
    -- snapshot's image layers
    layers = snap.vm and snap.layers or { l and l.fs or nil }, created_at = rec.created_at, metadata = rec.metadata or {},
    env = rec.env or {}, cwd = rec.cwd or "/", limits = rec.limits, timeout = rec.timeout or 0,
    cred = rec.cred, recipe = rec.recipe, network = rec.network, default_user = rec.default_user,
    home = rec.home, workdir = rec.workdir, policy = pol, policy_source = pol and rec.policy or nil,
    kill_on_disconnect = rec.kill_on_disconnect,
    procs = {}, exited = {}, watches = {},
  }, Dormant)
end

-- The record a sandbox's box/<id>.json holds (as life.lua's save writes it).
local function record_of(sb)
  local rec = sb:record()
  rec.kill_on_disconnect = sb.kill_on_disconnect
  rec.persist, rec.pause_snapshot = sb.persist, sb.pause_snapshot
  return rec
end

function D:_save_durable(sb, rec)
  return records.write(self.boxes .. "/" .. sb.id .. ".json", json.encode(rec or record_of(sb)))
end

-- The start of a pause to disk, on either backend: refused while a
-- snapshot or another pause of sb runs; else sb.pausing is set and a
-- running box is frozen and recorded as paused.  Returns whether it froze
-- the box, or nil, message.
function D:_pause_begin(sb)
  if sb.snapshotting or sb.pausing then
    return nil, ("sandbox '%s' is being snapshotted or paused: try again after"):format(sb.id)
  end
  sb.pausing = true
  if sb.state ~= "running" then return false end
  local ok, err = sb:freeze(true)
  if not ok then sb.pausing = nil; return nil, err end
  self:pause_timeout(sb)
  self:save(sb)
  return true
end

-- A pause to disk that failed: the box _pause_begin froze (froze) runs again.
function D:_pause_undo(sb, froze)
  if froze and sb.state == "paused" and sb:freeze(false) then
    self:resume_timeout(sb)
    self:save(sb)
  end
end

--- Pauses sb to disk (sandbox.pause with keep_memory).  keep_memory: keep
-- the frozen box (its processes come back at resume while the host runs);
-- false: remove it now (its files only).  Returns true or nil, message.
function D:pause_persist(sb, keep_memory)
  if sb.dormant then return true end
  if sb.persist then
    if keep_memory then return true end
    return self:_pause_park(sb) -- paused to disk with memory before: now files only
  end
  if sb.impl.save_memory then return self:_pause_persist_vm(sb, keep_memory) end
  if sb.backend ~= "linux" then
    return nil, ("a pause to disk is not available on the %s backend: pause it in place"):format(
      tostring(sb.backend))
  end
  if sb.volume_mounts and next(sb.volume_mounts) then
    return nil, "a sandbox with volumes cannot be paused to disk (its volumes are not part of its snapshot)"
  end
  local froze, ferr = self:_pause_begin(sb)
  if froze == nil then return nil, ferr end
  local rec, err = self:snapshot_sandbox(sb, nil, { pause_of = sb.id })
  sb.pausing = nil
  if rec and (self.sandboxes[sb.id] ~= sb or sb.state ~= "paused") then
    -- killed or resumed meanwhile: the pause did not happen
    self:snapshot_delete(rec.id)
    return nil, ("sandbox '%s' was killed or resumed during its pause"):format(sb.id)
  end
  if not rec then
    self:_pause_undo(sb, froze)
    return nil, "pause to disk: " .. tostring(err)
  end
  sb.persist = { snapshot = rec.id, left = sb.paused_left, at = now_iso() }
  local ok, werr = self:_save_durable(sb)
  if not ok then
    sb.persist = nil
    self:save(sb)
    self:snapshot_delete(rec.id)
    return nil, "pause to disk: write the record: " .. tostring(werr)
  end
  log("sandbox %s paused to disk (snapshot %s%s)", sb.id, rec.id, keep_memory and ", box kept frozen" or "")
  if not keep_memory then return self:_pause_park(sb) end
  return true
end

-- A microVM's pause to disk: its memory snapshot (daemon/vmsnap.lua), the
-- record, then the VM goes: resume starts it again from its memory, every
-- process as it was.
function D:_pause_persist_vm(sb, keep_memory)
  if keep_memory == false then
    return nil, "a microVM's pause to disk keeps its memory (keep_memory: true); its files alone are not kept apart"
  end
  local froze, ferr = self:_pause_begin(sb)
  if froze == nil then return nil, ferr end
  local function undo() self:_pause_undo(sb, froze) end
  local rec, err = self:_vm_snapshot(sb, nil, { pause_of = sb.id }, true)
  sb.pausing = nil
  if not rec then undo(); return nil, "pause to disk: " .. tostring(err) end
  if self.sandboxes[sb.id] ~= sb or sb.state ~= "paused" then
    self:snapshot_delete(rec.id)
    return nil, ("sandbox '%s' was killed or resumed during its pause"):format(sb.id)
  end
  sb.persist = { snapshot = rec.id, left = sb.paused_left, at = now_iso() }
  local ok, werr = self:_save_durable(sb)
  if not ok then
    sb.persist = nil
    self:_vm_cont(sb)
    undo()
    self:save(sb)
    self:snapshot_delete(rec.id)
    return nil, "pause to disk: write the record: " .. tostring(werr)
  end
  log("microVM sandbox %s paused to disk (memory snapshot %s)", sb.id, rec.id)
  return self:_pause_park(sb)
end

--- Turns a live sandbox paused to disk into a dormant one: its record
-- first (no pid), then its box goes.  Used by a pause without memory, the
-- daemon's shutdown, and a box that died while paused to disk.
function D:_pause_park(sb)
  if sb.dormant or not sb.persist then return true end
  local snap = self.snapshots[sb.persist.snapshot]
  if not snap then return nil, "the pause's snapshot is gone" end
  local rec = record_of(sb)
  -- the snapshot a resumed box ran on (an earlier pause's) goes with the box
  local old = sb.pause_snapshot ~= sb.persist.snapshot and sb.pause_snapshot or nil
  rec.pid, rec.vm, rec.paused, rec.pause_snapshot = nil, nil, true, nil
  local ok, err = self:_save_durable(sb, rec)
  if not ok then return nil, "park the sandbox: " .. tostring(err) end
  local dsb = dormant(self, rec, snap, sb.policy)
  dsb.paused_left = sb.paused_left
  if self.sandboxes[sb.id] == sb then self:_sb_put(sb.id, dsb) end
  local dok, derr = sb:destroy()
  if not dok then log("sandbox %s: remove its box: %s", sb.id, tostring(derr)) end
  self:_pause_drop(old)
  log("sandbox %s parked: paused to disk, its box removed", sb.id)
  return true
end

--- Resumes a sandbox paused to disk.  A live one is thawed and its pause
-- snapshot dropped; a dormant one gets a new box of the same id from its
-- snapshot.  Returns the sandbox (maybe a new object) or nil, message, data.
function D:resume_persisted(sb)
  if not sb.dormant then
    local ok, err = sb:freeze(false)
    if not ok then return nil, err end
    -- a box re-adopted after a crash knows what was left only from the record
    sb.paused_left = sb.paused_left or sb.persist.left
    self:resume_timeout(sb)
    local sid = sb.persist.snapshot
    sb.persist = nil
    self:save(sb) -- the record no longer names the snapshot: then it goes
    self:_pause_drop(sid)
    return sb
  end
  if sb.reviving then return nil, ("sandbox '%s' is being resumed already"):format(sb.id) end
  local snap = self.snapshots[sb.persist.snapshot]
  if not snap then return nil, ("sandbox '%s' has lost its pause snapshot"):format(sb.id) end
  sb.reviving = true
  self.snapshot_starting = self.snapshot_starting or {}
  self.snapshot_starting[snap.id] = (self.snapshot_starting[snap.id] or 0) + 1
  local child, err, data = self:create_sandbox({ snapshot = snap.id, _id = sb.id, backend = sb.backend,
    _policy = sb.policy, _policy_source = sb.policy_source, metadata = sb.metadata, network = sb.network,
    kill_on_disconnect = sb.kill_on_disconnect })
  local n = self.snapshot_starting[snap.id] - 1
  self.snapshot_starting[snap.id] = n > 0 and n or nil
  sb.reviving = nil
  if not child then
    if self.sandboxes[sb.id] == nil and sb.state ~= "gone" then self:_sb_put(sb.id, sb) end
    return nil, "resume: " .. tostring(err), data
  end
  if sb.state == "gone" then -- killed while its box was made
    self:kill_sandbox(child.id)
    return nil, ("sandbox '%s' was killed during its resume"):format(sb.id)
  end
  child.created_at = sb.created_at
  -- a filesystem snapshot is the new box's layer: dropped with the
  -- sandbox; a memory snapshot was loaded and copied: dropped now
  if not snap.vm then child.pause_snapshot = snap.id end
  self:set_timeout(child, sb.persist.left or sb.paused_left or 0) -- also writes the record
  if snap.vm then self:_pause_drop(snap.id) end
  log("sandbox %s resumed from its pause snapshot %s (its files; no processes)", sb.id, snap.id)
  return child
end

-- Deletes a pause snapshot that nothing uses any more (busy: left for
-- the next start's sweep).
function D:_pause_drop(id)
  if not id or not self.snapshots[id] then return end
  local ok, err = self:snapshot_delete(id)
  if not ok then log("pause snapshot %s kept for now: %s", id, tostring(err)) end
end

--- After a sandbox was killed: the pause snapshot it held goes too.
function D:_pause_release(sb)
  self:_pause_drop(sb.persist and sb.persist.snapshot)
  self:_pause_drop(sb.pause_snapshot)
end

-- The pause fields of a record (hostile input): persist and pause_snapshot
-- only when they name a pause snapshot of this sandbox.
function D:_pause_fields(rec, id)
  local function mine(sid)
    local snap = type(sid) == "string" and self.snapshots[sid]
    return snap and snap.pause_of == id and snap or nil
  end
  local persist
  if type(rec.persist) == "table" and mine(rec.persist.snapshot) then
    local left = math.tointeger(rec.persist.left)
    if left and (left <= 0 or left > D.PAUSE_LEFT_MAX) then left = nil end
    persist = { snapshot = rec.persist.snapshot, left = left,
                at = type(rec.persist.at) == "string" and rec.persist.at:sub(1, 32) or nil }
  end
  return persist, mine(rec.pause_snapshot) and rec.pause_snapshot or nil
end

--- A start's re-adoption of a sandbox paused to disk whose box is gone (or
-- could not be re-adopted): its cgroup and box dir go, it stays listed as
-- paused.  rec: its record; persist from _pause_fields; pol: its policy.
function D:_pause_adopt_dormant(rec, persist, pol)
  local id = rec.id
  if self.cgroups then core.cgroup_remove(self.tag .. "-" .. id) end
  local path = self.boxes .. "/" .. id
  if uv.fs_lstat(path) then
    local ok, err = core.rmtree(path)
    if not ok then log("cannot remove %s: %s", path, tostring(err)) end
  end
  rec.persist = persist
  rec.pid, rec.vm, rec.paused = nil, nil, true
  local dsb = dormant(self, rec, self.snapshots[persist.snapshot], pol)
  dsb.paused_left = persist.left
  self:_sb_put(id, dsb)
  self:_save_durable(dsb, dsb:record())
  if rec.expires_at then
    local left = math.tointeger(rec.expires_at) and rec.expires_at - os.time() or 1
    self:set_timeout(dsb, math.max(1, left))
  end
  log("sandbox %s is paused to disk (its box is gone): resume brings it back", id)
  return dsb
end

--- Removes the pause snapshots no sandbox's record names (a pause or a
-- resume cut short), after the re-adoption.  A sandbox that runs on one
-- (a resume whose record was written by the create but not yet again by
-- the resume) takes it as its own.
function D:_pause_sweep()
  for sid, snap in pairs(self.snapshots) do
    if snap.pause_of then
      local sb = self.sandboxes[snap.pause_of]
      local held = sb and ((sb.persist and sb.persist.snapshot == sid) or sb.pause_snapshot == sid)
      if sb and not held then
        local l = self.layer_store:get(snap.layer)
        for _, p in ipairs(sb.layers or {}) do
          if l and p == l.fs then
            sb.pause_snapshot, held = sid, true
            self:save(sb)
            break
          end
        end
      end
      if not held then
        log("removing pause snapshot %s that no sandbox names (a pause cut short)", sid)
        self:_pause_drop(sid)
      end
    end
  end
end

return D
