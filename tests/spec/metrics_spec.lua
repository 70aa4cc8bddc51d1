-- The daemon's metrics series (daemon/metrics.lua), without a box: runs of
-- equal samples are kept as one entry and given back sample by sample.
local metrics = require("tupper.daemon.metrics")

describe("metrics series", function()
  local keep
  before_each(function() keep = metrics.KEEP end)
  after_each(function() metrics.KEEP = keep end)

  it("keeps an idle box's equal samples as one entry and gives each back", function()
    local sb = {}
    for i = 0, 9 do metrics.add(sb, 100 + 5 * i, 7, 4096, 1) end
    metrics.add(sb, 150, 9, 4096, 1) -- it ran something
    metrics.add(sb, 155, 9, 8192, 2)
    assert.are.equal(3, #sb.metrics_series)
    local s = metrics.series(sb)
    assert.are.equal(12, #s)
    for i = 0, 9 do
      assert.are.same({ time = 100 + 5 * i, cpu_usage_usec = 7, memory_bytes = 4096, pids = 1 }, s[i + 1])
    end
    assert.are.same({ time = 150, cpu_usage_usec = 9, memory_bytes = 4096, pids = 1 }, s[11])
    assert.are.same({ time = 155, cpu_usage_usec = 9, memory_bytes = 8192, pids = 2 }, s[12])
  end)

  it("holds KEEP samples, the oldest going first, inside a run too", function()
    metrics.KEEP = 4
    local sb = {}
    metrics.add(sb, 1, 1, 1, 1)
    for t = 2, 5 do metrics.add(sb, t, 2, 2, 1) end -- a run of 4
    metrics.add(sb, 6, 3, 3, 1)
    local s = metrics.series(sb)
    assert.are.equal(4, #s)
    assert.are.same({ 3, 4, 5, 6 }, { s[1].time, s[2].time, s[3].time, s[4].time })
    assert.are.same({ 2, 2, 2, 3 }, { s[1].cpu_usage_usec, s[2].cpu_usage_usec, s[3].cpu_usage_usec,
                                      s[4].cpu_usage_usec })
    assert.are.equal(4, sb.metrics_series.total)
  end)
end)
