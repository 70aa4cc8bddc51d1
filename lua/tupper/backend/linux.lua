--- The linux backend: a box is a set of namespaces, an overlay root and a
-- cgroup on this host's kernel, made by the C side (core.start("linux", ...)).
-- Its Lua half builds the spec, starts and re-adopts boxes, and says what
-- the daemon may expect of them (backend/registry.lua lists the fields).
-- Call from a coroutine.
local core = require("tupper.core")
local async = require("tupper.util.async")

local M = {}

M.name = "linux"
M.ready_timeout_ms = 10000 -- for the agent's READY
M.guest_kernel = false -- processes share the host's kernel: one cgroup per process tree
M.agent_frozen = false -- a pause freezes the box's processes, not its agent
M.guest_pids = false   -- the pids limit needs the host's pids controller
M.live_limits = true   -- memory, pids and cpus of a live box can change (set_limits)
-- boxes kept started and idle for fast creates (tupper daemon --pool N).
-- A box starts in the thread pool; its refill waits for the first process
-- of the box a create took to start (daemon/pool.lua), then for delay_ms
-- of quiet.
M.pool = { option = "pool", size = 2, delay_ms = 0, label = "pool" }
-- state dir -> the btrfs pool mounted for it (daemon/disk_pool.lua): a box
-- with a disk cap gets its upper dir there
M.pools = {}

--- Starts a box.  opts: id, layers (read-only layer dirs, lowest first),
-- dir, uid_base, id_count, cgroup, limits (the backend's: memory, pids,
-- disk, cpu_quota, cpu_period), volumes (image, target pairs: daemon/volumes.lua).
-- Returns core's box or nil, err.
function M.start(opts)
  local spec = { id = opts.id, layers = opts.layers, dir = opts.dir,
    uid_base = opts.uid_base, gid_base = opts.uid_base, id_count = opts.id_count,
    cgroup = opts.cgroup, limits = opts.limits, volumes = opts.volumes,
    -- the box's set-up writes its /etc/resolv.conf (sandbox.lua asks
    -- box:resolv() whether it did)
    resolv = true }
  if opts.limits and (opts.limits.disk or 0) > 0 then spec.pool = M.pools[opts.state_dir or ""] end
  -- the start runs in the thread pool: the loop keeps serving meanwhile
  return async.wait(function(cb)
    local ok, serr = core.start("linux", spec, cb)
    if not ok then cb(nil, serr) end
  end)
end

--- Re-adopts a box a previous daemon started.  opts: id, dir, pid (the
-- agent's host pid), cgroup.  Returns core's box or nil, err.
function M.adopt(opts)
  return core.adopt("linux", { id = opts.id, dir = opts.dir, pid = opts.pid, cgroup = opts.cgroup })
end

--- Nothing of the box goes into the sandbox's record beyond its pid.
function M.record()
  return nil
end

--- The agent says READY once it runs, whether started or re-adopted.
function M.awaits_ready()
  return true
end

--- No requests beyond READY: the agent shares the host's clock.
function M.handshake()
  return true
end

--- A pooled box for a create of the default image: running boxes of the
-- pool (boxes, taken from its head) get the create's limits (blim: as
-- start takes them) when it has any.  Returns a sandbox, or nil, err when
-- the limits could not be set, or nil (none left: start one).
function M.pool_take(boxes, lim, blim)
  while #boxes > 0 do
    local sb = table.remove(boxes, 1)
    if sb.state == "running" then
      if lim.memory or lim.pids or lim.cpus then
        local ok, err = sb.box:set_limits(blim)
        if not ok then
          async.spawn(function() sb:destroy() end)
          return nil, err
        end
      end
      return sb
    end
  end
end

return M
