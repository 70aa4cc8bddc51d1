-- Sandbox lifetimes and process timeouts, enforced by the daemon.
local uv = require("luv")
local async = require("tupper.util.async")
local helper = require("helper")

local sync = helper.sync

describe("timeouts", function()
  local d, c

  setup(function()
    d = helper.start_daemon()
    c = assert(d.connect())
  end)
  teardown(function()
    if c then c:close() end
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  local function call(method, params) return helper.call(c, method, params) end

  local function wait_gone(id, ms)
    return sync(function()
      local deadline = helper.now() + ms
      while helper.now() < deadline do
        local _, err = c:call("sandbox.get", { id = id })
        if err then return true end
        async.sleep(20)
      end
      return false
    end)
  end

  it("gives a sandbox five minutes by default", function()
    local sb = assert(call("sandbox.create", {}))
    assert.are.equal(300, sb.timeout)
    assert.truthy(sb.expires_at)
    assert(call("sandbox.kill", { id = sb.id }))
  end)

  it("kills a sandbox when its lifetime ends, and leaves nothing", function()
    local sb = assert(call("sandbox.create", { limits = { timeout = "300ms" } }))
    assert.truthy(wait_gone(sb.id, helper.WAIT_MS))
    -- the directory goes right after (destroy finishes in the thread pool)
    local dir = d.state .. "/boxes/" .. sb.id
    assert.is_true(helper.path_gone(dir), dir)
  end)

  it("set_timeout extends and removes the deadline", function()
    -- 1 s: the set_timeout below must come before it runs out, which a
    -- loaded machine may not manage within 300 ms of the create's answer
    local sb = assert(call("sandbox.create", { limits = { timeout = "1s" } }))
    local r = assert(call("sandbox.set_timeout", { id = sb.id, timeout = 0 }))
    assert.are.equal(0, r.timeout)
    assert.is_false(wait_gone(sb.id, 1300))
    assert(call("sandbox.set_timeout", { id = sb.id, timeout = "200ms" }))
    assert.truthy(wait_gone(sb.id, helper.WAIT_MS))
  end)

  it("kills a process that outlives its timeout", function()
    local sb = assert(call("sandbox.create", {}))
    local exit, waiter
    c:on("process.exit", function(p) exit = p; if waiter then waiter() end end)
    local t0 = helper.now()
    assert(call("process.start", { sandbox = sb.id, argv = { "sleep", "100" }, timeout = 0.3 }))
    sync(function() if not exit then async.wait(function(cb) waiter = cb end) end end)
    assert.are.equal(9, exit.signal)
    assert.is_true(exit.timed_out)
    assert.truthy(helper.now() - t0 < 20000) -- not the sleep's 100 s
    assert(call("sandbox.kill", { id = sb.id }))
  end)
end)
