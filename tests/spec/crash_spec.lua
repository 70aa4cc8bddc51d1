-- Crash safety: SIGKILL the daemon; the next one re-adopts the boxes that are
-- still whole and removes whatever else the dead one left.
local uv = require("luv")
local async = require("tupper.util.async")
local helper = require("helper")

local sync = helper.sync

local call = helper.call

local function box_procs(id) return (helper.box_pids(id)) end

describe("a daemon killed with SIGKILL", function()
  local dir, d

  setup(function() dir = helper.tmpdir() end)
  -- a test that fails between a crash and the restart leaves boxes that no
  -- daemon owns: release restarts a daemon on that state dir to stop them
  after_each(function() helper.release(d) end)
  teardown(function()
    helper.rmrf(dir)
    helper.drain()
  end)

  it("leaves boxes that the next daemon re-adopts, processes and files included", function()
    d = helper.start_daemon(dir, { pool = 0 })
    local c = assert(d.connect())
    local id = assert(call(c, "sandbox.create", { metadata = { who = "crash" } })).id
    assert(call(c, "fs.write", { sandbox = id, path = "/kept.txt", data = "still here", encoding = "utf8" }))
    local bg = assert(call(c, "process.start", { sandbox = id, argv = { "sleep", "1000" } }))
    -- and one that ends while no daemon listens: its exit is queued by the
    -- agent and must not spoil the re-adoption
    assert(call(c, "process.start", { sandbox = id, argv = { "sleep", "0.2" } }))
    c:close()
    d.crash()
    -- wait (bounded) until the short one has ended: agent and sleep 1000 left
    sync(function() helper.poll(function() return box_procs(id) <= 2 end) end)
    assert.are.equal(2, box_procs(id))

    d = helper.start_daemon(dir, { pool = 0 })
    c = assert(d.connect())
    local info = assert(call(c, "sandbox.get", { id = id }))
    assert.are.equal("crash", info.metadata.who)
    local procs = assert(call(c, "process.list", { sandbox = id })).processes
    assert.are.equal(1, #procs)
    assert.are.equal(bg.pid, procs[1].pid)
    assert.are.equal("sleep", procs[1].argv[1])
    local r = assert(call(c, "fs.read", { sandbox = id, path = "/kept.txt", encoding = "utf8" }))
    assert.are.equal("still here", r.data)
    local out = sync(function() return helper.run(c, id, { "echo", "adopted" }) end)
    assert.are.equal("adopted\n", out.stdout)
    -- a re-adopted process can still be killed, tree and all
    assert(call(c, "process.signal", { sandbox = id, pid = bg.pid, signal = "KILL" }))
    assert.truthy(call(c, "sandbox.kill", { id = id }).killed)
    assert.are.equal(0, box_procs(id))
    -- removed just after the kill's answer
    assert.is_true(helper.path_gone(d.state .. "/boxes/" .. id))
    assert.is_true(helper.path_gone(d.state .. "/boxes/" .. id .. ".json"))
    c:close()
    assert.are.equal(0, d.stop())
  end)

  it("re-adopts a box whose record was written into a longer record's spare file", function()
    d = helper.start_daemon(dir, { pool = 0 })
    local c = assert(d.connect())
    -- a killed box's record file is kept for the next record (daemon/life.lua)
    local long = assert(call(c, "sandbox.create", { metadata = { pad = string.rep("x", 3000) } })).id
    assert(call(c, "sandbox.kill", { id = long }))
    local id = assert(call(c, "sandbox.create", { metadata = { pad = "y" } })).id
    local text = helper.read_file(d.state .. "/boxes/" .. id .. ".json")
    assert.truthy(text and #text < 1000, "the record is cut to its own length")
    c:close()
    d.crash()
    d = helper.start_daemon(dir, { pool = 0 })
    c = assert(d.connect())
    assert.are.equal("y", assert(call(c, "sandbox.get", { id = id })).metadata.pad)
    assert.truthy(call(c, "sandbox.kill", { id = id }).killed)
    c:close()
    assert.are.equal(0, d.stop())
  end)

  it("has the next daemon kill a box made with kill_on_disconnect: its client is gone", function()
    local kdir = helper.tmpdir()
    finally(function() helper.release(d); helper.rmrf(kdir) end)
    d = helper.start_daemon(kdir, { pool = 0 })
    local c = assert(d.connect())
    -- no lifetime: before the fix, nothing would ever have ended it
    local gone = assert(call(c, "sandbox.create", { kill_on_disconnect = true, limits = { timeout = 0 } })).id
    local kept = assert(call(c, "sandbox.create", { limits = { timeout = 0 } })).id
    assert(call(c, "process.start", { sandbox = gone, argv = { "sleep", "1000" } }))
    d.crash() -- with the client still connected: its connection dies with the daemon
    c:close()
    assert.is_true(box_procs(gone) >= 2, "the box outlives the crash")

    d = helper.start_daemon(kdir, { pool = 0 })
    c = assert(d.connect())
    local ended = sync(function()
      local deadline = helper.now() + 20000
      while helper.now() < deadline do
        if box_procs(gone) == 0 and not uv.fs_stat(d.state .. "/boxes/" .. gone) then return true end
        async.sleep(20)
      end
      return false
    end)
    assert.is_true(ended, "the kill_on_disconnect box is killed at the restart")
    local _, err = call(c, "sandbox.get", { id = gone })
    assert.are.equal(-32000, err.code)
    assert.is_nil(uv.fs_stat(d.state .. "/boxes/" .. gone .. ".json"))
    assert.truthy(d.log and helper.read_file(d.log):find("kill_on_disconnect", 1, true))
    -- the other box is re-adopted as before
    assert.are.equal("running", assert(call(c, "sandbox.get", { id = kept })).state)
    assert.truthy(call(c, "sandbox.kill", { id = kept }).killed)
    c:close()
    assert.are.equal(0, d.stop())
  end)

  it("restarts at once after a SIGKILL with creates in flight (no box setup holds the state lock)", function()
    local ldir = helper.tmpdir()
    finally(function() helper.release(d); helper.rmrf(ldir) end)
    for round = 1, 30 do
      d = helper.start_daemon(ldir, { pool = 0 })
      local pipe = uv.new_pipe(false)
      sync(function() assert.is_nil(async.wait(function(cb) pipe:connect(d.socket, cb) end)) end)
      for i = 1, 4 do
        pipe:write(('{"jsonrpc":"2.0","id":%d,"method":"sandbox.create","params":{"limits":{"timeout":60}}}\n'):format(i))
      end
      -- kill while the boxes are being set up: a few ms in, later each round
      sync(function() async.sleep(2 + 3 * (round % 10)) end)
      d.crash()
      pipe:close()
      -- the next daemon starts at once on the same state dir
      d = helper.start_daemon(ldir, { pool = 0 })
      -- (a connect in the first ms may still reach the dead daemon's socket,
      -- held by a box setup that its parent-death signal is ending: retry)
      local r, err
      local deadline = helper.now() + 10000
      repeat
        local pok, c = pcall(d.connect)
        if pok and c then
          pok, r, err = pcall(helper.call, c, "hello", {})
          if not pok then r, err = nil, r end
          c:close()
        else
          err = c
        end
        if not r then sync(function() async.sleep(20) end) end
      until r or d.exit_code or helper.now() > deadline
      assert.is_nil(d.exit_code, "round " .. round .. ": the new daemon exited: " .. tostring(helper.read_file(d.log)))
      assert.truthy(r, ("round %d: %s"):format(round, tostring(type(err) == "table" and err.message or err)))
      if round < 30 then d.crash() end
    end
    -- the record lock still keeps a second daemon off a live one's state dir
    local code, _, err = helper.cli({ "daemon", "--socket", ldir .. "/second.sock", "--state-dir", d.state,
      "--pool", "0" })
    assert.are_not.equal(0, code)
    assert.truthy(err:find("is locked: another daemon uses this state directory", 1, true), err)
    assert.are.equal(0, d.stop()) -- kills what was re-adopted
  end)

  it("has what it left half-made removed at the next start", function()
    dir = helper.tmpdir()
    d = helper.start_daemon(dir, { pool = 0 })
    local c = assert(d.connect())
    local id = assert(call(c, "sandbox.create", {})).id
    c:close()
    d.crash()
    -- the box's record now names a pid that is not its agent, and a box dir
    -- without any record sits next to it: both must go
    local rec = d.state .. "/boxes/" .. id .. ".json"
    local f = assert(io.open(rec))
    local text = f:read("a"):gsub('"pid":%d+', '"pid":1')
    f:close()
    f = assert(io.open(rec, "w"))
    f:write(text)
    f:close()
    assert(uv.fs_mkdir(d.state .. "/boxes/deadbeef0000", tonumber("700", 8)))
    d = helper.start_daemon(dir, { pool = 0 })
    c = assert(d.connect())
    local list = assert(call(c, "sandbox.list", {})).sandboxes
    assert.are.equal(0, #list)
    assert.is_nil(uv.fs_stat(d.state .. "/boxes/" .. id))
    assert.is_nil(uv.fs_stat(rec))
    assert.is_nil(uv.fs_stat(d.state .. "/boxes/deadbeef0000"))
    assert.are.equal(0, box_procs(id), "the unadoptable box's processes were not killed")
    c:close()
    assert.are.equal(0, d.stop())
  end)

  it("is reported as killed by its signal, never as a clean exit", function()
    -- the harness must tell a crashed daemon (glibc's abort on a double
    -- free, a SIGSEGV) from a clean stop: every spec's teardown checks it
    local d2 = helper.start_daemon(nil, { pool = 0 })
    finally(function() helper.release(d2) end)
    uv.kill(d2.pid, "sigkill")
    sync(function()
      while not d2.exit_code do async.sleep(5) end
    end)
    assert.are.equal(9, d2.signal)
    assert.are.equal(128 + 9, d2.stop())
  end)

  it("stops cleanly when told to during a create, leaving no box", function()
    local d2 = helper.start_daemon(nil, { pool = 0 })
    local pipe = uv.new_pipe(false)
    finally(function()
      if not pipe:is_closing() then pipe:close() end
      helper.release(d2)
    end)
    sync(function() async.wait(function(cb) pipe:connect(d2.socket, cb) end) end)
    pipe:write('{"jsonrpc":"2.0","id":1,"method":"sandbox.create","params":{}}\n')
    uv.kill(d2.pid, "sigterm") -- while the box is starting in the thread pool
    local exited = sync(function() return helper.poll(function() return d2.exit_code ~= nil end) end)
    pipe:close()
    assert.is_true(exited, "the daemon did not exit")
    assert.are.equal(0, d2.exit_code)
    local left = io.popen("ls " .. d2.state .. "/boxes 2>/dev/null"):read("a")
    assert.are.equal("", left)
    d2.stop()
  end)

  it("keeps shutting down cleanly through repeated SIGTERMs", function()
    local d2 = helper.start_daemon(nil, { pool = 0 })
    finally(function() helper.release(d2) end)
    local c = assert(d2.connect())
    local ids = {}
    for i = 1, 3 do
      ids[i] = assert(call(c, "sandbox.create", {})).id
      assert(call(c, "process.start", { sandbox = ids[i], argv = { "sleep", "1000" } }))
    end
    c:close()
    -- a user hammering Ctrl-C: every signal after the first arrives while
    -- the boxes are being destroyed, some after the loop's last handles
    local exited = sync(function()
      return helper.poll(function()
        if d2.exit_code then return true end
        uv.kill(d2.pid, "sigterm")
      end, nil, 3)
    end)
    assert.is_true(exited, "the daemon did not exit")
    -- 0; or, for a signal landing in the microseconds between the last
    -- signal handle's close and the daemon ignoring them, 143 with nothing
    -- left (below); never a crash
    assert.is_true(d2.exit_code == 0 or d2.exit_code == 143, "exit code " .. tostring(d2.exit_code))
    local left = io.popen("ls " .. d2.state .. "/boxes 2>/dev/null"):read("a")
    assert.are.equal("", left)
    for i = 1, 3 do assert.are.equal(0, box_procs(ids[i])) end
    d2.stop()
  end)
end)
