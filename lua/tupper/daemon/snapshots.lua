--- Filesystem snapshots and fork (docs/snapshots.md).  Methods of the
-- daemon (daemon/main.lua mixes them in).
--
-- A snapshot is a read-only layer of the layer store (<state>/layers/<key>,
-- layer.json kind "snapshot") plus a record, <state>/snapshots/<id>.json,
-- naming it and what a sandbox made from it starts with (image, env, cwd,
-- user, limits, network rules, policy).  The layer is a copy of the box's
-- whole root as its processes saw it, taken while the box is frozen
-- (cgroup freezer): `cp -ax` of /proc/<agent>/root, which stays on the
-- overlay (not /proc, /sys, /dev or other mounts).  A sandbox made from it
-- has that single layer as its lower dir and a fresh upper dir.
--
-- Order on disk, so that a daemon killed at any point leaves no half
-- snapshot visible: the copy goes to a tmp-* dir of the layer store (swept
-- at the next start), is renamed into place as a layer, and only then is
-- the record written (tmp file + rename).  A layer of kind "snapshot" that
-- no record names is the leftover of a killed snapshot: removed at start.
--
-- On the btrfs pool (daemon/disk_pool.lua), a box's upper dir is a
-- subvolume: its snapshot is a read-only subvolume snapshot of it,
-- <pool>/snaps/<key> (record field pool_snap), taken while the box is frozen
-- (after syncfs), O(1) in what the box wrote.  Its upper/ is the top lower
-- dir of a sandbox made from it, above the box's own lower dirs (record
-- field lowers), whose image the snapshot pins in the image store.  Made as
-- snaps/.tmp-<key> and renamed, then the record: a daemon killed before the
-- rename leaves a .tmp-* subvolume, one killed before the record a
-- snapshot no record names; both are removed at the next start.
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")
local async = require("tupper.util.async")
local records = require("tupper.daemon.records")
local log = require("tupper.daemon.log").log
local layers = require("tupper.image.layers")

local D = {}

D.FORK_MAX = 64 -- sandboxes one sandbox.fork makes at most
D.SNAPSHOT_NAME_MAX = 128
-- bytes of one snapshot record: its env, metadata and policy came in a
-- request line of at most 16 MiB (wire/rpc.lua MAX_LINE), a policy file is
-- at most 1 MiB before JSON escapes; twice a request line bounds them all
D.SNAPSHOT_RECORD_MAX = 32 * 1024 * 1024
D.LAYERS_MAX = 128 -- lower dirs of one box (TP_LAYERS_MAX, backends/linux/linux.h)

