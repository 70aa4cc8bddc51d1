--- The daemon's pools of warm boxes, one per backend (its `pool`:
-- backend/registry.lua).  Methods of the daemon (daemon/main.lua mixes them in).
local uv = require("luv")
local async = require("tupper.util.async")
local backends = require("tupper.backend.registry")
local limits = require("tupper.daemon.limits")
local log = require("tupper.daemon.log").log

local D = {}

-- Keeps each backend's pool of boxes started and idle (its `pool`:
-- backend/registry.lua), so that a create of the default image takes one
-- at once instead of waiting for a start.  Pool boxes are made with the
-- default limits, disk cap included (docs/limits.md): a create that keeps
-- the default disk cap pays nothing for it.  The refill
-- waits until the daemon has been quiet for the longest delay_ms of the
-- pools that are short; a create calls for it through D:_pool_hold, once
-- its box's first process has started.
function D:_fill_pool()
  if self.filling or self.stopping then return end
  local delay
  for _, pool in ipairs(self.pools) do
    if #pool.boxes < pool.size then delay = math.max(delay or 0, pool.backend.pool.delay_ms) end
  end
  if not delay then return end
  if not self.pool_timer then self.pool_timer = uv.new_timer() end
  self.pool_timer:start(delay, 0, function() self:_refill() end)
end

-- How long a create's box holds the refill at most (ms): see D:_pool_hold.
local HOLD_MS = 50

--- A create has its box (taken from the pool or not): the refill it calls
-- for waits until that box's first process has started (D:_pool_release,
-- from process.start and pty.create, answered or failed) or the box is
-- gone, and at most HOLD_MS.  A box's start is 5-9 ms of CPU in a
-- worker thread, with cgroup mkdirs and mounts whose kernel locks the
-- first process's start takes too: started at the create, it ran on the
-- same two cores as the start that follows.  The bound is one timer, armed
-- by the first hold and not pushed back by later ones, so creates in a
-- loop that start nothing still get their refill; a refill under way takes
-- every box taken meanwhile (D:_refill).
function D:_pool_hold(sb)
  if self.stopping then return end
  if not self.pool_held then self.pool_held = setmetatable({}, { __mode = "k" }) end
  self.pool_held[sb] = true
  if not self.pool_hold_timer then self.pool_hold_timer = uv.new_timer() end
  if not self.pool_hold_timer:is_active() then
    self.pool_hold_timer:start(HOLD_MS, 0, function() self:_fill_pool() end)
  end
end

--- sb's hold on the refill ends (its first process started, or it is gone).
function D:_pool_release(sb)
  local held = self.pool_held
  if not held or not held[sb] then return end
  held[sb] = nil
  self:_fill_pool()
end

function D:_refill()
  if self.filling or self.stopping then return end
  self.filling = true
  async.spawn(function()
    for _, pool in ipairs(self.pools) do
      local b = pool.backend
      while #pool.boxes < pool.size and not self.stopping do
        local sb, err = self:_start_box(self:_new_id(), limits.for_backend(self.pool_limits[b.name]),
                                        nil, nil, nil, b.name)
        if not sb then
          log("%s: %s", b.pool.label, err)
          break
        end
        local ok, ferr = true, nil
        if not self.stopping and b.pool_park then
          ok, ferr = b.pool_park(sb, function() return self.stopping end)
        end
        if self.stopping or not ok then
          if ferr then log("%s: %s", b.pool.label, ferr) end
          sb:destroy()
          break
        end
        pool.boxes[#pool.boxes + 1] = sb
        sb:make_spares() -- its first process takes one (sandbox.lua)
        if b.pool_park then log("%s: sandbox %s ready", b.pool.label, sb.id) end
      end
    end
    self.filling = false
  end)
end

-- A pooled box of backend b for a create whose limits differ from the
-- pool's boxes' by lim (memory, cpus, pids: set on the box taken), or nil
-- (then start one), or nil, err (the create fails).
function D:_take_pooled(b, lim)
  return b.pool_take(self.pools[b.name].boxes, lim, backends.limits(lim), log)
end

return D
