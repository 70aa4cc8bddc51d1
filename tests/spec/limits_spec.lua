-- Safe by default (issue 19, docs/limits.md): every box gets default
-- limits (memory, cpus, pids, disk, lifetime) relative to the host, shown
-- by sandbox.get and really set on its cgroup and disk, overridable per
-- create (0: none) and narrowed by a policy; the daemon's own caps
-- (sandboxes, committed memory, connections, requests and streams per
-- connection, the idle timeout) each refuse with an error that names the
-- cap, its value and its option; an OOM kill is reported as such.
local uv = require("luv")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local helper = require("helper")

local sync = helper.sync
local call = helper.call

local MiB, GiB = 1048576, 1073741824
local PROBE = os.getenv("TUPPER_PROBE") or "build/tupper-probe"
local PROBE_IN_BOX = "/usr/local/bin/tupper-probe"

local read_file = helper.read_file

-- A file of box id's cgroup (daemon d) for a controller: the v1 hierarchy's
-- when mounted, else the v2 one; nil when neither has it.
local function cg_read(d, id, ctrl, file)
  local name = "tupper/" .. d.tag .. "-" .. id .. "/" .. file
  local s = read_file("/sys/fs/cgroup/" .. ctrl .. "/" .. name) or read_file("/sys/fs/cgroup/" .. name)
  return s and s:gsub("%s+$", "")
end

local kill_all = helper.kill_sandboxes

local function copy_probe(c, id)
  local bin = assert(read_file(PROBE), "no probe at " .. PROBE .. " (build tupper-probe, set TUPPER_PROBE)")
  local off = 0
  while off < #bin do
    local chunk = bin:sub(off + 1, off + MiB)
    assert(call(c, "fs.write", { sandbox = id, path = PROBE_IN_BOX, data = helper.b64encode(chunk), offset = off }))
    off = off + #chunk
  end
  local r = sync(function() return helper.run(c, id, { "chmod", "755", PROBE_IN_BOX }) end)
  assert.are.equal(0, r.exit_code, r.stderr)
end

-- Runs argv in box id: { stdout, exit = the process.exit notification,
-- signal, exit_code }.
local run = helper.run_exit

