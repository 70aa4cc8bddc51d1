--- A daemon's start after a crash: re-adopts the boxes the previous one
-- left whole and removes what else it left.  Methods of the daemon
-- (daemon/main.lua mixes them in).
local uv = require("luv")
local async = require("tupper.util.async")
local core = require("tupper.core")
local json = require("tupper.util.json")
local sandbox = require("tupper.daemon.sandbox")
local guard = require("tupper.recipe.guard")
local backends = require("tupper.backend.registry")
local log = require("tupper.daemon.log").log

local D = {}

local function read_json(path)
  local fd = uv.fs_open(path, "r", 0)
  if not fd then return nil end
  local st = uv.fs_fstat(fd)
  local text = st and st.size < 4194304 and uv.fs_read(fd, st.size, 0)
  uv.fs_close(fd)
  return text and json.decode(text)
end

-- One record of boxes/ (name, for box id): re-adopted into
-- self.sandboxes, or removed; a kill_on_disconnect box joins doomed.
function D:_recover_one(id, name, doomed)
  local rec = read_json(self.boxes .. "/" .. name)
  local sb, err, pol
  if type(rec) == "table" and type(rec.policy) == "table" then
    -- the sandbox's policy binds it after a crash too: one that no
    -- longer loads means no re-adoption (fail closed)
    pol, err = guard.load_client_policy(rec.policy)
    if not pol then rec = nil end
  end
  local backend = type(rec) == "table" and rec.backend or nil
  -- a pause to disk (daemon/pause.lua): its snapshot, if it names one
  -- of this sandbox's
  local persist, held
  if type(rec) == "table" and rec.id == id then persist, held = self:_pause_fields(rec, id) end
  if backend ~= nil and not backends.known(backend) then
    err = "unknown backend"
  elseif type(rec) == "table" and rec.id == id and math.tointeger(rec.pid) then
    sb, err = sandbox.adopt({ id = id, image = rec.image, layers = rec.layers,
      backend = backend or nil, saved = type(rec.vm) == "table" and rec.vm or nil,
      paused = rec.paused == true,
      image_digest = rec.image_digest, user = rec.user, dir = self.boxes .. "/" .. id,
      pid = math.tointeger(rec.pid), cgroup = self.tag .. "-" .. id, created_at = rec.created_at,
      metadata = rec.metadata, env = rec.env, cwd = rec.cwd, limits_info = rec.limits,
      cred = type(rec.cred) == "table" and rec.cred or nil,
      default_user = type(rec.default_user) == "string" and rec.default_user or nil,
      home = type(rec.home) == "string" and rec.home or nil,
      workdir = type(rec.workdir) == "string" and rec.workdir or nil,
      recipe = type(rec.recipe) == "table" and rec.recipe or nil,
      on_output = function(s, proc, stream, data) self:_output(s, proc, stream, data) end,
      on_exit = function(s, proc) self:_exit(s, proc) end,
      on_down = function(s, reason) self:_sandbox_down(s, reason) end,
      on_watch = function(s, w, kind, name, msg) self:_watch_event(s, w, kind, name, msg) end })
  elseif persist then
    err = "paused to disk, no box"
  else
    err = err or "unreadable record"
  end
  if sb then sb.persist, sb.pause_snapshot = persist, held end
  if not sb and persist then
    -- its box is gone (a reboot) or could not be re-adopted: its files
    -- are in its snapshot, it stays listed as paused
    if err ~= "paused to disk, no box" then log("sandbox %s: box not re-adopted (%s)", id, tostring(err)) end
    sb = self:_pause_adopt_dormant(rec, persist, pol)
    if rec.kill_on_disconnect == true then doomed[#doomed + 1] = id end
  elseif sb and rec.kill_on_disconnect == true then
    self:_sb_put(id, sb)
    doomed[#doomed + 1] = id -- killed below, once the sweep of boxes/ is done
  elseif sb then
    self:_sb_put(id, sb)
    if pol then sb.policy, sb.policy_source = pol, rec.policy end
    if type(rec.volumes) == "table" then sb.volume_mounts = rec.volumes end -- daemon/volumes.lua
    self:_hook_connect(sb)
    if rec.network ~= nil then
      local nok, nerr = sb:set_network(rec.network, self:policy_networks(sb.policy))
      if not nok then log("sandbox %s: network rules not restored: %s", id, tostring(nerr)) end
    end
    if rec.paused then sb.state = "paused" end
    local left = rec.expires_at and (rec.expires_at - os.time())
    if rec.expires_at then
      self:set_timeout(sb, math.max(1, left))
      if rec.paused then self:pause_timeout(sb) end
    else
      self:set_timeout(sb, 0)
    end
    log("sandbox %s re-adopted (%d processes)", id, (function()
      local n = 0
      for _ in pairs(sb.procs) do n = n + 1 end
      return n
    end)())
  else
    log("sandbox %s cannot be re-adopted (%s): removing it", id, tostring(err))
    self:unsave(id)
  end
end

-- After a crash: re-adopts the boxes a previous daemon left that are still
-- whole, and removes everything else it left in boxes/ (directories,
-- records, cgroups).  A box created with kill_on_disconnect is killed: its
-- client's connection died with the old daemon, and a connection cannot
-- claim a box again, so no client could ever own it (a grace period would
-- only keep it alive, unowned and running, for its length).
function D:_recover()
  local names = {}
  local dir = uv.fs_scandir(self.boxes)
  while dir do
    local name = uv.fs_scandir_next(dir)
    if not name then break end
    names[#names + 1] = name
  end
  local seen, doomed, jobs = {}, {}, {}
  for _, name in ipairs(names) do
    local id = name:match("^([a-z0-9]+)%.json$")
    if id and not seen[id] then
      seen[id] = true
      jobs[#jobs + 1] = function() self:_recover_one(id, name, doomed) end
    end
  end
  -- side by side: a microVM's re-attach takes seconds (under TCG, tens of
  -- them on a loaded machine), and the daemon listens once all are done
  async.all(jobs)
  -- what is left: boxes nobody re-adopted, half-made ones, stray files
  for _, name in ipairs(names) do
    local id = name:match("^([a-z0-9]+)") or name
    if name == ".spare" then
      -- spare box dirs and records (below): a previous daemon's are removed
      local ok, err = core.rmtree(self.boxes .. "/" .. name)
      if not ok then log("cannot remove %s: %s", name, err) end
    elseif not self.sandboxes[id] and not name:match("%.json$") then
      if self.cgroups then core.cgroup_remove(self.tag .. "-" .. id) end
      local path = self.boxes .. "/" .. name
      local st = uv.fs_lstat(path)
      local ok, err = true, nil
      if st and st.type == "directory" then ok, err = core.rmtree(path)
      elseif st then ok, err = uv.fs_unlink(path) end
      if not ok then log("cannot remove %s: %s", name, err) end
    end
  end
  -- Removed boxes' dirs (backends/linux/box_spare.c) and records
  -- (daemon/life.lua) wait here for the next box instead of being removed:
  -- a rename makes no inode on the state dir's filesystem, where a new one
  -- costs more the more were freed lately (docs/benchmarks.md, "Churn").
  self.spare_dir = self.boxes .. "/.spare"
  self.spare_records, self.spare_seq = {}, 0
  if not uv.fs_mkdir(self.spare_dir, tonumber("700", 8)) then self.spare_dir = nil end
  -- pause snapshots that no record names: a pause or a resume cut short
  self:_pause_sweep()
  for _, id in ipairs(doomed) do
    log("sandbox %s was created with kill_on_disconnect and its client is gone: killing it", id)
    async.spawn(function() self:kill_sandbox(id) end)
  end
end

-- Removes the cgroups of this daemon's boxes that no live sandbox owns: a
-- previous daemon's, after a crash.  Other daemons' cgroups (another state
-- dir) carry another tag and are left alone.
function D:_sweep_cgroups()
  local prefix = self.tag .. "-"
  for _, name in ipairs(core.cgroup_orphans()) do
    if name:sub(1, #prefix) == prefix and not self.sandboxes[name:sub(#prefix + 1)] then
      local ok, err = core.cgroup_remove(name)
      if not ok then log("cannot remove stale cgroup %s: %s", name, err) end
    end
  end
end

return D
