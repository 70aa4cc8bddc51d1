--- A bounded series of each running box's counters, for sandbox.metrics's
-- `series` (E2B's getMetrics gives samples over a window): one sample of
-- every running box every INTERVAL seconds (TUPPER_METRICS_INTERVAL, for
-- tests), the last KEEP of each box kept with it and gone with it.  A
-- sample is a few reads of the box's cgroup files.
local uv = require("luv")
local async = require("tupper.util.async")

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
-- hour's worth was 150 KiB a box).  ring.total counts the samples.  An
-- entry is a list (half the size of a record of named fields):
local TIME, LAST, N, CPU, MEM, PIDS = 1, 2, 3, 4, 5, 6
local function same(e, cpu, mem, pids)
  return e[CPU] == cpu and e[MEM] == mem and e[PIDS] == pids
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
    last[N], last[LAST] = last[N] + 1, t
  else
    ring[#ring + 1] = { t, t, 1, cpu, mem, pids }
  end
  ring.total = ring.total + 1
  while ring.total > M.KEEP do
    local first = ring[1]
    if first[N] == 1 then
      table.remove(ring, 1)
    else -- its oldest sample goes: the run starts one step later
      first[TIME] = first[TIME] + (first[LAST] - first[TIME]) / (first[N] - 1)
      first[N] = first[N] - 1
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
    -- a microVM's sample reads its guest's /proc/vmstat through its agent
    -- (Sandbox:stats): those wait in a coroutine of their own, one round
    -- at a time; the others are cgroup reads, taken here
    local guests
    for _, sb in pairs(d.sandboxes) do
      if sb.impl and sb.impl.guest_kernel then
        guests = guests or {}
        guests[#guests + 1] = sb
      else
        M.sample(sb)
      end
    end
    if guests and not d.metrics_guests then
      d.metrics_guests = true
      async.spawn(function()
        for _, sb in ipairs(guests) do
          local ok, err = pcall(M.sample, sb)
          if not ok then io.stderr:write("tupper: metrics of ", tostring(sb.id), ": ", tostring(err), "\n") end
        end
        d.metrics_guests = nil
      end)
    end
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
    local n = e[N]
    local step = n > 1 and (e[LAST] - e[TIME]) / (n - 1) or 0
    for i = 0, n - 1 do
      out[#out + 1] = { time = e[TIME] + step * i, cpu_usage_usec = e[CPU], memory_bytes = e[MEM], pids = e[PIDS] }
    end
  end
  return out
end

return M
