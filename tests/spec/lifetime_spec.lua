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

  it("kills each process at its own timeout, one without a timeout never", function()
    -- one deadline timer a box (sandbox.lua): armed for the long one
    -- first, then earlier for the short one started after it
    local sb = assert(call("sandbox.create", {}))
    local exits, waiter = {}, nil
    c:on("process.exit", function(p)
      exits[#exits + 1] = { pid = p.pid, timed_out = p.timed_out, signal = p.signal, at = helper.now() }
      if waiter then waiter() end
    end)
    local free = assert(call("process.start", { sandbox = sb.id, argv = { "sleep", "100" } }))
    local t0 = helper.now()
    local long = assert(call("process.start", { sandbox = sb.id, argv = { "sleep", "100" }, timeout = 1.5 }))
    local short = assert(call("process.start", { sandbox = sb.id, argv = { "sleep", "100" }, timeout = 0.2 }))
    sync(function()
      while #exits < 2 do async.wait(function(cb) waiter = cb end) end
    end)
    waiter = nil
    assert.are.equal(short.pid, exits[1].pid)
    assert.are.equal(long.pid, exits[2].pid)
    for _, e in ipairs(exits) do
      assert.is_true(e.timed_out)
      assert.are.equal(9, e.signal)
    end
    assert.truthy(exits[1].at - t0 < 1400, "the short one waited for the long one")
    assert.truthy(exits[2].at - t0 >= 1480, "the long one went early")
    local list = assert(call("process.list", { sandbox = sb.id }))
    local alive = false
    for _, p in ipairs(list.processes) do alive = alive or p.pid == free.pid end
    assert.is_true(alive, "the process without a timeout was killed")
    assert(call("sandbox.kill", { id = sb.id }))
  end)
end)

describe("a request to a box's agent", function()
  local d, c
  local TIMEOUT = 500 -- TUPPER_AGENT_TIMEOUT_MS: the daemon's own is 120 s

  setup(function()
    local env = {}
    local p = io.popen("env")
    for line in p:read("a"):gmatch("[^\n]+") do
      if line:find("=", 1, true) and not line:match("^TUPPER_AGENT_TIMEOUT_MS=") then env[#env + 1] = line end
    end
    p:close()
    env[#env + 1] = "TUPPER_AGENT_TIMEOUT_MS=" .. TIMEOUT
    d = helper.start_daemon(nil, { pool = 0, env = env })
    c = assert(d.connect())
  end)
  teardown(function()
    helper.stop_daemon_and_client(d, c)
    helper.drain()
  end)

  local function agent_pid(id)
    local f = assert(io.open(d.state .. "/boxes/" .. id .. ".json"))
    local pid = f:read("a"):match('"pid"%s*:%s*(%d+)')
    f:close()
    return assert(math.tointeger(tonumber(pid)))
  end

  it("fails once its agent has not answered in time, each request at its own time", function()
    local id = assert(helper.call(c, "sandbox.create", {})).id
    assert(helper.call(c, "fs.stat", { sandbox = id, path = "/" }))
    local apid = agent_pid(id)
    assert.are.equal(0, helper.sh_status("kill -STOP " .. apid))
    local done = {}
    local function stat(name, path)
      local t0 = helper.now()
      local r, err = c:call("fs.stat", { sandbox = id, path = path })
      done[name] = { r = r, err = err, ms = helper.now() - t0 }
    end
    helper.sync(function()
      async.spawn(stat, "first", "/")
      async.sleep(TIMEOUT // 2)
      async.spawn(stat, "second", "/etc")
      helper.poll(function() return done.first and done.second end)
      -- in flight alone, after the others' timer has gone
      stat("third", "/bin")
    end)
    helper.sh_status("kill -CONT " .. apid)
    for _, name in ipairs({ "first", "second", "third" }) do
      local r = done[name]
      assert.is_nil(r.r, name)
      local msg = type(r.err) == "table" and r.err.message or tostring(r.err)
      assert.truthy(msg:find("did not answer in time", 1, true), name .. ": " .. msg)
      -- not before its own due time (the second was sent half a timeout
      -- after the first), and not the daemon's 120 s
      assert.truthy(r.ms >= TIMEOUT - 20, name .. " " .. r.ms)
      assert.truthy(r.ms < 20000, name .. " " .. r.ms)
    end
    assert.truthy(done.second.ms >= TIMEOUT - 20)
  end)
end)