local CP = "/usr/bin/cp"
-- the copy dies with the daemon: an orphan cp of a SIGKILLed daemon would
-- go on writing into the tmp-* dir the next daemon's start removes, and
-- leave it half removed (util-linux's setpriv, Essential on Debian)
local SETPRIV = "/usr/bin/setpriv"
local DU = "/usr/bin/du"

-- A snapshot name: printable, no '/' or "..", not an id's shape clash
-- (names and ids share one lookup: a name may not look like an id).
local function check_name(name)
  if name == nil then return true end
  if type(name) ~= "string" or #name == 0 then return nil, "a snapshot name must be a non-empty string" end
  if #name > D.SNAPSHOT_NAME_MAX then
    return nil, ("a snapshot name is at most %d bytes"):format(D.SNAPSHOT_NAME_MAX)
  end
  if name:find("[%z\1-\31\127]") then return nil, "a snapshot name may not hold NUL or control characters" end
  if name:find("/", 1, true) then return nil, "a snapshot name may not hold '/'" end
  if name:find("..", 1, true) or name == "." then return nil, "a snapshot name may not hold '..' or be '.'" end
  if not utf8.len(name) then return nil, "a snapshot name must be valid UTF-8" end
  if name:match("^s%x+$") and #name == 13 then return nil, "a snapshot name may not look like a snapshot id" end
  return true
end
D.check_snapshot_name = check_name

-- Snapshot and box records are written atomically (daemon/records.lua).
local write_atomic = records.write

--- Loads the snapshot records and removes what a killed snapshot left:
-- record temp files, and snapshot layers that no record names.
function D:_snapshots_open()
  self.snapdir = self.state .. "/snapshots"
  local ok, err, ename = uv.fs_mkdir(self.snapdir, tonumber("700", 8))
  if not ok and ename ~= "EEXIST" then return nil, err end
  self.snapshots = {}
  local h = uv.fs_scandir(self.snapdir)
  while h do
    local name = uv.fs_scandir_next(h)
    if not name then break end
    local path = self.snapdir .. "/" .. name
    local id = name:match("^(s%x+)%.json$")
    local rec = id and records.load(path, D.SNAPSHOT_RECORD_MAX)
    if rec and rec.id == id and layers.valid_key(rec.pool_snap) and
        type(rec.lowers) == "table" then
      -- kept while the pool is off: it serves again once the pool is back
      if not self.disk_pool or core.pool_is_subvol(self:_pool_snap_dir(rec)) == 2 then
        self.snapshots[id] = rec
      else
        log("removing snapshot %s: its subvolume is gone", id)
        uv.fs_unlink(path)
      end
    elseif rec and rec.id == id and self.layer_store:get(rec.layer or "") then
      self.snapshots[id] = rec
    else
      log("removing stale snapshot file %s", name)
      uv.fs_unlink(path)
    end
  end
  local used = {}
  for _, rec in pairs(self.snapshots) do used[rec.layer or rec.pool_snap] = true end
  if self.disk_pool then
    h = uv.fs_scandir(self.disk_pool.dir .. "/snaps")
    while h do
      local name = uv.fs_scandir_next(h)
      if not name then break end
      if not used[name] and not name:match("^%.tmp%-") then
        log("removing pool snapshot %s that no snapshot names (a snapshot cut short)", name:sub(1, 12))
        local ok, err = async.wait(function(cb)
          local qok, qerr = core.pool_drop(self.disk_pool.dir, "snaps", name, cb)
          if not qok then cb(nil, qerr) end
        end)
        if not ok then log("pool snapshot %s: %s", name:sub(1, 12), tostring(err)) end
      end
    end
  end
  h = uv.fs_scandir(self.layer_store.dir)
  while h do
    local name = uv.fs_scandir_next(h)
    if not name then break end
    local l = self.layer_store:get(name)
    if l and l.info.kind == "snapshot" and not used[name] then
      log("removing snapshot layer %s that no snapshot names (a snapshot cut short)", name:sub(1, 12))
      self.layer_store:discard(self.layer_store.dir .. "/" .. name)
    end
  end
  return true
end

--- The snapshot an id or a name stands for, or nil, message.
function D:snapshot_find(ref)
  if type(ref) ~= "string" then return nil, "no snapshot" end
  local rec = self.snapshots[ref]
  if rec then return rec end
  for _, r in pairs(self.snapshots) do
    for _, n in ipairs(r.names or {}) do
      if n == ref then return r end
    end
  end
  return nil, ("no snapshot '%s'"):format(ref)
end

-- What a client sees of a snapshot.
function D:snapshot_info(rec)
  local users = {}
  for _, id in ipairs(self:_snapshot_users(rec)) do
    if self.sandboxes[id] then users[#users + 1] = id end
  end
  return { id = rec.id, names = rec.names or {}, sandbox = rec.sandbox, image = rec.image,
           created_at = rec.created_at, size = rec.size or 0, sandboxes = users }
end

-- The dir of a pool snapshot (record field pool_snap), and its lower dir.
function D:_pool_snap_dir(rec)
  return (self.disk_pool and self.disk_pool.dir or self.state .. "/pool") .. "/snaps/" .. rec.pool_snap
end

-- The lower dir a snapshot adds to the sandboxes made from it.
function D:_snapshot_top(rec)
  if rec.pool_snap then return self:_pool_snap_dir(rec) .. "/upper" end
  return self.layer_store.dir .. "/" .. rec.layer .. "/fs"
end

-- The sandboxes (live or being made) whose rootfs has the snapshot's
-- layer, and the pool snapshots stacked on it.
function D:_snapshot_users(rec)
  local path = self:_snapshot_top(rec)
  local out = {}
  for id, r in pairs(self.snapshots) do
    for _, l in ipairs(r.lowers or {}) do
      if l == path then out[#out + 1] = "(snapshot " .. id .. ")"; break end
    end
  end
  for id, sb in pairs(self.sandboxes) do
    for _, l in ipairs(sb.layers or {}) do
      if l == path then out[#out + 1] = id; break end
    end
  end
  for _, pool in ipairs(self.pools or {}) do
    for _, sb in ipairs(pool.boxes) do
      for _, l in ipairs(sb.layers or {}) do
        if l == path then out[#out + 1] = sb.id; break end
      end
    end
  end
  if (self.snapshot_starting or {})[rec.id] then out[#out + 1] = "(a create from it)" end
  table.sort(out)
  return out
end

-- Runs argv (a host tool, absolute path first) without blocking the loop;
-- returns its stdout (first 64 KiB) or nil, message with its stderr.
local function spawn(argv)
  return async.wait(function(cb)
    local outp, errp = uv.new_pipe(false), uv.new_pipe(false)
    local out, msg, code = {}, {}, nil
    local pending = 3
    local function done()
      pending = pending - 1
      if pending > 0 then return end
      if code == 0 then return cb(table.concat(out)) end
      cb(nil, ("%s exited %s: %s"):format(argv[1], tostring(code), table.concat(msg):sub(1, 400)))
    end
    local args = {}
    for k = 2, #argv do args[#args + 1] = argv[k] end
    local handle, perr
    handle, perr = uv.spawn(argv[1], { args = args, stdio = { nil, outp, errp } },
      function(c)
        code = c
        handle:close()
        done()
      end)
    if not handle then
      outp:close(); errp:close()
      return cb(nil, "run " .. argv[1] .. ": " .. tostring(perr))
    end
    local function reader(pipe, acc)
      pipe:read_start(function(err, data)
        if err or not data then pipe:close(); return done() end
        if #acc < 16 then acc[#acc + 1] = data end
      end)
    end
    reader(outp, out)
    reader(errp, msg)
  end)
end

-- Copies the tree at src into dst (made here): owners, modes, times,
-- links, xattrs; one filesystem only.
local function copy_tree(src, dst)
  local ok, err = spawn({ SETPRIV, "--pdeathsig", "KILL", "--", CP, "-ax", "--reflink=auto", "--", src .. "/.", dst })
  if not ok then return nil, err end
  return true
end

-- The apparent size of a tree, in bytes (0 when du fails).
local function du(path)
  local out = spawn({ DU, "-sb", "--", path })
  return out and math.tointeger(tonumber(out:match("^(%d+)"))) or 0
end

-- The pool dir when sb's upper dir is a subvolume on it and a sandbox made
-- from its snapshot still fits the layer limit; else nil (a copy).
function D:_snapshot_on_pool(sb)
  local pool = self.disk_pool and self.disk_pool.dir
  if not pool or #(sb.layers or {}) + 1 > D.LAYERS_MAX then return nil end
  if core.pool_is_subvol(pool .. "/boxes/" .. sb.id) ~= 1 then return nil end
  return pool
end

--- Takes a filesystem snapshot of sandbox sb (running or paused), named
-- name (optional); extra: fields for its record (a pause to disk's
-- pause_of, daemon/pause.lua).  Returns the snapshot record or nil, message.
function D:snapshot_sandbox(sb, name, extra)
  local ok, err = check_name(name)
  if not ok then return nil, err end
  if name and self:snapshot_find(name) then return nil, ("a snapshot is already named '%s'"):format(name) end
  -- a backend with memory snapshots (a microVM): daemon/vmsnap.lua
  if sb.impl and sb.impl.save_memory then return self:_vm_snapshot(sb, name, extra) end
  if not sb.impl or sb.backend ~= "linux" then
    return nil, ("snapshots are made of linux-backend sandboxes only (this one is %s)"):format(tostring(sb.backend))
  end
  if sb.snapshotting then return nil, ("sandbox '%s' is being snapshotted already"):format(sb.id) end
  if not sb.box:has_cgroup() then
    return nil, "a snapshot needs the cgroup freezer, which this daemon has not got"
  end
  if not sb.pid then return nil, "the sandbox's agent pid is unknown" end
  -- a pause or resume in flight ends first (its box's state is known after)
  sb:freeze_wait()
  if sb.snapshotting then return nil, ("sandbox '%s' is being snapshotted already"):format(sb.id) end
  if sb.state ~= "running" and sb.state ~= "paused" then return nil, ("sandbox '%s' was killed"):format(sb.id) end
  sb.snapshotting = true
  local froze = sb.state == "running"
  if froze then
    -- recorded as paused while frozen: a daemon killed mid-snapshot leaves
    -- a frozen box that the next one re-adopts as paused (resume thaws it)
    local r = sb:record()
    r.paused = true
    write_atomic(self.boxes .. "/" .. sb.id .. ".json", json.encode(r))
    ok, err = sb:gated_freeze(true, function() sb.snapshot_frozen = true end)
    if not ok then
      self:save(sb)
      sb.snapshotting = nil
      return nil, "freeze the sandbox: " .. tostring(err)
    end
  end
  -- on the pool: a subvolume snapshot of the box's upper dir (O(1)), with
  -- a key of its own; else a copy of its root into the layer store
  local pool = self:_snapshot_on_pool(sb)
  local key = core.sha256("tupper-snapshot\0" .. sb.id .. "\0" .. core.random_hex(16))
  local tmp, terr
  if pool then
    ok, err = async.wait(function(cb)
      local qok, qerr = core.pool_snapshot(pool, sb.id, key, cb)
      if not qok then cb(nil, qerr) end
    end)
  else
    tmp, terr = self.layer_store:tmp()
    if tmp then
      ok, err = copy_tree(("/proc/%d/root"):format(sb.pid), tmp .. "/fs")
    else
      ok, err = nil, terr
    end
  end
  -- what a failure from here on drops: the copy, or the pool snapshot
  local function discard()
    if not pool then return self.layer_store:discard(tmp) end
    if not ok then return end
    local dok, derr = async.wait(function(cb)
      local qok, qerr = core.pool_drop(pool, "snaps", key, cb)
      if not qok then cb(nil, qerr) end
    end)
    if not dok then log("snapshot of %s: drop its subvolume: %s", sb.id, tostring(derr)) end
  end
  -- thawed unless it was paused before, or got paused meanwhile, or died
  if froze and sb.state == "running" then
    sb:gated_freeze(false, function() sb.snapshot_frozen = nil end)
    self:save(sb)
  end
  sb.snapshot_frozen = nil
  sb.snapshotting = nil
  if not ok then
    discard()
    return nil, "snapshot: " .. tostring(err)
  end
  if self.stopping then
    discard()
    return nil, "the daemon is shutting down"
  end
  if sb.state ~= "running" and sb.state ~= "paused" then
    discard()
    return nil, ("sandbox '%s' went away during its snapshot"):format(sb.id)
  end
  -- the bytes the snapshot holds of its own: the box's files (a copy), or
  -- what the box wrote over its lower dirs (a pool snapshot)
  local size = du(pool and (pool .. "/snaps/" .. key .. "/upper") or (tmp .. "/fs"))
  -- from here on nothing yields until the record is in self.snapshots
  if name and self:snapshot_find(name) then -- taken by another snapshot meanwhile
    discard()
    return nil, ("a snapshot is already named '%s'"):format(name)
  end
  local id
  repeat id = "s" .. core.random_hex(6) until not self.snapshots[id]
  local lowers
  if pool then
    lowers = {}
    for i, l in ipairs(sb.layers or {}) do lowers[i] = l end
    -- the image's layers stay in the image store while the snapshot lives
    if sb.image_digest and self.images then
      local pok, perr = self.images:pin(sb.image_digest, "snapshot " .. id)
      if not pok then
        discard()
        return nil, "snapshot: pin its image: " .. tostring(perr)
      end
    end
  else
    local layer, cerr = self.layer_store:commit(tmp, key, { kind = "snapshot", snapshot = id, sandbox = sb.id })
    if not layer then return nil, "snapshot: " .. tostring(cerr) end
  end
  local rec = {
    id = id, names = name and { name } or {}, layer = not pool and key or nil, sandbox = sb.id,
    pool_snap = pool and key or nil, lowers = lowers,
    created_at = os.date("!%Y-%m-%dT%H:%M:%SZ"), size = size,
    image = sb.image, image_digest = sb.image_digest, backend = sb.backend,
    env = sb.env, cwd = sb.cwd, workdir = sb.workdir, user = sb.user, cred = sb.cred,
    default_user = sb.default_user, home = sb.home, limits = sb.limits,
    network = sb.network, policy = sb.policy_source, metadata = sb.metadata,
  }
  for k, v in pairs(extra or {}) do rec[k] = v end
  local wok, werr = write_atomic(self.snapdir .. "/" .. id .. ".json", json.encode(rec))
  if not wok then
    if pool then
      if sb.image_digest and self.images then self.images:unpin(sb.image_digest, "snapshot " .. id) end
      discard()
    else
      self.layer_store:discard(self.layer_store.dir .. "/" .. key)
    end
    return nil, "snapshot: write its record: " .. tostring(werr)
  end
  self.snapshots[id] = rec
  log("snapshot %s of sandbox %s (%d bytes, %s)", id, sb.id, size, pool and "a subvolume snapshot" or "a copy")
  return rec
end

--- Deletes a snapshot (by id or name); refused while a sandbox uses it.
function D:snapshot_delete(ref)
  local rec, err = self:snapshot_find(ref)
  if not rec then return nil, err, "not_found" end
  local users = self:_snapshot_users(rec)
  if #users > 0 then
    return nil, ("snapshot '%s' is in use by sandbox %s"):format(rec.id, table.concat(users, ", ")), "busy"
  end
  -- the record first: a daemon killed between the two leaves an unnamed
  -- snapshot layer, which the next start removes
  uv.fs_unlink(self.snapdir .. "/" .. rec.id .. ".json")
  self.snapshots[rec.id] = nil
  if rec.pool_snap then
    -- a killed daemon leaves the subvolume, which the next start removes
    if rec.image_digest and self.images then self.images:unpin(rec.image_digest, "snapshot " .. rec.id) end
    if self.disk_pool then
      local ok, derr = async.wait(function(cb)
        local qok, qerr = core.pool_drop(self.disk_pool.dir, "snaps", rec.pool_snap, cb)
        if not qok then cb(nil, qerr) end
      end)
      if not ok then log("snapshot %s: %s", rec.id, tostring(derr)) end
    end
  else
    -- a microVM's memory snapshot holds its image's layers too
    if rec.vm and rec.image_digest and self.images then self.images:unpin(rec.image_digest, "snapshot " .. rec.id) end
    self.layer_store:discard(self.layer_store.dir .. "/" .. rec.layer)
  end
  log("snapshot %s deleted", rec.id)
  return true
end

--- The create params of a sandbox made from snapshot rec, under the
-- request's own (p): its image name, env, cwd, limits, network rules.
function D:_snapshot_params(rec, p)
  local q = {}
  for k, v in pairs(p) do q[k] = v end
  q.snapshot = nil
  local env = {}
  for k, v in pairs(rec.env or {}) do env[k] = v end
  for k, v in pairs(p.env or {}) do env[k] = v end
  q.env = env
  q.cwd = p.cwd or rec.workdir
  local lim = {}
  for k, v in pairs(rec.limits or {}) do lim[k] = v end
  for k, v in pairs(p.limits or {}) do lim[k] = v end
  q.limits = lim
  if p.network == nil then q.network = rec.network end
  if p.metadata == nil then q.metadata = rec.metadata end
  return q
end

--- The image a create from a snapshot uses: its single layer, and the
-- settings the snapshotted sandbox had (apply_image in daemon/create.lua
-- reads them as an image's config).
function D:_snapshot_image(rec)
  local layers
  if rec.pool_snap then
    if not self.disk_pool then
      return nil, ("snapshot '%s' is on the btrfs disk pool, which this daemon has not mounted (%s)"):format(
        rec.id, tostring(self.disk_pool_off))
    end
    layers = {}
    for i, l in ipairs(rec.lowers) do
      if type(l) ~= "string" or not uv.fs_stat(l) then
        return nil, ("snapshot '%s' has lost lower dir %d"):format(rec.id, i)
      end
      layers[i] = l
    end
    layers[#layers + 1] = self:_snapshot_top(rec)
  else
    local l = self.layer_store:get(rec.layer)
    if not l then return nil, ("snapshot '%s' has lost its layer"):format(rec.id) end
    layers = { l.fs }
  end
  local env = {}
  for k, v in pairs(rec.env or {}) do env[#env + 1] = k .. "=" .. v end
  table.sort(env)
  return { ref = rec.image, digest = rec.image_digest, layers = layers, snapshot = rec.id,
           cred = rec.cred, config = { env = env, workdir = rec.cwd or "", user = rec.user } }
end

--- fork: one snapshot of sb, then count sandboxes from it.  Returns the
-- snapshot record and the list of new sandboxes, or nil, message, data.
function D:fork_sandbox(sb, count, params)
  if math.type(count) ~= "integer" or count < 1 or count > D.FORK_MAX then
    return nil, ("a fork count is 1 to %d"):format(D.FORK_MAX)
  end
  local live = 0
  for _ in pairs(self.sandboxes) do live = live + 1 end
  for _ in pairs(self.creating) do live = live + 1 end
  local cap = self.caps.sandboxes
  if cap > 0 and live + count > cap then
    return nil, ("a fork of %d would make %d sandboxes, over the daemon's cap of %d"):format(
      count, live + count, cap)
  end
  local rec, err = self:snapshot_sandbox(sb, params and params.name)
  if not rec then return nil, err end
  self.snapshot_starting = self.snapshot_starting or {}
  self.snapshot_starting[rec.id] = (self.snapshot_starting[rec.id] or 0) + 1
  local made = {}
  for _ = 1, count do
    local p = { snapshot = rec.id, _policy = sb.policy, _policy_source = sb.policy_source,
                kill_on_disconnect = params and params.kill_on_disconnect }
    local child, cerr, cdata = self:create_sandbox(p)
    if not child then
      err = ("fork %d of %d: %s"):format(#made + 1, count, tostring(cerr))
      for _, c in ipairs(made) do self:kill_sandbox(c.id) end
      self.snapshot_starting[rec.id] = nil
      self:snapshot_delete(rec.id)
      return nil, err, cdata
    end
    made[#made + 1] = child
  end
  self.snapshot_starting[rec.id] = nil
  return rec, made
end

return D
