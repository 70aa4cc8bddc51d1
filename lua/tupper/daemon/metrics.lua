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

-- A run of equal samples (an idle box's: the same cpu time, memory and
-- pids each time) is kept as one entry, its first and last times and its
-- count n, and given back as n samples evenly between them: 5,000 idle boxes
-- keep 5,000 entries, not up to KEEP each (about 200 bytes a sample: an
-- hour's worth was 150 KiB a box).  ring.total counts the samples.
local function same(e, cpu, mem, pids)
  return e.cpu_usage_usec == cpu and e.memory_bytes == mem and e.pids == pids
end

--- Adds one sample of sb (a running box with cgroups) to its series.
function M.sample(sb)
  if sb.state ~= "running" or not sb.box or not sb.box.has_cgroup or not sb.box:has_cgroup() then return end
  local ok, st = pcall(sb.stats, sb)
  if not ok or type(st) ~= "table" then return end
  M.add(sb, now(), st.cpu_usage_usec, st.memory_current, st.pids_current)
end

--- Adds a sample taken at time t (seconds) to sb's series (M.sample's).
function M.add(sb, t, cpu, mem, pids)
  local ring = sb.metrics_series
  if not ring then
    ring = { total = 0 }
    sb.metrics_series = ring
  end
  local last = ring[#ring]
  if last and same(last, cpu, mem, pids) then
    last.n, last.last = last.n + 1, t
  else
    ring[#ring + 1] = { time = t, last = t, n = 1, cpu_usage_usec = cpu, memory_bytes = mem, pids = pids }
  end
  ring.total = ring.total + 1
  while ring.total > M.KEEP do
    local first = ring[1]
    if first.n == 1 then
      table.remove(ring, 1)
    else -- its oldest sample goes: the run starts one step later
      first.time = first.time + (first.last - first.time) / (first.n - 1)
      first.n = first.n - 1
    end
    ring.total = ring.total - 1
  end
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
  for _, e in ipairs(sb.metrics_series or {}) do
    local step = e.n > 1 and (e.last - e.time) / (e.n - 1) or 0
    for i = 0, e.n - 1 do
      out[#out + 1] = { time = e.time + step * i, cpu_usage_usec = e.cpu_usage_usec,
                        memory_bytes = e.memory_bytes, pids = e.pids }
    end
  end
  return out
end

return M
