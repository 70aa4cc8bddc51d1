-- The microvm backend's own checks (docs/microvm.md): a kernel of its own,
-- a guest panic and a QEMU crash surface as a clear sandbox error and leave
-- nothing, killing a sandbox leaves no QEMU and no files, a guest flooding
-- its console or its output cannot grow the daemon's memory.  The shared
-- API behaviour is tested by the backend matrix (backend_matrix_spec.lua).
-- Boots microVMs (TCG here): slow.  The guest kernel is fetched into the
-- spec's temp dir unless TUPPER_VM_CACHE names a cache to reuse.
local uv = require("luv")
local async = require("tupper.async")
local helper = require("helper")

local sync = helper.sync

local function qemu_alive(pid)
  local s = helper.read_file("/proc/" .. pid .. "/cmdline") or ""
  return s:find("qemu%-system") ~= nil
end

local function rss_kb(pid)
  local s = helper.read_file("/proc/" .. pid .. "/status") or ""
  return tonumber(s:match("VmRSS:%s*(%d+)")) or 0
end

describe("the microvm backend", function()
  local d, c, cache_dir
  local saved_timeout = helper.TIMEOUT_MS

  setup(function()
    helper.TIMEOUT_MS = 300000 -- cold boots under TCG emulation, on a loaded machine
    if not os.getenv("TUPPER_VM_CACHE") then
      cache_dir = helper.tmpdir()
      uv.os_setenv("TUPPER_VM_CACHE", cache_dir)
    end
    d = helper.start_daemon(nil, { pool = 0 })
    c = assert(d.connect())
  end)

  teardown(function()
    if c then c:close() end
    if d then assert.are.equal(0, d.stop()) end
    if cache_dir then helper.rmrf(cache_dir); uv.os_unsetenv("TUPPER_VM_CACHE") end
    helper.TIMEOUT_MS = saved_timeout
    helper.drain()
  end)

  local function call(method, params) return helper.call(c, method, params) end
  local function run(id, argv, opts) return sync(function() return helper.run(c, id, argv, opts) end) end
  local function create(limits)
    local sb, err = call("sandbox.create", { backend = "microvm", limits = limits })
    assert(sb, err and err.message)
    assert.are.equal("microvm", sb.backend)
    return sb.id
  end
  local function record(id)
    local text = assert(helper.read_file(d.state .. "/boxes/" .. id .. ".json"))
    return require("cjson").decode(text)
  end
  -- waits until the daemon dropped sandbox id on its own and finished
  -- removing it (its directory goes last)
  local function wait_gone(id)
    sync(function()
      for _ = 1, 600 do
        local _, err = c:call("sandbox.get", { id = id })
        if err and not uv.fs_stat(d.state .. "/boxes/" .. id) then return end
        async.sleep(100)
      end
      error("sandbox " .. id .. " did not go away")
    end)
  end

  it("runs commands under a kernel of its own, with limits as guest memory, vCPUs and disk", function()
    local id = create({ memory = "256M", cpus = 2, disk = "64M" })
    local host = helper.read_file("/proc/sys/kernel/osrelease"):gsub("%s+$", "")
    local r = run(id, "uname -r; nproc; hostname; id -u; awk '/MemTotal/ {print $2}' /proc/meminfo")
    assert.are.equal(0, r.exit_code)
    local kernel, ncpu, host_name, uid, mem = r.stdout:match("^(%S+)\n(%d+)\n(%S+)\n(%d+)\n(%d+)\n$")
    assert.is_not_nil(kernel, r.stdout)
    assert.are_not.equal(host, kernel)
    assert.are.equal("2", ncpu)
    assert.are.equal(id, host_name)
    assert.are.equal("0", uid)
    assert.is_true(tonumber(mem) < 256 * 1024 and tonumber(mem) > 128 * 1024, mem)
    -- the disk limit is the writable layer's size
    r = run(id, "dd if=/dev/zero of=/fill bs=1M count=100 2>&1; echo rc=$?")
    assert.matches("No space left on device", r.stdout)
    -- no network device but lo, no guest NIC at all
    r = run(id, "ls /sys/class/net")
    assert.are.equal("lo\n", r.stdout)
    assert.truthy(call("sandbox.kill", { id = id }).killed)
  end)

  it("masks the guest's /proc as a linux box's is: a box process cannot use kmsg or kernel knobs", function()
    local id = create()
    -- each write would work for root in the guest (DAC) without the masks:
    -- core_pattern would run a program of the box's with every capability;
    -- drop_caches only drops caches.  (sysrq-trigger stays: it reaches only
    -- this guest; the panic case uses it.)
    local r = run(id, "(echo '|/bin/sh' > /proc/sys/kernel/core_pattern) 2>&1; echo rc=$?; " ..
      "(echo 3 > /proc/sys/vm/drop_caches) 2>&1; echo rc=$?; " ..
      "(head -c 1 /proc/kmsg) 2>&1; echo rc=$?; ls -A /proc/acpi 2>&1 | wc -l")
    assert.are.equal(0, r.exit_code, r.stderr)
    local rcs = {}
    for rc in r.stdout:gmatch("rc=(%d+)") do rcs[#rcs + 1] = tonumber(rc) end
    assert.are.equal(3, #rcs, r.stdout)
    for i, rc in ipairs(rcs) do assert.are_not.equal(0, rc, "step " .. i .. ": " .. r.stdout) end
    assert.matches("Read%-only file system", r.stdout)
    assert.matches("\n0\n$", r.stdout)
    -- reading is still fine where a linux box allows it
    r = run(id, "cat /proc/sys/kernel/osrelease")
    assert.are.equal(0, r.exit_code)
    assert.truthy(call("sandbox.kill", { id = id }).killed)
  end)

  it("leaves no QEMU, no socket and no files once killed", function()
    local id = create()
    local pid = math.tointeger(record(id).pid)
    assert.is_true(qemu_alive(pid))
    -- QEMU runs as an unprivileged uid, not root
    local st = helper.read_file("/proc/" .. pid .. "/status")
    local quid = tonumber(st:match("Uid:%s*(%d+)"))
    assert.is_true(quid >= 100065536, st)
    assert.truthy(call("sandbox.kill", { id = id }).killed)
    assert.is_false(qemu_alive(pid))
    assert.is_nil(uv.fs_stat(d.state .. "/boxes/" .. id))
    assert.is_nil(uv.fs_stat(d.state .. "/boxes/" .. id .. ".json"))
  end)

  it("turns a guest kernel panic into a clear error and cleans up", function()
    local id = create()
    local pid = math.tointeger(record(id).pid)
    -- the shell dies with the guest: its exit comes as a kill
    local r = run(id, "echo c > /proc/sysrq-trigger; sleep 30")
    assert.are_not.equal(0, r.exit_code)
    wait_gone(id)
    assert.is_false(qemu_alive(pid))
    assert.is_nil(uv.fs_stat(d.state .. "/boxes/" .. id))
    local log = helper.read_file(d.log)
    assert.matches("sandbox " .. id .. " went down: the VM stopped [^\n]*guest kernel panic %- not syncing: sysrq triggered crash", log)
  end)

  it("turns a QEMU crash into a clear error and cleans up", function()
    local id = create()
    local pid = math.tointeger(record(id).pid)
    uv.kill(pid, "sigsegv")
    wait_gone(id)
    assert.is_false(qemu_alive(pid))
    assert.is_nil(uv.fs_stat(d.state .. "/boxes/" .. id))
    assert.matches("sandbox " .. id .. " went down: [^\n]*the VM stopped", helper.read_file(d.log))
    local _, err = call("process.start", { sandbox = id, argv = { "true" } })
    assert.is_not_nil(err)
  end)

  it("keeps the daemon's memory flat while the guest floods its console and its output", function()
    local id = create()
    local before = rss_kb(d.pid)
    -- the console: everything the guest's kernel writes to its serial
    -- port (the box has no /dev/console, as a linux box has none; the
    -- kernel's task dump is what it can make it print)
    local r = run(id, "for i in 1 2 3 4 5 6 7 8; do echo t > /proc/sysrq-trigger; done; echo done")
    assert.are.equal("done\n", r.stdout)
    -- the agent channel: output as fast as the guest makes it, read by us
    r = run(id, { "head", "-c", "5000000", "/dev/zero" })
    assert.are.equal(0, r.exit_code)
    local grown = rss_kb(d.pid) - before
    assert.is_true(grown < 64 * 1024, "the daemon grew by " .. grown .. " kB")
    assert.truthy(call("sandbox.kill", { id = id }).killed)
  end)

  it("starts later sandboxes from a snapshot, each with its own clock, name, randomness and disk", function()
    local a = create()
    local snaps = {}
    local req = uv.fs_scandir(d.state .. "/microvm")
    while req do
      local n = uv.fs_scandir_next(req)
      if not n then break end
      if n:match("^snap%-") then snaps[#snaps + 1] = n end
    end
    -- the default shape's (512 MiB, 1 vCPU, 1 GiB disk); the first spec made its own
    local default
    for _, n in ipairs(snaps) do if n:match("%-512%-1%-1024%-r%x+$") then default = n end end
    assert.is_not_nil(default, table.concat(snaps, " "))
    assert.is_not_nil(uv.fs_stat(d.state .. "/microvm/" .. default .. "/vm.state"))
    assert.is_not_nil(uv.fs_stat(d.state .. "/microvm/" .. default .. "/vm.ram"))
    local b = create()
    assert.matches("started from snapshot", helper.read_file(d.log))
    local probe = "hostname; date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"
    local ra, rb = run(a, probe), run(b, probe)
    local na, ta, xa = ra.stdout:match("^(%S+)\n(%d+)\n(%x+)$")
    local nb, tb, xb = rb.stdout:match("^(%S+)\n(%d+)\n(%x+)$")
    assert.are.equal(a, na)
    assert.are.equal(b, nb)
    assert.are_not.equal(xa, xb)
    assert.is_true(math.abs(tonumber(tb) - os.time()) < 30, rb.stdout)
    assert.is_true(math.abs(tonumber(ta) - os.time()) < 30, ra.stdout)
    -- the writable disk is each VM's own
    assert(call("fs.write", { sandbox = a, path = "/root/only-a", data = "a", encoding = "utf8" }))
    assert.are.equal("no\n", run(b, "test -e /root/only-a && echo yes || echo no").stdout)
    -- and so is its memory: both map the snapshot's, copy-on-write (a
    -- tmpfs file lives in guest memory only)
    assert.are.equal(0, run(a, "echo a > /dev/shm/only-a").exit_code)
    assert.are.equal("no\n", run(b, "test -e /dev/shm/only-a && echo yes || echo no").stdout)
    assert.truthy(call("sandbox.kill", { id = a }).killed)
    assert.truthy(call("sandbox.kill", { id = b }).killed)
  end)

  it("never starts a VM on the memory of a snapshot that was removed and made again", function()
    -- the daemon keeps a snapshot's memory loaded; a new snapshot at the
    -- same path (here: the old one removed by hand) must be loaded afresh
    local first = create()
    local dir
    for n in (helper.read_file(d.log) or ""):gmatch("sandbox " .. first .. " started from snapshot (snap%-%S+) in") do dir = n end
    assert.is_not_nil(dir)
    assert.truthy(call("sandbox.kill", { id = first }).killed)
    helper.rmrf(d.state .. "/microvm/" .. dir)
    local again = create() -- makes the snapshot again (a template boot), then starts from it
    assert.is_not_nil(uv.fs_stat(d.state .. "/microvm/" .. dir .. "/vm.ram"))
    local r = run(again, "hostname; echo ok > /root/f; cat /root/f")
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal(again .. "\nok\n", r.stdout)
    local later = create() -- and the next start too
    assert.are.equal(later .. "\n", run(later, "hostname").stdout)
    assert.truthy(call("sandbox.kill", { id = again }).killed)
    assert.truthy(call("sandbox.kill", { id = later }).killed)
  end)

  it("takes a create of the default shape from its microVM pool: a VM of its own, thawed, with its name and clock", function()
    local d2 = helper.start_daemon(nil, { pool = 0, args = { "--vm-pool", "1" } })
    local stopped = false
    finally(function() if not stopped then d2.stop() end end) -- a failed assertion leaves no daemon
    local c2 = assert(d2.connect())
    -- the VMs that entered the pool, in order
    local function pooled_ids()
      local ids = {}
      for id in (helper.read_file(d2.log) or ""):gmatch("microVM pool: sandbox (%x+) ready") do ids[#ids + 1] = id end
      return ids
    end
    -- the pool fills in the background (its first start makes the snapshot)
    local deadline = uv.now() + 240000
    sync(function() while #pooled_ids() < 1 and uv.now() < deadline do async.sleep(100) end end)
    assert.are.equal(1, #pooled_ids())
    local sb = assert(helper.call(c2, "sandbox.create", { backend = "microvm" }))
    -- the pooled VM, started before the create
    assert.are.equal(pooled_ids()[1], sb.id)
    assert.are.equal("running", sb.state)
    local r = sync(function()
      return helper.run(c2, sb.id, "hostname; date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
    end)
    local name, t = r.stdout:match("^(%S+)\n(%d+)\n%x+$")
    assert.are.equal(sb.id, name)
    assert.is_true(math.abs(tonumber(t) - os.time()) < 30, r.stdout)
    -- a create with limits of its own does not take a pooled VM (its shape differs)
    local sized = assert(helper.call(c2, "sandbox.create", { backend = "microvm", limits = { memory = "256M" } }))
    assert.are_not.equal(sb.id, sized.id)
    assert.truthy(helper.call(c2, "sandbox.kill", { id = sb.id }).killed)
    assert.truthy(helper.call(c2, "sandbox.kill", { id = sized.id }).killed)
    -- the refill, then a stop with a frozen VM in the pool leaves no QEMU
    deadline = uv.now() + 240000
    sync(function() while #pooled_ids() < 2 and uv.now() < deadline do async.sleep(100) end end)
    local refill = pooled_ids()[2]
    assert.is_not_nil(refill)
    local function qemus() -- pids of QEMUs whose cgroup names the refilled VM
      local pids = {}
      local req = uv.fs_scandir("/proc")
      while req do
        local n = uv.fs_scandir_next(req)
        if not n then break end
        if n:match("^%d+$") and (helper.read_file("/proc/" .. n .. "/cgroup") or ""):find(refill, 1, true)
            and qemu_alive(n) then
          pids[#pids + 1] = n
        end
      end
      return pids
    end
    assert.are.equal(1, #qemus())
    c2:close()
    stopped = true
    assert.are.equal(0, d2.stop())
    assert.are.same({}, qemus())
  end)

  it("lets its daemon stop cleanly right after a create and a kill", function()
    -- every handle of the backend (helper processes, console, monitor) is
    -- closed by then: one left for lua_close crashed the daemon at exit
    local d2 = helper.start_daemon(nil, { pool = 0 })
    local c2 = assert(d2.connect())
    local sb = assert(helper.call(c2, "sandbox.create", { backend = "microvm" }))
    assert.truthy(helper.call(c2, "sandbox.kill", { id = sb.id }).killed)
    c2:close()
    assert.are.equal(0, d2.stop())
  end)

  it("contains a fork bomb with the pids limit, in the guest's own cgroups, and keeps answering", function()
    local id = create({ pids = 32 })
    -- the shell's forks fail at the limit, which ends that shell (ash), so
    -- the bomb loops; the process itself becomes a sleep that never forks
    local bomb = assert(call("process.start", { sandbox = id,
      cmd = "b() { while :; do b & done; }; b 2>>/tmp/bomb.err & exec sleep 1000" }))
    -- the box fills up to its limit: the guest's kernel refuses a fork
    -- (EAGAIN, which ash reports before that shell ends).  (Probing for a
    -- full box with commands of our own raced the bomb, whose shells end
    -- at the limit and can all end at once, under a loaded TCG.)
    local full = sync(function()
      for _ = 1, 600 do
        local r = c:call("fs.read", { sandbox = id, path = "/tmp/bomb.err", encoding = "utf8" })
        if r and r.data:find("Resource temporarily unavailable", 1, true) then return true end
        async.sleep(100)
      end
    end)
    assert.is_true(full, "the box never reached its pids limit")
    -- the agent is outside the box's cgroup: it answers, and starts a
    -- process (whose own forks fail while the bomb holds every slot)
    local st = assert(call("fs.stat", { sandbox = id, path = "/" }))
    assert.are.equal("dir", st.type)
    local r = run(id, { "cat", "/proc/self/cgroup" })
    assert.are.equal(0, r.exit_code)
    assert.matches("^0::/box/t%d+\n$", r.stdout)
    -- kill takes the bomb's whole tree: when it answers, nothing is left
    assert(call("process.signal", { sandbox = id, pid = bomb.pid, signal = "KILL" }))
    r = run(id, "ps -o args | grep -c -e '^sh -c b()' -e '^sleep 1000' || true")
    assert.are.equal("0\n", r.stdout)
    assert.truthy(call("sandbox.kill", { id = id }).killed)
  end)

  it("sets the pids limit on a VM it takes from its pool", function()
    local d2 = helper.start_daemon(nil, { pool = 0, args = { "--vm-pool", "1" } })
    local c2 = assert(d2.connect())
    local deadline = uv.now() + 240000
    local pooled
    sync(function()
      while not pooled and uv.now() < deadline do
        pooled = (helper.read_file(d2.log) or ""):match("microVM pool: sandbox (%x+) ready")
        async.sleep(100)
      end
    end)
    assert.is_not_nil(pooled)
    local sb = assert(helper.call(c2, "sandbox.create", { backend = "microvm", limits = { pids = 6 } }))
    assert.are.equal(pooled, sb.id)
    local r = sync(function()
      return helper.run(c2, sb.id, "for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; echo all")
    end)
    assert.matches("can't fork", r.stderr)
    assert.is_nil(r.stdout:find("all", 1, true))
    assert.truthy(helper.call(c2, "sandbox.kill", { id = sb.id }).killed)
    c2:close()
    assert.are.equal(0, d2.stop())
  end)

  it("kills a process's whole tree in the guest: a setsid grandchild and a double fork too", function()
    local id = create()
    -- cgroups in the guest (/proc/cgroups counts the whole hierarchy): the
    -- root, box/ and the tree of the process that reads it
    local function ncgroups()
      return tonumber(run(id, { "awk", "$1 == \"pids\" { print $3 }", "/proc/cgroups" }).stdout)
    end
    local n0 = ncgroups()
    assert.is_true(n0 >= 3, tostring(n0))
    local p = assert(call("process.start", { sandbox = id,
      cmd = "sleep 301 & setsid sleep 302 & (sleep 303 &); echo up; wait" }))
    local function count()
      return tonumber(run(id, "ps -o args | grep -c '^sleep 30[123]' || true").stdout)
    end
    sync(function() while count() < 3 do async.sleep(50) end end)
    -- a TERM reaches every process of the tree, not only its group
    assert(call("process.signal", { sandbox = id, pid = p.pid, signal = "TERM" }))
    sync(function() for _ = 1, 100 do if count() == 0 then return end; async.sleep(50) end end)
    assert.are.equal(0, count())
    -- and KILL, the same; process.list forgets the process once it ended
    p = assert(call("process.start", { sandbox = id, cmd = "setsid sleep 304 & (sleep 305 &); wait" }))
    sync(function()
      while tonumber(run(id, "ps -o args | grep -c '^sleep 30[45]' || true").stdout) < 2 do async.sleep(50) end
    end)
    assert(call("process.signal", { sandbox = id, pid = p.pid, signal = "KILL" }))
    assert.are.equal("0\n", run(id, "ps -o args | grep -c '^sleep 30[45]' || true").stdout)
    sync(function()
      for _ = 1, 100 do
        local l = helper.call(c, "process.list", { sandbox = id })
        local left = false
        for _, q in ipairs(l.processes) do left = left or q.pid == p.pid end
        if not left then return end
        async.sleep(50)
      end
    end)
    -- the ended trees' cgroups are gone: when their process is reaped, or,
    -- for one that left a background process, once that ended (it lingers
    -- meanwhile).  The kernel frees a removed cgroup after an RCU grace
    -- period, so its count lags behind: poll.
    local function settles_at(n)
      return sync(function()
        for _ = 1, 100 do
          local got = ncgroups()
          if got == n then return got end
          async.sleep(100)
        end
        return ncgroups()
      end)
    end
    assert.are.equal(n0, settles_at(n0))
    assert.are.equal(0, run(id, "sleep 3 >/dev/null 2>&1 &").exit_code)
    assert.is_true(ncgroups() >= n0 + 1, "the background sleep's tree is gone while it runs")
    assert.are.equal(n0, settles_at(n0))
    assert.truthy(call("sandbox.kill", { id = id }).killed)
  end)
end)

-- A daemon killed with SIGKILL (tests/spec/crash_spec.lua for the linux
-- backend): a microVM outlives it and the next daemon re-adopts it, or
-- removes it when it cannot be proved to be what its record says.
describe("a microVM whose daemon crashed", function()
  local cache_dir, dir, d
  local saved_timeout = helper.TIMEOUT_MS

  setup(function()
    helper.TIMEOUT_MS = 300000
    if not os.getenv("TUPPER_VM_CACHE") then
      cache_dir = helper.tmpdir()
      uv.os_setenv("TUPPER_VM_CACHE", cache_dir)
    end
  end)

  teardown(function()
    if d and not d.exit_code then d.stop() end
    if dir then helper.rmrf(dir) end
    if cache_dir then helper.rmrf(cache_dir); uv.os_unsetenv("TUPPER_VM_CACHE") end
    uv.os_unsetenv("TUPPER_VM_GRACE")
    helper.TIMEOUT_MS = saved_timeout
    helper.drain()
  end)

  -- a failed test leaves no daemon (nor its VMs) behind
  after_each(function()
    if d and not d.exit_code then d.stop() end
    d = nil
  end)

  local function record(id)
    local text = assert(helper.read_file(d.state .. "/boxes/" .. id .. ".json"))
    return require("cjson").decode(text)
  end
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
    local rec = record(sb.id)
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
        if not qemu_alive(pid) then return true end
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
    assert.are.equal(pid, math.tointeger(record(id).pid))
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
    uv.kill(opid, "sigkill")
    other:close()
    c:close()
    assert.are.equal(0, d.stop())
    d = nil
  end)
end)

-- Images of the store on microVMs (docs/microvm.md, root images): layers
-- with whiteouts and an opaque dir, the image config, recipes with setup
-- layers, two images side by side, hostile layers, and the network relay
-- from inside a guest.
describe("the microvm backend with images of the store", function()
  local oci = require("oci_build")
  local json = require("tupper.json")
  local d, c, dir, cache_dir, servers, hp
  local saved_timeout = helper.TIMEOUT_MS
  local APPLETS = { "sh", "cat", "ls", "id", "echo", "pwd", "env", "test", "stat", "find", "wc", "mkdir",
                    "rm", "wget", "head", "tr", "mv" }
  local base = oci.busybox_base(APPLETS)
  local middle = {
    { name = "opt/keep/a", data = "a\n" },
    { name = "opt/gone", data = "gone\n" },
    { name = "data/old", data = "old\n" },
    { name = "data/sub/deep", data = "deep\n" },
    { name = "etc/motd", data = "middle\n" },
  }
  local top = {
    { name = "opt/.wh.gone", data = "" },
    { name = "data/.wh..wh..opq", data = "" },
    { name = "data/new", data = "new\n" },
    { name = "etc/motd", data = "top\n" },
  }
  local CONFIG = {
    Env = { "PATH=/bin", "GREETING=hello" },
    Entrypoint = { "/bin/sh", "-c" },
    Cmd = { "echo $GREETING from $(pwd) as $(id -u):$(id -g) home $HOME" },
    WorkingDir = "/opt",
    User = "app",
  }

  local function call(method, params) return helper.call(c, method, params) end
  local function run(id, script, opts)
    return sync(function() return helper.run(c, id, { "/bin/sh", "-c", script }, opts) end)
  end
  local function create(params)
    params.backend = "microvm"
    local sb, err = call("sandbox.create", params)
    assert(sb, err and err.message)
    assert.are.equal("microvm", sb.backend)
    return sb.id
  end
  local function import(name, layers, config, daemon)
    local path = dir .. "/" .. name:gsub("[^%w]", "_")
    oci.oci_layout(path, layers, config or { Env = { "PATH=/bin" } })
    local code, out, err = helper.cli({ "--socket", (daemon or d).socket, "import", path, name })
    assert.are.equal(0, code, err)
    return out
  end
  local function names(pattern, state)
    local out = {}
    local req = uv.fs_scandir((state or d.state) .. "/microvm")
    while req do
      local n = uv.fs_scandir_next(req)
      if not n then break end
      if n:match(pattern) then out[#out + 1] = n end
    end
    table.sort(out)
    return out
  end

  setup(function()
    helper.TIMEOUT_MS = 600000 -- root image builds and cold boots under TCG, on a loaded machine
    if not os.getenv("TUPPER_VM_CACHE") then
      cache_dir = helper.tmpdir()
      uv.os_setenv("TUPPER_VM_CACHE", cache_dir)
    end
    dir = helper.tmpdir()
    -- an HTTP server on the host's loopback, named allowed.test and denied.test
    local t = uv.new_tcp()
    assert(t:bind("127.0.0.1", 0))
    hp = t:getsockname().port
    t:close()
    assert(os.execute("mkdir -p " .. dir .. "/www && echo hello-vm-net > " .. dir .. "/www/index.html"))
    local hd, pid = uv.spawn("/bin/busybox", { args = { "httpd", "-f", "-p", "127.0.0.1:" .. hp, "-h", dir .. "/www" },
                                                stdio = { nil, nil, nil } }, function() end)
    assert(hd, pid)
    servers = { hd }
    oci.write(dir .. "/hosts", "127.0.0.1 allowed.test denied.test\n")
    local env = {}
    local pe = io.popen("env")
    for line in pe:lines() do if line:find("=", 1, true) then env[#env + 1] = line end end
    pe:close()
    env[#env + 1] = "TUPPER_NET_HOSTS=" .. dir .. "/hosts"
    env[#env + 1] = "TUPPER_VM_IMAGE_MAX=160M"
    d = helper.start_daemon(dir .. "/d", { pool = 0, env = env })
    c = assert(d.connect())
    import("vmimg:1", { base, middle, top }, CONFIG)
  end)

  teardown(function()
    if c then
      for _, s in ipairs((call("sandbox.list", {}) or { sandboxes = {} }).sandboxes) do
        call("sandbox.kill", { id = s.id })
      end
      c:close()
    end
    if d then assert.are.equal(0, d.stop()) end
    for _, hd in ipairs(servers or {}) do
      uv.process_kill(hd, "sigterm")
      hd:close()
    end
    if cache_dir then helper.rmrf(cache_dir); uv.os_unsetenv("TUPPER_VM_CACHE") end
    helper.rmrf(dir)
    helper.TIMEOUT_MS = saved_timeout
    helper.drain()
  end)

  it("runs an imported image: whiteouts and opaque dirs applied, owners and the image config as on linux", function()
    local id = create({ image = "vmimg:1" })
    local r = run(id, "cat /etc/motd; ls /opt; ls /data; [ -e /opt/gone ] && echo gone-seen; " ..
      "[ -e /data/sub ] && echo sub-seen; cat /opt/keep/a")
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal("top\nkeep\nnew\na\n", r.stdout)
    -- Env, WorkingDir and User of the image; owners are the guest's own ids
    r = run(id, "echo $GREETING $(id -u):$(id -g) $(pwd) $HOME; stat -c '%u:%g %a' /home/app /tmp /bin/busybox")
    assert.are.equal("hello 1234:1235 /opt /home/app\n1234:1235 755\n0:0 1777\n0:0 755\n", r.stdout)
    -- Entrypoint + Cmd, through the CLI
    local code, out, err = helper.cli({ "--socket", d.socket, "run", "--backend", "microvm", "--image", "vmimg:1" })
    assert.are.equal(0, code, err)
    assert.are.equal("hello from /opt as 1234:1235 home /home/app\n", out)
    -- one root image for the image, shared by its VMs; writes stay in each VM
    assert.are.equal(1, #names("^root%-%x+%.ext4$"))
    assert(call("fs.write", { sandbox = id, path = "/opt/keep/a", data = "mine\n", encoding = "utf8" }))
    r = run(id, "cat /opt/keep/a")
    assert.are.equal("mine\n", r.stdout)
    local id2 = create({ image = "vmimg:1" })
    assert.are.equal("a\n", run(id2, "cat /opt/keep/a").stdout)
    assert.are.equal(1, #names("^root%-%x+%.ext4$"))
    assert.truthy(call("sandbox.kill", { id = id }).killed)
    assert.truthy(call("sandbox.kill", { id = id2 }).killed)
  end)

  it("runs two images' VMs side by side, each on its own files and its own snapshot", function()
    import("vmimg:2", { base, { { name = "etc/motd", data = "two\n" }, { name = "only-two", data = "2\n" } } })
    local a = create({ image = "vmimg:1" })
    local b = create({ image = "vmimg:2" })
    local ra = run(a, "cat /etc/motd; ls /; [ -e /only-two ] && echo two-seen")
    local rb = run(b, "cat /etc/motd; cat /only-two; [ -e /opt ] && echo opt-seen")
    assert.matches("^top\n", ra.stdout)
    assert.is_nil(ra.stdout:find("two-seen", 1, true))
    assert.are.equal("two\n2\n", rb.stdout)
    -- a snapshot per root image, never shared between images
    local roots = names("^root%-%x+%.ext4$")
    assert.are.equal(2, #roots)
    local snaps = names("^snap%-.*%-512%-1%-1024%-r%x+$")
    local ids = {}
    for _, s in ipairs(snaps) do ids[s:match("%-r(%x+)$")] = true end
    local n = 0
    for _ in pairs(ids) do n = n + 1 end
    assert.is_true(n >= 2, table.concat(snaps, " "))
    -- a later VM of each image starts from its own snapshot, on its own files
    local b2 = create({ image = "vmimg:2" })
    assert.are.equal("two\n", run(b2, "cat /etc/motd").stdout)
    local a2 = create({ image = "vmimg:1" })
    assert.are.equal("top\n", run(a2, "cat /etc/motd").stdout)
    for _, id in ipairs({ a, b, a2, b2 }) do assert.truthy(call("sandbox.kill", { id = id }).killed) end
    -- removing an image removes its root image and its snapshots
    local code, _, err = helper.cli({ "--socket", d.socket, "rmi", "vmimg:2" })
    assert.are.equal(0, code, err)
    local left = names("^root%-%x+%.ext4$")
    assert.are.equal(1, #left)
    assert.is_true(left[1] == roots[1] or left[1] == roots[2])
  end)

  it("builds one root image for creates of one new image at the same time", function()
    import("vmimg:3", { base, { { name = "three", data = "3\n" } } })
    local before = #names("^root%-%x+%.ext4$")
    local mark = #(helper.read_file(d.log) or "")
    local results = {}
    sync(function()
      local left = 2
      local done
      for i = 1, 2 do
        async.spawn(function()
          results[i] = { c:call("sandbox.create", { backend = "microvm", image = "vmimg:3" }) }
          left = left - 1
          if left == 0 and done then done() end
        end)
      end
      if left > 0 then async.wait(function(cb) done = cb end) end
    end)
    for i = 1, 2 do
      assert(results[i][1], results[i][2] and results[i][2].message)
      assert.are.equal("3\n", run(results[i][1].id, "cat /three").stdout)
    end
    assert.are.equal(before + 1, #names("^root%-%x+%.ext4$"))
    local n = 0
    for _ in helper.read_file(d.log):sub(mark + 1):gmatch("building the microVM image root%-") do n = n + 1 end
    assert.are.equal(1, n)
    for i = 1, 2 do assert.truthy(call("sandbox.kill", { id = results[i][1].id }).killed) end
  end)

  it("runs a recipe with setup on microVMs, its setup layer on top of the image", function()
    local src = [[
return recipe "vmsetup" {
  image = "vmimg:1",
  backend = "microvm",
  env = { FROM_RECIPE = "yes" },
  files = { ["/opt/placed"] = "placed\n" },
  setup = function(box)
    box:run("echo made-by-setup > /opt/made && rm /opt/keep/a && mkdir -p /data/x && echo x > /data/x/y")
  end,
}]]
    local sb, err = call("sandbox.create", { recipe = { name = "vmsetup.lua", source = src } })
    assert(sb, err and err.message)
    assert.are.equal("microvm", sb.backend)
    local want = "placed\nmade-by-setup\nno-a\nnew\nx\nyes\n"
    local probe = "cat /opt/placed /opt/made; [ -e /opt/keep/a ] || echo no-a; ls /data; echo $FROM_RECIPE"
    local r = run(sb.id, probe)
    assert.are.equal(want, r.stdout)
    -- a second create: the cached layer, the same root image
    local before = names("^root%-%x+%.ext4$")
    local sb2 = assert(call("sandbox.create", { recipe = { name = "vmsetup.lua", source = src } }))
    assert.are.equal(want, run(sb2.id, probe).stdout)
    assert.are.same(before, names("^root%-%x+%.ext4$"))
    assert.truthy(call("sandbox.kill", { id = sb.id }).killed)
    assert.truthy(call("sandbox.kill", { id = sb2.id }).killed)
  end)

  it("handles odd names and deep trees, and refuses what cannot fit with clear errors", function()
    -- odd names and a deep tree, laid out on the host and tarred by GNU tar
    local tree = dir .. "/odd"
    local odd = { "sp ace", "new\nline", "quote'\"", "-dash", "ünïcødé", "star*?[", ".hidden", ("n"):rep(255) }
    assert(os.execute("mkdir -p '" .. tree .. "/odd'"))
    for _, n in ipairs(odd) do oci.write(tree .. "/odd/" .. n, n) end
    local deep = tree .. "/deep"
    for _ = 1, 200 do deep = deep .. "/d" end
    assert(os.execute("mkdir -p '" .. deep .. "'"))
    oci.write(deep .. "/bottom", "bottom\n")
    assert(os.execute("tar -C '" .. tree .. "' --owner=0 --group=0 -cf '" .. dir .. "/odd.tar' odd deep"))
    local t = assert(io.open(dir .. "/odd.tar", "rb"))
    local oddtar = t:read("a")
    t:close()
    import("vmodd:1", { base, oddtar })
    local id = create({ image = "vmodd:1" })
    local r = run(id, "set -- /odd/* /odd/.[!.]*; echo $#; cat /odd/'sp ace' /odd/'quote'\\''\"' /odd/ünïcødé; echo; " ..
      "cat /deep" .. ("/d"):rep(200) .. "/bottom; find /deep | wc -l")
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal(#odd .. "\nsp acequote'\"ünïcødé\nbottom\n202\n", r.stdout:gsub("[ \t]+(%d)", "%1"))
    assert.truthy(call("sandbox.kill", { id = id }).killed)

    -- files larger than the root image limit (TUPPER_VM_IMAGE_MAX=160M here)
    local big = dir .. "/big"
    assert(os.execute("mkdir -p " .. big .. "/blobs/sha256"))
    local ltar = big .. "/layer.tar"
    oci.write(ltar, oci.header({ name = "zeros", size = 200 * 1048576 }))
    assert(os.execute(("head -c %d /dev/zero >> %s && head -c 1024 /dev/zero >> %s"):format(200 * 1048576, ltar, ltar)))
    local diff = oci.sha256(ltar)
    local gz = oci.gzip(ltar)
    local gd = oci.sha256(gz)
    assert(os.rename(gz, big .. "/blobs/sha256/" .. gd:sub(8)))
    local cfg = json.encode({ architecture = "amd64", os = "linux", config = { Env = { "PATH=/bin" } },
                              rootfs = { type = "layers", diff_ids = { diff } } })
    oci.write(big .. "/c", cfg)
    local cd = oci.sha256(big .. "/c")
    assert(os.rename(big .. "/c", big .. "/blobs/sha256/" .. cd:sub(8)))
    local m = json.encode({ schemaVersion = 2, mediaType = "application/vnd.oci.image.manifest.v1+json",
      config = { mediaType = "application/vnd.oci.image.config.v1+json", digest = cd, size = #cfg },
      layers = { { mediaType = "application/vnd.oci.image.layer.v1.tar+gzip", digest = gd,
                   size = uv.fs_stat(big .. "/blobs/sha256/" .. gd:sub(8)).size } } })
    oci.write(big .. "/m", m)
    local md = oci.sha256(big .. "/m")
    assert(os.rename(big .. "/m", big .. "/blobs/sha256/" .. md:sub(8)))
    oci.write(big .. "/index.json", json.encode({ schemaVersion = 2, manifests = { {
      mediaType = "application/vnd.oci.image.manifest.v1+json", digest = md, size = #m } } }))
    oci.write(big .. "/oci-layout", '{"imageLayoutVersion":"1.0.0"}')
    local code, _, ierr = helper.cli({ "--socket", d.socket, "import", big, "vmbig:1" })
    assert.are.equal(0, code, ierr)
    local _, err = call("sandbox.create", { backend = "microvm", image = "vmbig:1" })
    assert.is_not_nil(err)
    assert.matches("more than the microVM image limit of 160 MiB", err.message)
    -- nothing half-made is left, and the image works on the linux backend
    assert.are.same({}, names("^tmp%-"))
    assert.is_nil(io.open("/proc/self/mountinfo"):read("a"):find(d.state, 1, true))

    -- a recipe layer with a path longer than the kernel's PATH_MAX cannot
    -- be copied into a root image: a clear error, nothing left behind
    local src = [[
return recipe "vmdeep" {
  image = "vmimg:1",
  backend = "microvm",
  setup = function(box)
    -- built bottom up by renames: no step names a long path
    box:run("mkdir c; i=0; while [ $i -lt 1100 ]; do mkdir n && mv c n/dddd && mv n c || exit 1; i=$((i+1)); done",
            { cwd = "/tmp" })
  end,
}]]
    local _, rerr = call("sandbox.create", { recipe = { name = "vmdeep.lua", source = src } })
    assert.is_not_nil(rerr)
    assert.matches("a path is longer than 4096 bytes", rerr.message)
    assert.are.same({}, names("^tmp%-"))
  end)

  it("leaves nothing a later daemon trusts when it dies in the middle of a root image build", function()
    local dir2 = helper.tmpdir()
    local function mounts()
      local out = {}
      for line in io.lines("/proc/self/mountinfo") do
        local mp = line:match("^%S+ %S+ %S+ %S+ (%S+)")
        if mp and mp:find(dir2, 1, true) == 1 then out[#out + 1] = mp end
      end
      return out
    end
    local d2, d3
    local ok, err = pcall(function()
      d2 = helper.start_daemon(dir2 .. "/d", { pool = 0 })
      -- 60 MB of random bytes: a build that takes seconds
      assert(os.execute("mkdir -p " .. dir2 .. "/big && head -c 60000000 /dev/urandom > " .. dir2 ..
        "/big/blob && tar -C " .. dir2 .. "/big --owner=0 --group=0 -cf " .. dir2 .. "/big.tar blob"))
      local t = assert(io.open(dir2 .. "/big.tar", "rb"))
      local bigtar = t:read("a")
      t:close()
      import("vmcrash:1", { base, bigtar }, nil, d2)
      bigtar = nil
      local c2 = assert(d2.connect())
      async.spawn(function() c2:call("sandbox.create", { backend = "microvm", image = "vmcrash:1" }) end)
      sync(function()
        for _ = 1, 30000 do
          if (helper.read_file(d2.log) or ""):find("building the microVM image", 1, true) then break end
          async.sleep(10)
        end
        async.sleep(300)
      end)
      d2.crash()
      c2:close()
      -- the dead daemon's half-made build: a temp dir, no root image
      assert.are.equal(1, #names("^tmp%-root%-", d2.state))
      assert.are.same({}, names("^root%-", d2.state))
      -- the next daemon's first microVM start removes it (unmounting what
      -- the build had mounted) and builds the root image afresh
      d3 = helper.start_daemon(dir2 .. "/d", { pool = 0 })
      local c3 = assert(d3.connect())
      local sb, cerr = helper.call(c3, "sandbox.create", { backend = "microvm", image = "vmcrash:1" })
      assert(sb, cerr and cerr.message)
      local r = sync(function() return helper.run(c3, sb.id, { "/bin/sh", "-c", "stat -c %s /blob" }) end)
      assert.are.equal("60000000\n", r.stdout)
      assert.are.same({}, names("^tmp%-", d3.state))
      assert.are.equal(1, #names("^root%-%x+%.ext4$", d3.state))
      assert.are.same({}, mounts())
      assert.truthy(helper.call(c3, "sandbox.kill", { id = sb.id }).killed)
      -- image prune --all takes the image, and its root image and snapshot with it
      local pr = assert(helper.call(c3, "image.prune", { all = true }))
      assert.are.same({ "docker.io/library/vmcrash:1" }, pr.refs)
      assert.are.same({}, names("^root%-", d3.state))
      assert.are.same({}, names("^snap%-.*%-r%x+$", d3.state))
      c3:close()
      assert.are.equal(0, d3.stop())
    end)
    -- whatever happened, no daemon and nothing mounted of this test stays
    if d2 and not d2.exit_code then d2.crash() end
    if d3 and not d3.exit_code then d3.stop() end
    for _, mp in ipairs(mounts()) do os.execute("umount -l '" .. mp .. "'") end
    helper.rmrf(dir2)
    assert(ok, err)
  end)

  it("relays the network from inside a guest: an allowed flow works, a refused one is refused", function()
    local id = create({ network = { allow = { "allowed.test", "127.0.0.1/32:" .. hp } } })
    local r = run(id, "cat /etc/resolv.conf; wget -q -O- http://allowed.test:" .. hp .. "/index.html")
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal("nameserver 127.0.0.1\nhello-vm-net\n", r.stdout)
    r = run(id, "wget -q -O- http://denied.test:" .. hp .. "/index.html")
    assert.are_not.equal(0, r.exit_code)
    assert.matches("403 Forbidden", r.stderr)
    r = run(id, "nslookup denied.test 127.0.0.1")
    assert.matches("NXDOMAIN", r.stdout)
    local log = assert(call("sandbox.network_log", { id = id })).entries
    local seen = {}
    for _, e in ipairs(log) do seen[e.action .. " " .. tostring(e.host)] = true end
    assert.is_true(seen["allow allowed.test"], json.encode(log))
    assert.is_true(seen["deny denied.test"], json.encode(log))
    assert.truthy(call("sandbox.kill", { id = id }).killed)
  end)
end)
