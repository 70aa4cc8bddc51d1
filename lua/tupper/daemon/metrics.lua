--- A bounded series of each running box's counters, for sandbox.metrics's
-- `series` (E2B's getMetrics gives samples over a window): one sample of
-- every running box every INTERVAL seconds (TUPPER_METRICS_INTERVAL, for
-- tests), the last KEEP of each box kept with it and gone with it.  A
-- sample is a few reads of the box's cgroup files.
local uv = require("luv")

local M = { INTERVAL = 5, KEEP = 720 }

local function interval()
  local v = tonumber(os.getenv("TUPPER_METRICS_INTERVAL") or "")
  if v and v >= 0.1 and v <= 3600 then return v end
  return M.INTERVAL
end

local function now()
  local s, us = uv.gettimeofday()
  return s + us / 1e6
end

--- Adds one sample of sb (a running box with cgroups) to its series.
function M.sample(sb)
  if sb.state ~= "running" or not sb.box or not sb.box.has_cgroup or not sb.box:has_cgroup() then return end
  local ok, st = pcall(sb.stats, sb)
  if not ok or type(st) ~= "table" then return end
  local ring = sb.metrics_series
  if not ring then
    ring = {}
    sb.metrics_series = ring
  end
  ring[#ring + 1] = { time = now(), cpu_usage_usec = st.cpu_usage_usec, memory_bytes = st.memory_current,
                      pids = st.pids_current }
  while #ring > M.KEEP do table.remove(ring, 1) end
end

--- Samples d's sandboxes from now on, until stop(d).
function M.start(d)
  if d.metrics_timer or d.stopping then return end
  local every = math.floor(interval() * 1000)
  local t = uv.new_timer()
  t:start(every, every, function()
    for _, sb in pairs(d.sandboxes) do M.sample(sb) end
  end)
  d.metrics_timer = t
end

--- Stops the sampling (the daemon's shutdown: its loop ends once every handle is closed).
function M.stop(d)
  if d.metrics_timer then
    d.metrics_timer:close()
    d.metrics_timer = nil
  end
end

--- sb's samples, oldest first (a copy).
function M.series(sb)
  local out = {}
  for i, s in ipairs(sb.metrics_series or {}) do out[i] = s end
  return out
end

return M
