-- A daemon's shutdown with things still open (daemon/handles.lua): the luv
-- handles its modules made are recorded and closed before the Lua state
-- goes, so a SIGTERM ends in exit 0, never a SIGSEGV (139) in the loop's
-- run after lua_close, nor a loop that never returns.
local uv = require("luv")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local handles = require("tupper.daemon.handles")
local helper = require("helper")

local call = helper.call

describe("daemon/handles.lua", function()
  after_each(function() handles.untrack() end)

  it("records what luv's constructors make, and closes what is still open", function()
    handles.track()
    handles.track() -- a second call changes nothing
    local before = handles.open_count()
    local t = uv.new_timer()
    local stopped = uv.new_timer()
    stopped:start(60000, 0, function() end)
    stopped:stop() -- idle, yet open: what once outlived the state
    local p = uv.new_pipe(false)
    local closed = uv.new_timer()
    closed:close()
    assert.are.equal(before + 3, handles.open_count())
    assert.are.equal(before + 3, handles.close_all())
    assert.is_true(t:is_closing() and stopped:is_closing() and p:is_closing())
    assert.are.equal(0, handles.open_count())
    assert.are.equal(0, handles.close_all())
    -- one closed and collected (its finalizer ran; its weak key goes only
    -- at the next collection, and luv refuses it as a handle meanwhile) is
    -- neither open nor an error
    uv.run("nowait") -- the close callbacks: luv lets go of the handles
    t, stopped, p, closed = nil, nil, nil, nil -- luacheck: ignore (dropped for the collector)
    collectgarbage()
    assert.are.equal(0, handles.open_count())
    assert.are.equal(0, handles.close_all())
    handles.untrack()
    local untracked = uv.new_timer()
    assert.are.equal(0, handles.open_count(), "after untrack nothing more is recorded")
    untracked:close()
    uv.run("nowait")
  end)

  it("passes a constructor's every result through (spawn's handle and pid, or its error)", function()
    handles.track()
    local h, pid = uv.spawn("/bin/true", {}, function() end)
    assert.is_userdata(h)
    assert.is_number(pid)
    local none, err = uv.spawn("/nonexistent/tupper-no-such-binary", {}, function() end)
    assert.is_nil(none)
    assert.is_string(err)
    assert.are.equal(1, handles.open_count())
    helper.sync(function() async.sleep(50) end)
    assert.are.equal(1, handles.close_all())
    uv.run("nowait")
  end)
end)

-- The Lua tree of this checkout as a daemon loads it (TUPPER_LUA_DIR), with
-- daemon/metrics.lua's start also making a timer and a pipe it never
-- closes: a module that forgets a handle, as a future change might.
local function leaky_lua_dir(base)
  local dir = base .. "/lua"
  assert(os.execute(("mkdir -p '%s' && cp -as '%s/lua/.' '%s/'"):format(dir, uv.fs_realpath(helper.ROOT), dir)))
  local path = dir .. "/tupper/daemon/metrics.lua"
  local real = uv.fs_realpath(path)
  assert(os.remove(path))
  local f = assert(io.open(path, "w"))
  f:write(([[
local uv = require("luv")
local M = dofile(%q)
local start = M.start
function M.start(d)
  d._leaked = { uv.new_timer(), uv.new_pipe(false) } -- never closed, and idle
  return start(d)
end
return M
]]):format(real))
  f:close()
  return dir
end