-- A raw connection to the daemon's socket (no hello): send(obj), and
-- next_msg() / closed() wait (bounded) for a line or for the daemon's close.
local function raw(socket)
  local p = uv.new_pipe(false)
  local err = sync(function()
    return async.wait(function(cb) p:connect(socket, function(e) cb(e) end) end)
  end)
  if err then p:close(); return nil, err end
  local r = { buf = "", msgs = {}, eof = false }
  p:read_start(function(e, chunk)
    if not chunk then r.eof = true; return end
    r.buf = r.buf .. chunk
    while true do
      local nl = r.buf:find("\n", 1, true)
      if not nl then break end
      r.msgs[#r.msgs + 1] = json.decode(r.buf:sub(1, nl - 1))
      r.buf = r.buf:sub(nl + 1)
    end
  end)
  function r.send(obj) p:write(json.encode(obj) .. "\n") end
  -- several requests in one write: the daemon reads them in one go, before
  -- the agent can answer the first
  function r.send_all(objs)
    local lines = {}
    for i, o in ipairs(objs) do lines[i] = json.encode(o) .. "\n" end
    p:write(table.concat(lines))
  end
  local function wait(pred, ms)
    return sync(function()
      local deadline = helper.now() + (ms or 5000)
      while not pred() and helper.now() < deadline do async.sleep(10) end
      return pred()
    end)
  end
  function r.next_msg(ms)
    if not wait(function() return #r.msgs > 0 end, ms) then return nil end
    return table.remove(r.msgs, 1)
  end
  function r.closed(ms) return wait(function() return r.eof end, ms) end
  function r.close() if not p:is_closing() then p:close() end end
  return r
end

describe("the default limits", function()
  local limits = require("tupper.daemon.limits")

  it("are relative to the host, and the daemon's options replace them", function()
    local small = limits.defaults({ memory = 2 * GiB + 12345, cpus = 1, disk_free = GiB })
    assert.are.same({ memory = 512 * MiB, cpus = 1, pids = 1024, disk = 256 * MiB, timeout = 300 }, small)
    local big = limits.defaults({ memory = 64 * GiB, cpus = 32, disk_free = 1024 * GiB })
    assert.are.same({ memory = GiB, cpus = 2, pids = 1024, disk = 4 * GiB, timeout = 300 }, big)
    local tiny = limits.defaults({ memory = 128 * MiB, cpus = 1, disk_free = 10 * MiB })
    assert.are.same({ 64 * MiB, 64 * MiB }, { tiny.memory, tiny.disk })
    local set = limits.defaults({ memory = 64 * GiB, cpus = 32 },
                                { default_memory = 0, default_pids = 50, default_timeout = 0 })
    assert.are.same({ 0, 50, 0 }, { set.memory, set.pids, set.timeout })
    assert.are.same({ "default_memory", 512 * MiB }, { limits.parse_option("--default-memory", "512M") })
    assert.are.same({ "idle_timeout", 0.5 }, { limits.parse_option("--idle-timeout", "500ms") })
    local k, err = limits.parse_option("--max-sandboxes", "-1")
    assert.is_nil(k)
    assert.matches("--max-sandboxes: wants a number", err, 1, true)
  end)

  it("are a microVM's shape: guest memory, vCPUs and disk", function()
    -- the backends' modules load in the tupper binary only (tupper.core)
    local code, out, err = helper.cli({ "repl", "-e", [[
      local limits = require("tupper.daemon.limits")
      local backends = require("tupper.backend.registry")
      local qemu = require("tupper.backend.microvm.qemu")
      local d = limits.defaults({ memory = 64 * 2^30 // 1, cpus = 32, disk_free = 2^40 // 1 })
      -- a host without cgroups nor loop devices: the VM's shape holds all the same
      local blim = backends.limits(limits.for_backend(limits.effective({}, d, {}, backends.get("microvm"))))
      local mem, cpus = qemu.sizes(blim)
      local l = limits.effective({}, d, { memory = true }, backends.get("linux"))
      print(mem, cpus, blim.disk, blim.pids, l.memory, l.cpus, l.pids, l.disk, l.timeout)
    ]] })
    assert.are.equal(0, code, err)
    -- guest memory 1 GiB, 2 vCPUs, a 4 GiB disk, pids in the guest; a linux
    -- box on that host keeps only what it can enforce (memory here)
    assert.are.equal(table.concat({ GiB, 2, 4 * GiB, 1024, GiB, "nil", "nil", "nil", 300 }, "\t") .. "\n", out)
  end)
end)

describe("a daemon's default limits", function()
  local d, c
  local host_mem, host_cpus

  setup(function()
    d, c = helper.daemon_and_client()
    host_mem = uv.get_total_memory() // MiB * MiB
    host_cpus = uv.available_parallelism and uv.available_parallelism() or #uv.cpu_info()
  end)
  teardown(function()
    helper.stop_daemon_and_client(d, c)
    helper.drain()
  end)
  after_each(function() kill_all(c) end)

  local function expect_defaults(info)
    local lim = info.limits
    assert.are.equal(math.max(64 * MiB, math.min(GiB, host_mem // 4 // MiB * MiB)), lim.memory)
    assert.are.equal(math.min(2, host_cpus), lim.cpus)
    assert.are.equal(1024, lim.pids)
    local st = uv.fs_statfs(d.state)
    local free_q = (st.bavail * st.bsize) // 4 // MiB * MiB
    assert.are.equal(math.max(64 * MiB, math.min(4 * GiB, free_q)), lim.disk)
    assert.are.equal(300, info.timeout)
  end

  it("shows them in sandbox.get and sets them on the box, pooled or not", function()
    -- the first create takes a pool box, the ones after it outrun the refill
    local ids = {}
    for i = 1, 4 do ids[i] = assert(call(c, "sandbox.create", {})).id end
    for _, id in ipairs(ids) do
      local info = assert(call(c, "sandbox.get", { id = id }))
      expect_defaults(info)
      local mem = cg_read(d, id, "memory", "memory.limit_in_bytes") or cg_read(d, id, "memory", "memory.max")
      assert.are.equal(info.limits.memory, tonumber(mem), "the box's memory limit in its cgroup")
      assert.are.equal("1024", cg_read(d, id, "pids", "pids.max"))
      local quota = cg_read(d, id, "cpu", "cpu.cfs_quota_us")
      if quota then
        assert.are.equal(tostring(math.floor(info.limits.cpus * 100000)), quota)
      else
        assert.are.equal(("%d 100000"):format(math.floor(info.limits.cpus * 100000)), cg_read(d, id, "cpu", "cpu.max"))
      end
      -- the writable layer is a subvolume of the btrfs pool limited to the
      -- default size (its qgroup: df shows the pool), or an ext4 disk of it
      local sv = d.state .. "/pool/boxes/" .. id
      if (helper.read_file(d.log) or ""):find("disk pool: btrfs at", 1, true) then
        local p = io.popen("btrfs qgroup show -re --raw '" .. sv .. "' 2>&1")
        local out = p:read("a")
        p:close()
        local id0 = ("0/%d"):format(tonumber(io.popen("btrfs inspect-internal rootid '" .. sv .. "'"):read("a")))
        local max = out:match(id0:gsub("/", "%%/") .. "%s+%d+%s+%d+%s+(%d+)")
        assert.are.equal(info.limits.disk, tonumber(max), "the qgroup of " .. id .. ": " .. out)
      else
        local r = run(c, id, { "df", "-k", "/" })
        local kb = tonumber(r.stdout:match("\n%S+%s+(%d+)"))
        assert(kb and kb * 1024 <= info.limits.disk and kb * 1024 > info.limits.disk * 0.9,
               "df of / in the box: " .. r.stdout)
      end
    end
  end)

  it("are overridden per create, 0 or \"unlimited\" for none", function()
    local sb = assert(call(c, "sandbox.create", { limits = { memory = "256M", pids = 100, cpus = 0.5,
                                                              disk = "128M", timeout = "1m" } }))
    local info = assert(call(c, "sandbox.get", { id = sb.id }))
    assert.are.same({ memory = 256 * MiB, pids = 100, cpus = 0.5, disk = 128 * MiB }, info.limits)
    assert.are.equal(60, info.timeout)
    assert.are.equal(256 * MiB, tonumber(cg_read(d, sb.id, "memory", "memory.limit_in_bytes")
                                         or cg_read(d, sb.id, "memory", "memory.max")))
    assert.are.equal("100", cg_read(d, sb.id, "pids", "pids.max"))
    local none = assert(call(c, "sandbox.create", { limits = { memory = 0, pids = "unlimited", cpus = 0,
                                                                disk = "0", timeout = 0 } }))
    info = assert(call(c, "sandbox.get", { id = none.id }))
    assert.are.same({ memory = 0, pids = 0, cpus = 0, disk = 0 }, info.limits)
    assert.are.equal(0, info.timeout)
    assert.are.equal("max", cg_read(d, none.id, "pids", "pids.max"))
    local mem = cg_read(d, none.id, "memory", "memory.limit_in_bytes") or cg_read(d, none.id, "memory", "memory.max")
    assert(mem == "max" or tonumber(mem) > 1 << 60, "an unlimited box's memory limit: " .. tostring(mem))
    local _, err = call(c, "sandbox.create", { limits = { memory = "1M" } })
    assert.matches("'limits.memory' must be at least 4M", err.message, 1, true)
  end)

  it("are narrowed by a policy: the lower of default and cap, a request above the cap refused", function()
    local low = { source = "return policy { max = { memory = '128M', pids = 2000 } }", name = "/p/tupper.lua" }
    local info = assert(call(c, "sandbox.create", { policy = low }))
    assert.are.equal(128 * MiB, info.limits.memory) -- the cap, under the default
    assert.are.equal(1024, info.limits.pids)        -- the default, under the cap
    local _, err = call(c, "sandbox.create", { policy = low, limits = { memory = 0 } })
    assert.are.equal(-32005, err.code)
    assert.are.equal("policy /p/tupper.lua: max.memory is 128M, asked 0 (no limit)", err.message)
    _, err = call(c, "sandbox.create", { policy = low, limits = { pids = 4096 } })
    assert.are.equal("policy /p/tupper.lua: max.pids is 2000, asked 4096", err.message)
  end)
end)

describe("a daemon with small defaults", function()
  local d, c

  setup(function()
    d, c = helper.daemon_and_client(nil, { args = { "--default-memory", "64M", "--default-pids", "64",
                                                   "--default-disk", "64M" } })
  end)
  teardown(function()
    helper.stop_daemon_and_client(d, c)
    helper.drain()
  end)
  after_each(function() kill_all(c) end)

  it("stops a fork bomb at the default pids cap", function()
    local id = assert(call(c, "sandbox.create", {})).id
    copy_probe(c, id)
    local r = run(c, id, { PROBE_IN_BOX, "forkbomb", "2000" })
    local count, errno = r.stdout:match("forkbomb%s+STOPPED count=(%d+) errno=(%S+)")
    assert(count, "the fork bomb was not stopped: " .. r.stdout)
    assert.are.equal("EAGAIN", errno)
    assert(tonumber(count) < 64, "forked " .. count .. " processes under a default of 64")
    assert.are.equal("alive\n", run(c, id, { "echo", "alive" }).stdout)
  end)

  it("OOM-kills a 2 GiB allocation and says so, in the exit and in sandbox.metrics", function()
    local id = assert(call(c, "sandbox.create", {})).id
    local before = assert(call(c, "sandbox.metrics", { id = id }))
    assert.are.equal(0, before.oom_kills)
    -- busybox dd allocates its block and fills it from /dev/zero
    local r = run(c, id, { "dd", "if=/dev/zero", "of=/dev/null", "bs=2G", "count=1" })
    assert.are.same({ 9, true }, { r.signal, r.exit.oom_killed }, "exit " .. json.encode(r.exit))
    local after = assert(call(c, "sandbox.metrics", { id = id }))
    assert.are.equal(1, after.oom_kills)
    -- a process that ends otherwise is not reported as OOM-killed
    r = run(c, id, { "sh", "-c", "kill -9 $$" })
    assert.are.same({ 9 }, { r.signal, r.exit.oom_killed })
    assert.are.equal(1, assert(call(c, "sandbox.metrics", { id = id })).oom_kills)
    -- the CLI says why its command died (a shell's 137 counts too)
    local code, _, stderr = helper.cli({ "--socket", d.socket, "run", "--", "sh", "-c",
                                         "dd if=/dev/zero of=/dev/null bs=512M count=1; exit $?" })
    assert.are.equal(137, code)
    assert.matches("killed: out of memory", stderr, 1, true)
  end)

  it("stops dd past the default disk cap with EDQUOT (btrfs pool) or ENOSPC (ext4 image)", function()
    local id = assert(call(c, "sandbox.create", {})).id
    local r = run(c, id, { "sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; " ..
                           "echo rc=$?; ls -l /tmp/fill" })
    if (helper.read_file(d.log) or ""):find("disk pool: btrfs at", 1, true) then
      assert.matches("Disk quota exceeded", r.stdout, 1, true)
    else
      assert.matches("No space left on device", r.stdout, 1, true)
    end
    local size = tonumber(r.stdout:match("%s(%d+)%s+%a+%s+%d+%s+[%d:]+%s+/tmp/fill"))
    assert(size and size <= 64 * MiB, "wrote more than the 64M cap: " .. r.stdout)
  end)
end)

describe("a daemon's caps", function()
  local d, c

  setup(function()
    d, c = helper.daemon_and_client(nil, { pool = 0, args = { "--default-memory", "64M", "--max-sandboxes", "2",
      "--max-memory", "192M", "--max-requests", "2", "--max-streams", "1" } })
  end)
  teardown(function()
    helper.stop_daemon_and_client(d, c)
    helper.drain()
  end)
  after_each(function() kill_all(c) end)

  it("refuse a sandbox past --max-sandboxes", function()
    assert(call(c, "sandbox.create", {}))
    assert(call(c, "sandbox.create", { limits = { memory = 0 } }))
    local _, err = call(c, "sandbox.create", {})
    assert.are.equal(-32004, err.code)
    assert.are.equal("too many sandboxes (2 live): this daemon's cap is 2 (tupper daemon --max-sandboxes)",
                     err.message)
    assert.are.same({ cap = "sandboxes", value = 2, option = "--max-sandboxes" }, err.data)
  end)

  -- the caps' running totals (daemon/caps.lua): creates pipelined on four
  -- connections at once, round after round with kills between, never get
  -- past the cap, and the totals come back each time to what a kill left
  it("hold against pipelined creates from several connections, round after round", function()
    for round = 1, 3 do
      local conns, ok, refused = {}, 0, 0
      for i = 1, 4 do
        conns[i] = assert(raw(d.socket))
        conns[i].send_all({ { jsonrpc = "2.0", id = 1, method = "sandbox.create", params = {} },
                            { jsonrpc = "2.0", id = 2, method = "sandbox.create", params = {} } })
      end
      for i = 1, 4 do
        for _ = 1, 2 do
          local m = assert(conns[i].next_msg(20000), "a reply to each create")
          if m.error then
            assert.are.equal(-32004, m.error.code, m.error.message)
            refused = refused + 1
          else
            ok = ok + 1
          end
        end
        conns[i].close()
      end
      assert.are.same({ 2, 6 }, { ok, refused }, "round " .. round)
      assert.are.equal(2, #assert(call(c, "sandbox.list", {})).sandboxes)
      kill_all(c)
    end
    -- and after the kills, the cap's two fit again
    assert(call(c, "sandbox.create", {}))
    assert(call(c, "sandbox.create", {}))
  end)

  it("refuse memory limits totalling more than --max-memory (an unlimited box commits none)", function()
    assert(call(c, "sandbox.create", {}))
    local _, err = call(c, "sandbox.create", { limits = { memory = "150M" } })
    assert.are.equal(-32004, err.code)
    assert.are.equal("the sandboxes' memory limits would total 214M, over the daemon's cap: "
      .. "this daemon's cap is 192M (tupper daemon --max-memory)", err.message)
    assert(call(c, "sandbox.create", { limits = { memory = "128M" } }))
  end)

  it("refuse requests past --max-requests in flight on one connection", function()
    local id = assert(call(c, "sandbox.create", {})).id
    local r = assert(raw(d.socket))
    local reqs = {}
    for i = 1, 4 do
      reqs[i] = { jsonrpc = "2.0", id = i, method = "fs.list", params = { sandbox = id, path = "/" } }
    end
    r.send_all(reqs)
    local busy, ok = {}, {}
    for _ = 1, 4 do
      local m = assert(r.next_msg(), "a reply to each request")
      if m.error then busy[#busy + 1] = m else ok[#ok + 1] = m end
    end
    r.close()
    assert.are.equal(2, #ok)
    assert.are.equal(2, #busy)
    assert.are.equal(-32004, busy[1].error.code)
    assert.are.equal("too many requests in flight on this connection (2): this daemon's cap is 2 "
      .. "(tupper daemon --max-requests)", busy[1].error.message)
  end)

  it("refuse a stream past --max-streams on one connection", function()
    local id = assert(call(c, "sandbox.create", {})).id
    assert(call(c, "fs.watch", { sandbox = id, path = "/tmp" }))
    local _, err = call(c, "fs.watch", { sandbox = id, path = "/" })
    assert.are.equal(-32004, err.code)
    assert.are.equal("too many watches, process attachments and port forwards on this connection (1): "
      .. "this daemon's cap is 1 (tupper daemon --max-streams)", err.message)
    _, err = call(c, "sandbox.expose", { id = id, port = 8000 })
    assert.are.same({ -32004, "streams" }, { err.code, err.data.cap })
    -- another connection has its own: a port forward counts too
    local c2 = assert(d.connect())
    assert(call(c2, "sandbox.expose", { id = id, port = 8000 }))
    _, err = call(c2, "fs.watch", { sandbox = id, path = "/" })
    assert.are.same({ -32004, "streams" }, { err.code, err.data.cap })
    c2:close()
  end)
end)

describe("a daemon's connection caps", function()
  local d

  setup(function()
    -- an idle timeout the four connects below fit in on a loaded host (at
    -- 0.5 s the first was sometimes closed before the fourth came)
    d = helper.start_daemon(nil, { pool = 0, args = { "--max-clients", "3", "--idle-timeout", "1.5" } })
  end)
  teardown(function()
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  it("tell a client past --max-clients why, and let one in once idle ones are closed", function()
    local a, b, e = assert(raw(d.socket)), assert(raw(d.socket)), assert(raw(d.socket))
    local x = assert(raw(d.socket))
    local m = assert(x.next_msg(), "the refused client is told why")
    assert.are.equal(-32004, m.error.code)
    assert.are.equal("too many connections: this daemon's cap is 3 (tupper daemon --max-clients)", m.error.message)
    assert(x.closed(), "and disconnected")
    x.close()
    -- nothing going on: both are closed after the idle timeout
    assert(a.closed(6000), "an idle connection is closed")
    assert(b.closed(6000), "an idle connection is closed")
    assert(e.closed(6000), "an idle connection is closed")
    a.close(); b.close(); e.close()
    local y = assert(raw(d.socket))
    y.send({ jsonrpc = "2.0", id = 1, method = "hello", params = {} })
    m = assert(y.next_msg())
    assert.are.equal("tupper", m.result and m.result.server)
    y.close()
  end)

  it("keep a connection whose box dies with it, that has a process or made a live box, however quiet", function()
    local owner = assert(raw(d.socket))
    owner.send({ jsonrpc = "2.0", id = 1, method = "sandbox.create", params = { kill_on_disconnect = true } })
    local m = assert(owner.next_msg(15000))
    local id = assert(m.result, json.encode(m)).id
    local maker = assert(raw(d.socket))
    maker.send({ jsonrpc = "2.0", id = 1, method = "sandbox.create", params = {} })
    m = assert(maker.next_msg(15000))
    local made = assert(m.result, json.encode(m)).id
    local runner = assert(raw(d.socket))
    runner.send({ jsonrpc = "2.0", id = 1, method = "process.start",
                  params = { sandbox = made, argv = { "sleep", "1" } } })
    assert(assert(runner.next_msg()).result)
    assert.is_false(owner.closed(2500), "the owner of a box was closed as idle")
    assert.is_false(maker.closed(100), "the maker of a live box was closed as idle")
    assert.is_false(runner.closed(100), "a connection that ran a process in a live box was closed as idle")
    -- once the box is gone, its maker and the runner are idle
    runner.send({ jsonrpc = "2.0", id = 2, method = "sandbox.kill", params = { id = made } })
    assert(runner.closed(6000), "the runner is closed once idle")
    assert(maker.closed(6000), "and so is the maker of a box that is gone")
    owner.send({ jsonrpc = "2.0", id = 2, method = "sandbox.get", params = { id = id } })
    assert(assert(owner.next_msg()).result)
    runner.close()
    maker.close()
    owner.close()
    -- the box went with its owner
    local c = assert(d.connect())
    sync(function() helper.poll(function() return #c:call("sandbox.list", {}).sandboxes == 0 end, nil, 20) end)
    assert.are.equal(0, #assert(call(c, "sandbox.list", {})).sandboxes)
    c:close()
  end)
end)
