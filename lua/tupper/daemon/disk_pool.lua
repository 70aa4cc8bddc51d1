--- The btrfs pool of box upper dirs (docs/limits.md "Where a box's writes
-- go"): when the host can, every box with a disk cap has its upper dir as a
-- subvolume of one loop-mounted btrfs image in the state dir, its cap a
-- qgroup limit, so that a snapshot of it is a read-only subvolume snapshot
-- (daemon/snapshots.lua): O(1) in what the box wrote.  Else the per-box
-- ext4 image (backends/linux/disk.c) stays.  Methods of the daemon
-- (daemon/main.lua mixes them in); the C half is backends/linux/pool_btrfs.c.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local linux = require("tupper.backend.linux")
local log = require("tupper.daemon.log").log

local D = {}

D.POOL_OFF_FILE = "no-btrfs-pool" -- in the state dir: the ext4 path, whatever the host has
local GiB = 1024 * 1024 * 1024

--- Mounts (or re-adopts) the pool at <state>/pool unless the host cannot
-- have one or the state dir turns it off; self.disk_pool is then
-- { dir = }, else nil and self.disk_pool_off says why.  Never fails the
-- start: without a pool, boxes get the ext4 image.
function D:_disk_pool_open()
  self.disk_pool, self.disk_pool_off = nil, nil
  local off
  if uv.fs_stat(self.state .. "/" .. D.POOL_OFF_FILE) then
    off = ("turned off (%s/%s exists)"):format(self.state, D.POOL_OFF_FILE)
  elseif not self.enforces.disk then
    off = "no disk cap on this host (loop devices, mkfs.ext4)"
  else
    local ok, err = core.pool_probe()
    if not ok then off = err end
  end
  if not off then
    -- sparse: as large as the state dir's filesystem, so the pool runs out
    -- no sooner than the host's disk; each box is held to its cap
    local st = uv.fs_statfs(self.state)
    local bytes = st and math.tointeger(st.blocks * st.bsize) or 0
    bytes = math.max(GiB, bytes)
    local dir = self.state .. "/pool"
    local info, err = core.pool_open(dir, bytes)
    if info then
      self.disk_pool = { dir = dir }
      linux.pools[self.state] = dir
      log("disk pool: btrfs at %s (%s)", dir, info.adopted and "re-adopted" or "mounted")
      return true
    end
    off = err
  end
  self.disk_pool_off = off
  log("disk pool: none (%s): disk caps are ext4 images, snapshots are copies", tostring(off))
  return true
end

--- Removes the box subvolumes no live sandbox owns (a box of a killed
-- daemon that was not re-adopted, a start cut short), the snapshot temp
-- subvolumes of a snapshot cut short, and the image pins of snapshots
-- that are gone.  After _recover.
function D:_disk_pool_sweep()
  -- pins of pool snapshots whose record is gone (a delete cut short)
  for digest, owners in pairs(self.images and self.images:pins() or {}) do
    for owner in pairs(owners) do
      local sid = type(owner) == "string" and owner:match("^snapshot (s%x+)$")
      if sid and not self.snapshots[sid] then self.images:unpin(digest, owner) end
    end
  end
  if not self.disk_pool then return end
  local dir = self.disk_pool.dir
  for _, sub in ipairs({ "boxes", "snaps" }) do
    local h = uv.fs_scandir(dir .. "/" .. sub)
    while h do
      local name = uv.fs_scandir_next(h)
      if not name then break end
      local stale
      -- a sandbox paused to disk whose box is gone (a reboot) has its
      -- files in its snapshot: its old box's subvolume is stale too
      if sub == "boxes" then stale = not self.sandboxes[name] or self.sandboxes[name].dormant == true
      else stale = name:match("^%.tmp%-") ~= nil end
      if stale then
        log("disk pool: removing %s/%s (nothing owns it)", sub, name)
        local ok, err = async.wait(function(cb)
          local qok, qerr = core.pool_drop(dir, sub, name, cb)
          if not qok then cb(nil, qerr) end
        end)
        if not ok then log("disk pool: %s/%s: %s", sub, name, tostring(err)) end
      end
    end
  end
end

--- Unmounts the pool at the daemon's stop, once its boxes are gone.
function D:_disk_pool_close()
  if not self.disk_pool then return end
  linux.pools[self.state] = nil
  local ok, err = core.pool_close(self.disk_pool.dir)
  if not ok then log("disk pool: %s", tostring(err)) end
  self.disk_pool = nil
end

return D