-- The daemon's environment: this one's, plus extra ("K=V" strings).
local function env_with(extra)
  local env = {}
  for k, v in pairs(uv.os_environ()) do env[#env + 1] = k .. "=" .. v end
  for _, kv in ipairs(extra) do env[#env + 1] = kv end
  return env
end

-- SIGTERMs daemon d and waits (up to 30 s) for it: the daemon's log.
local function sigterm(d)
  uv.kill(d.pid, "sigterm")
  local exited = helper.sync(function()
    local deadline = helper.now() + 30000
    while d.exit_code == nil and helper.now() < deadline do async.sleep(10) end
    return d.exit_code ~= nil
  end)
  local log = helper.read_file(d.log) or ""
  assert.is_true(exited, "the daemon did not exit within 30 s of SIGTERM: " .. log:sub(-2000))
  return log
end

describe("a daemon stopped with long-lived things open", function()
  local d, c, data, overlay

  teardown(function()
    if data and not data:is_closing() then data:close() end
    if c then c:close() end
    helper.release(d)
    if overlay then helper.rmrf(overlay) end
    helper.drain()
  end)

  it("exits 0 on SIGTERM with a watch, timers, a process, a forwarded port, a stream and a request pending", function()
    d, c = helper.daemon_and_client(nil, { pool = 0 })
    -- a lifetime timer, a process with its pipes, a watch, a forwarder
    local id = assert(call(c, "sandbox.create", { limits = { timeout = 600 } })).id
    assert(call(c, "process.start", { sandbox = id, argv = { "sleep", "1000" } }))
    assert(call(c, "fs.watch", { sandbox = id, path = "/tmp", recursive = true }))
    assert(call(c, "sandbox.expose", { id = id, port = 8080 }))
    -- a data connection with a write stream that never gets its END
    local tok = assert(call(c, "stream.channel", {})).token
    data = uv.new_pipe(false)
    local buf = ""
    helper.sync(function()
      local err = async.wait(function(cb) data:connect(d.socket, function(e) cb(e) end) end)
      assert(not err, err)
      data:read_start(function(_, chunk) if chunk then buf = buf .. chunk end end)
      data:write(json.encode({ jsonrpc = "2.0", id = 1, method = "stream.attach", params = { token = tok } }) .. "\n")
      helper.poll(function() return buf:find("\n", 1, true) end, nil, 5)
    end)
    local reply = json.decode(buf:match("^([^\n]*)\n") or "")
    assert(reply and reply.result, "stream.attach: " .. buf)
    assert(call(c, "fs.write_stream", { sandbox = id, path = "/tmp/half" }))
    -- a process with a timeout, a host client connected to the forwarder
    assert(call(c, "process.start", { sandbox = id, argv = { "sleep", "1000" }, timeout = 900 }))
    local fwd = assert(call(c, "sandbox.expose", { id = id, port = 8080 }))
    local tcp = uv.new_tcp()
    helper.sync(function() async.wait(function(cb) tcp:connect("127.0.0.1", fwd.port, function() cb() end) end) end)
    -- and requests the daemon is still working on when the signal comes
    c.conn:send({ jsonrpc = "2.0", id = 9998, method = "sandbox.snapshot", params = { id = id } })
    c.conn:send({ jsonrpc = "2.0", id = 9999, method = "sandbox.create", params = {} })
    helper.sync(function() async.sleep(30) end)
    local log = sigterm(d)
    assert.is_nil(d.signal, "killed by signal " .. tostring(d.signal) .. ": " .. log:sub(-2000))
    assert.are.equal(0, d.exit_code, log:sub(-2000))
    assert.is_nil(log:find("event loop still busy", 1, true), log:sub(-2000))
    -- its boxes' dirs and records are gone, the spare ones (.spare) too
    local scan = uv.fs_scandir(d.state .. "/boxes")
    assert.is_nil(scan and uv.fs_scandir_next(scan), "boxes/ is empty")
    if not tcp:is_closing() then tcp:close() end
  end)

  it("exits 0 on SIGTERM when a module left idle handles open, and says how many it closed", function()
    helper.release(d)
    overlay = helper.tmpdir()
    d = helper.start_daemon(nil, { pool = 0, env = env_with({ "TUPPER_LUA_DIR=" .. leaky_lua_dir(overlay) }) })
    local log = sigterm(d)
    assert.is_nil(d.signal, "killed by signal " .. tostring(d.signal) .. ": " .. log:sub(-2000))
    assert.are.equal(0, d.exit_code, log:sub(-2000))
    assert.truthy(log:find("closed 2 handles left open", 1, true), log:sub(-2000))
  end)
end)
