--- A sandbox's life in the daemon: its record on disk (for re-adoption
-- after a crash), its lifetime timer, its kill and its death.  Methods of
-- the daemon (daemon/main.lua mixes them in).
local uv = require("luv")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local log = require("tupper.daemon.log").log

local D = {}

local SPARE_RECORDS = 64 -- removed boxes' record files kept for the next ones

-- The record of a live sandbox, <state>/boxes/<id>.json, written atomically:
-- what a restarted daemon needs to re-adopt it after a crash.
function D:save(sb)
  if sb.state ~= "running" and sb.state ~= "paused" then return end
  local path = self.boxes .. "/" .. sb.id .. ".json"
  local rec = sb:record()
  -- (read raw where sb may be a Sandbox, whose unset fields go through its
  -- class's __index, a Lua function: Sandbox:record)
  local raw = rawget
  -- a box that goes with its client: a restarted daemon kills it
  rec.kill_on_disconnect = raw(sb, "kill_on_disconnect")
  -- a pause to disk and the snapshot it holds (daemon/pause.lua)
  rec.persist, rec.pause_snapshot = raw(sb, "persist"), raw(sb, "pause_snapshot")
  local text = json.encode(rec)
  -- a removed box's record file where one is spare (D:unsave): no inode
  -- made (daemon/recover.lua).  It is written over from offset 0 where it
  -- lies, cut only when the record it held was longer (not truncated first,
  -- which frees its block for the write to take again), and renamed over
  -- the record once whole: a daemon killed meanwhile leaves a spare, which
  -- the next one removes, and the old record or none.
  local spare = self.spare_records and table.remove(self.spare_records)
  local tmp, fd = spare and spare.path, nil
  if spare then
    fd = uv.fs_open(tmp, "r+", 0)
    if fd then
      uv.fs_write(fd, text, 0)
      if not spare.len or spare.len > #text then uv.fs_ftruncate(fd, #text) end
    end
  end
  if not fd then
    tmp = path .. ".tmp"
    fd = uv.fs_open(tmp, "w", tonumber("600", 8))
    if not fd then return end
    uv.fs_write(fd, text)
  end
  uv.fs_close(fd)
  -- (the length of the record now on disk, when this one took its place)
  sb.record_len = uv.fs_rename(tmp, path) and #text or nil
end

--- The record of box id goes (its sandbox is killed).  len: the record's
-- length in bytes, when known (sb.record_len): the file is kept as a spare
-- for the next box's record (D:save), up to SPARE_RECORDS of them.
function D:unsave(id, len)
  local path = self.boxes .. "/" .. id .. ".json"
  if self.spare_dir and #self.spare_records < SPARE_RECORDS then
    self.spare_seq = self.spare_seq + 1
    local spare = ("%s/r%d"):format(self.spare_dir, self.spare_seq)
    if uv.fs_rename(path, spare) then
      self.spare_records[#self.spare_records + 1] = { path = spare, len = len }
      return
    end
  end
  uv.fs_unlink(path)
end

-- Stops and drops sb's lifetime timer, if it has one.
local function stop_life_timer(sb)
  if sb.life_timer then
    sb.life_timer:stop()
    sb.life_timer:close()
    sb.life_timer = nil
  end
end

--- Sets a sandbox's remaining lifetime to seconds from now (0: none).
function D:set_timeout(sb, seconds)
  stop_life_timer(sb)
  sb.timeout = seconds
  sb.expires_at = nil
  if seconds and seconds > 0 then
    sb.expires_at = os.time() + math.ceil(seconds)
    sb.life_timer = uv.new_timer()
    sb.life_timer:start(math.ceil(seconds * 1000), 0, function()
      log("sandbox %s reached its timeout", sb.id)
      async.spawn(function() self:kill_sandbox(sb.id) end)
    end)
  end
  self:save(sb)
end

--- Kills sandbox id; returns once every process of its box is dead (false:
-- no such sandbox).  The removal of its files and cgroups goes on after,
-- in the thread pool: until it ends the box is in self.dying, which counts
-- against the daemon's caps (create.lua) and keeps its id from being
-- reused.  Its record is gone first: a daemon that dies mid-removal leaves
-- a dir without a record and cgroups that no record names, and the next
-- one removes both (recover.lua).
function D:kill_sandbox(id)
  local sb = self.sandboxes[id]
  if not sb or not sb.destroy then return false end
  self:_sb_put(id, nil)
  self:_dying_put(id, not sb.dormant and sb.limits and sb.limits.memory or 0)
  stop_life_timer(sb)
  self:_pool_release(sb) -- a box killed before it started anything (pool.lua)
  self:unsave(id, sb.record_len)
  async.wait(function(dead)
    async.spawn(function()
      -- an error must not leave the box counted (and creates at the cap
      -- waiting) for ever
      -- a box that holds a pause snapshot (daemon/pause.lua) is answered
      -- once that is gone too, after the removal
      local early = not (sb.persist and sb.persist.snapshot) and not sb.pause_snapshot
      local pok, ok, err = pcall(sb.destroy, sb, nil, early and dead or nil)
      if not pok then ok, err = false, ok end
      self:_dying_put(id, nil)
      local waiters = self.dying_waiters
      self.dying_waiters = {}
      for _, w in ipairs(waiters) do w() end
      if not ok then log("sandbox %s: cleanup: %s", id, tostring(err)) end
      self:_pause_release(sb)
      log("sandbox %s killed", id)
      dead()
    end)
  end)
  return true
end

--- Waits until the removal of one killed box ends; false at once when
-- none is under way.
function D:wait_one_dying()
  if not next(self.dying) then return false end
  async.wait(function(cb) self.dying_waiters[#self.dying_waiters + 1] = cb end)
  return true
end

--- Waits until every killed box's removal has ended (a shutdown's last step).
function D:wait_dying()
  while self:wait_one_dying() do end
end

-- A box died on its own (its agent exited or misbehaved): remove it.
function D:_sandbox_down(sb, reason)
  log("sandbox %s went down: %s", sb.id, reason)
  self:_pool_release(sb)
  -- paused to disk: its files are kept, it stays listed as paused
  if sb.persist and self.sandboxes[sb.id] == sb then
    return async.spawn(function() self:_pause_park(sb) end)
  end
  for _, pool in ipairs(self.pools) do
    for i, pooled in ipairs(pool.boxes) do
      if pooled == sb then
        table.remove(pool.boxes, i)
        async.spawn(function() sb:destroy() end)
        return
      end
    end
  end
  async.spawn(function() self:kill_sandbox(sb.id) end)
end

--- A paused sandbox's lifetime stands still: its timer stops, keeping what
-- was left, and runs on at resume.
function D:pause_timeout(sb)
  if not sb.expires_at then return end
  local left = math.max(1, sb.expires_at - os.time())
  self:set_timeout(sb, 0)
  sb.paused_left = left
end

function D:resume_timeout(sb)
  if sb.paused_left then
    self:set_timeout(sb, sb.paused_left)
    sb.paused_left = nil
  end
end

return D
