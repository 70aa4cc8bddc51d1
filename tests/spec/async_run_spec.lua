-- util/async.lua's run: a daemon request's coroutine, kept once finished
-- and given the next request, so that a request makes no new coroutine.
local uv = require("luv")
local async = require("tupper.util.async")

describe("async.run", function()
  it("gives a finished coroutine the next fn, and keeps at most FREE_MAX", function()
    local first, second
    async.run(function() first = coroutine.running(); return true end)
    local kept = async.free_count()
    assert.is_true(kept >= 1)
    async.run(function() second = coroutine.running(); return true end)
    assert.are.equal(first, second)
    assert.are.equal(kept, async.free_count())
    -- more finished at once than FREE_MAX: the rest end
    local waiting = {}
    for i = 1, async.FREE_MAX + 4 do
      async.run(function()
        async.wait(function(cb) waiting[i] = cb end)
        return true
      end)
    end
    assert.are.equal(0, async.free_count())
    for i = 1, #waiting do waiting[i]() end
    assert.are.equal(async.FREE_MAX, async.free_count())
  end)

  it("ends a coroutine whose fn does not say it may be reused, or raised", function()
    -- each takes a kept coroutine when there is one, and none comes back
    local before = async.free_count()
    local co1 = async.run(function() return nil end)
    assert.are.equal("dead", coroutine.status(co1))
    before = math.max(before - 1, 0)
    assert.are.equal(before, async.free_count())
    local errors = {}
    local write = io.stderr.write
    local stderr = getmetatable(io.stderr).__index
    stderr.write = function(f, ...)
      if f == io.stderr then errors[#errors + 1] = table.concat({ ... }) return f end
      return write(f, ...)
    end
    local co2 = async.run(function() error("boom") end)
    stderr.write = write
    assert.are.equal("dead", coroutine.status(co2))
    assert.are.equal(math.max(before - 1, 0), async.free_count())
    assert.is_truthy(table.concat(errors):find("task failed: .*boom"))
  end)

  it("runs each fn with its own arguments and results across a wait", function()
    local got = {}
    local t = uv.new_timer()
    async.run(function()
      local v = async.wait(function(cb) t:start(5, 0, function() cb("late") end) end)
      got[#got + 1] = v
      return true
    end)
    async.run(function() got[#got + 1] = "now"; return true end)
    while #got < 2 do uv.run("once") end
    t:close()
    uv.run("nowait")
    assert.are.same({ "now", "late" }, got)
  end)
end)
