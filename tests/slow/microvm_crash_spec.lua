-- The microvm backend's microVMs and the crash of their daemon
-- (docs/microvm.md).  Boots microVMs (TCG here): slow.  The guest kernel is
-- fetched into the spec's temp dir unless TUPPER_VM_CACHE names a cache to
-- reuse.
local uv = require("luv")
local async = require("tupper.util.async")
local helper = require("helper")
local vm = require("microvm_helper")

local sync = helper.sync
local qemu_alive = vm.qemu_alive

-- A daemon killed with SIGKILL (tests/spec/crash_spec.lua for the linux
-- backend): a microVM outlives it and the next daemon re-adopts it, or
-- removes it when it cannot be proved to be what its record says.
describe("a microVM whose daemon crashed", function()
  local vm_undo, dir, d

  setup(function()
    vm_undo = vm.vm_setup(300000)
  end)

  teardown(function()
    helper.release(d)
    if dir then helper.rmrf(dir) end
    if vm_undo then vm_undo() end
    uv.os_unsetenv("TUPPER_VM_GRACE")
    helper.drain()
  end)

  -- a failed test leaves no daemon (nor its VMs) behind: one that failed
  -- after its crash and before the restart has its state restarted and
  -- stopped, so the QEMU it left goes too
  after_each(function()
    helper.release(d)
    d = nil
  end)

  -- the cgroup dirs QEMU is in (/sys/fs/cgroup/...), to check they go
  local function cgroup_dirs(pid)
    local dirs = {}
    for line in (helper.read_file("/proc/" .. pid .. "/cgroup") or ""):gmatch("[^\n]+") do
      local ctrl, path = line:match("^%d+:([^:]*):(/.*)$")
      if path and path:find("tupper", 1, true) then
        local base = ctrl == "" and "/sys/fs/cgroup" or "/sys/fs/cgroup/" .. ctrl:gsub("^name=", "")
        dirs[#dirs + 1] = base .. path
      end
    end
    return dirs
  end
  local function start_vm()
    dir = helper.tmpdir()
    d = helper.start_daemon(dir, { pool = 0 })
    local c = assert(d.connect())
    local sb, err = helper.call(c, "sandbox.create", { backend = "microvm" })
    assert(sb, err and err.message)
    local rec = vm.record(d, sb.id)
    local pid = math.tointeger(rec.pid)
    assert.is_true(qemu_alive(pid))
    return c, sb.id, pid, rec
  end
  -- the crash: QEMU outlives its daemon
  local function crash(c, pid)
    c:close()
    d.crash()
    assert.is_true(qemu_alive(pid), "QEMU died with its daemon")
  end
  local function wait_dead(pid, ms)
    return sync(function()
      for _ = 1, ms // 100 do
        if vm.dead(pid) then return true end
        async.sleep(100)
      end
      return false
    end)
  end
  local function assert_nothing_left(id, pid, cgs)
    assert.is_false(qemu_alive(pid))
    assert.is_nil(uv.fs_stat(d.state .. "/boxes/" .. id), "the VM's dir (socket, disk) is left")
    assert.is_nil(uv.fs_stat(d.state .. "/boxes/" .. id .. ".json"))
    for _, cg in ipairs(cgs) do assert.is_nil(uv.fs_stat(cg), cg .. " is left") end
  end
  -- the end of a case: nothing of the VM left, then a clean daemon stop
  local function finish(c, id, pid, cgs)
    assert_nothing_left(id, pid, cgs)
    c:close()
    assert.are.equal(0, d.stop())
    d = nil
  end
  local function restart()
    d = helper.start_daemon(dir, { pool = 0 })
    return assert(d.connect())
  end

  it("is re-adopted by the next daemon, its processes, output and files included", function()
    local c, id, pid = start_vm()
    local cgs = cgroup_dirs(pid)
    assert.is_true(#cgs > 0)
    assert(helper.call(c, "fs.write", { sandbox = id, path = "/kept.txt", data = "still here", encoding = "utf8" }))
    local bg = assert(helper.call(c, "process.start", { sandbox = id,
      argv = { "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tick.new; mv /tick.new /tick; echo tick $i; sleep 0.2; done" } }))
    crash(c, pid)
    -- what the guest says while no daemon listens (the agent's detach
    -- message on its console) must not hurt QEMU, whose console reader is gone
    sync(function() async.sleep(1000) end)
    assert.is_true(qemu_alive(pid))

    c = restart()
    assert.matches("sandbox " .. id .. " re%-adopted %(1 processes%)", helper.read_file(d.log))
    local info = assert(helper.call(c, "sandbox.get", { id = id }))
    assert.are.equal("running", info.state)
    assert.are.equal("microvm", info.backend)
    local listed = false
    for _, s in ipairs(assert(helper.call(c, "sandbox.list", {})).sandboxes) do listed = listed or s.id == id end
    assert.is_true(listed)
    local procs = assert(helper.call(c, "process.list", { sandbox = id })).processes
    assert.are.equal(1, #procs)
    assert.are.equal(bg.pid, procs[1].pid)
    -- still running: its file keeps growing, and its output can be followed
    local function tick()
      local r = assert(helper.call(c, "fs.read", { sandbox = id, path = "/tick", encoding = "utf8" }))
      return tonumber(r.data)
    end
    local t1 = tick()
    sync(function() async.sleep(1500) end)
    assert.is_true(tick() > t1)
    local got
    c:on("process.output", function(p)
      if p.sandbox == id and p.pid == bg.pid and p.data:match("tick %d+") then got = true end
    end)
    assert(helper.call(c, "process.connect", { sandbox = id, pid = bg.pid, encoding = "utf8" }))
    sync(function()
      for _ = 1, 100 do
        if got then return end
        async.sleep(100)
      end
    end)
    assert.is_true(got, "no output from the re-attached process")
    local r = assert(helper.call(c, "fs.read", { sandbox = id, path = "/kept.txt", encoding = "utf8" }))
    assert.are.equal("still here", r.data)
    local out = sync(function() return helper.run(c, id, { "echo", "adopted" }) end)
    assert.are.equal("adopted\n", out.stdout)
    -- and the next crash is survived too: the record was written again
    assert.are.equal(pid, math.tointeger(vm.record(d, id).pid))
    assert(helper.call(c, "process.signal", { sandbox = id, pid = bg.pid, signal = "KILL" }))
    assert.truthy(helper.call(c, "sandbox.kill", { id = id }).killed)
    finish(c, id, pid, cgs)
  end)

  it("still goes with its daemon on a clean stop (SIGTERM), as a linux box does", function()
    local c, _, pid = start_vm()
    local cgs = cgroup_dirs(pid)
    c:close()
    -- (the state dir goes with the test daemon's dir: QEMU and its cgroup are what tell)
    assert.are.equal(0, d.stop())
    d = nil
    assert.is_false(qemu_alive(pid))
    for _, cg in ipairs(cgs) do assert.is_nil(uv.fs_stat(cg), cg .. " is left") end
  end)

  it("is re-adopted paused when it was paused, and resumes", function()
    -- QEMU is frozen whole: the guest sees its host end close and reopen
    -- only once thawed, back to back (VM_ATTACH's case)
    local c, id, pid = start_vm()
    local cgs = cgroup_dirs(pid)
    local bg = assert(helper.call(c, "process.start", { sandbox = id, argv = { "sleep", "1000" } }))
    assert.are.equal("paused", assert(helper.call(c, "sandbox.pause", { id = id })).state)
    crash(c, pid)
    c = restart()
    assert.matches("sandbox " .. id .. " re%-adopted %(1 processes%)", helper.read_file(d.log))
    assert.are.equal("paused", assert(helper.call(c, "sandbox.get", { id = id })).state)
    assert.are.equal("running", assert(helper.call(c, "sandbox.resume", { id = id })).state)
    local procs = assert(helper.call(c, "process.list", { sandbox = id })).processes
    assert.are.equal(1, #procs)
    assert.are.equal(bg.pid, procs[1].pid)
    local out = sync(function() return helper.run(c, id, { "echo", "thawed" }) end)
    assert.are.equal("thawed\n", out.stdout)
    assert.truthy(helper.call(c, "sandbox.kill", { id = id }).killed)
    finish(c, id, pid, cgs)
  end)

  it("is removed with a clear message when its QEMU died while no daemon ran", function()
    local c, id, pid = start_vm()
    local cgs = cgroup_dirs(pid)
    crash(c, pid)
    uv.kill(pid, "sigkill")
    assert.is_true(wait_dead(pid, 10000))
    c = restart()
    assert.matches("sandbox " .. id .. " cannot be re%-adopted %([^\n]*QEMU %(pid " .. pid .. "%) is gone[^\n]*%): removing it",
      helper.read_file(d.log))
    local _, err = helper.call(c, "sandbox.get", { id = id })
    assert.is_not_nil(err)
    finish(c, id, pid, cgs)
  end)

  it("powers off when no daemon comes back within the grace period, and the next daemon cleans up", function()
    uv.os_setenv("TUPPER_VM_GRACE", "3")
    local c, id, pid = start_vm()
    uv.os_unsetenv("TUPPER_VM_GRACE")
    local cgs = cgroup_dirs(pid)
    crash(c, pid)
    -- a guest under TCG on a loaded machine: its 3 s are slow ones
    assert.is_true(wait_dead(pid, 120000), "the guest did not power off after its grace period")
    c = restart()
    assert.matches("sandbox " .. id .. " cannot be re%-adopted", helper.read_file(d.log))
    finish(c, id, pid, cgs)
  end)

  it("never adopts nor kills an unrelated process a tampered record names", function()
    local c, id, pid, rec = start_vm()
    local cgs = cgroup_dirs(pid)
    crash(c, pid)
    -- an unrelated process with QEMU's uid: only its cgroup, and the socket's
    -- listener, tell it from the VM's QEMU
    local quid = math.tointeger(rec.vm.uid)
    local other, opid = uv.spawn("/usr/bin/setpriv", { args = { "--reuid=" .. quid, "--regid=" .. quid,
      "--clear-groups", "/bin/sleep", "1000" } }, function() end)
    assert(other, opid)
    finally(function() -- the unrelated process, whatever the checks say
      uv.kill(opid, "sigkill")
      if not other:is_closing() then other:close() end
    end)
    local function start_time(p)
      local s = helper.read_file("/proc/" .. p .. "/stat") or ""
      local fields = {}
      for f in s:match("%) (.*)$"):gmatch("%S+") do fields[#fields + 1] = f end
      return math.tointeger(tonumber(fields[20]))
    end
    local ostart
    sync(function()
      for _ = 1, 100 do -- until setpriv has exec'd sleep as quid
        local st = helper.read_file("/proc/" .. opid .. "/status") or ""
        if st:match("Uid:%s*" .. quid) and (helper.read_file("/proc/" .. opid .. "/cmdline") or ""):find("sleep") then break end
        async.sleep(20)
      end
    end)
    ostart = start_time(opid)
    local path = d.state .. "/boxes/" .. id .. ".json"
    rec.pid = opid
    rec.vm.start_time = ostart
    local f = assert(io.open(path, "w"))
    f:write(require("cjson").encode(rec))
    f:close()
    c = restart()
    assert.matches("sandbox " .. id .. " cannot be re%-adopted %([^\n]*not in the VM's cgroup", helper.read_file(d.log))
    -- the unrelated process lives on, untouched; the VM's QEMU went with its cgroup
    assert.are.equal(ostart, start_time(opid))
    assert_nothing_left(id, pid, cgs)
    c:close()
    assert.are.equal(0, d.stop())
    d = nil
  end)
end)
