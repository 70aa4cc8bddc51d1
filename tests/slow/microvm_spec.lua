-- The microvm backend's own checks (docs/microvm.md): a kernel of its own,
-- a guest panic and a QEMU crash surface as a clear sandbox error and leave
-- nothing, killing a sandbox leaves no QEMU and no files, a guest flooding
-- its console or its output cannot grow the daemon's memory.  The shared
-- API behaviour is tested by the backend matrix (backend_matrix_spec.lua).
-- The crash of its daemon is microvm_crash_spec.lua's, images of the store
-- on microVMs microvm_images_spec.lua's.
-- Boots microVMs (TCG here): slow.  The guest kernel is fetched into the
-- spec's temp dir unless TUPPER_VM_CACHE names a cache to reuse.
local uv = require("luv")
local async = require("tupper.util.async")
local helper = require("helper")
local vm = require("microvm_helper")

local sync = helper.sync
local qemu_alive = vm.qemu_alive

local function rss_kb(pid)
  local s = helper.read_file("/proc/" .. pid .. "/status") or ""
  return tonumber(s:match("VmRSS:%s*(%d+)")) or 0
end


-- The snapshot name's tail of a VM's shape (memory MiB, vCPUs, disk MiB),
-- as sandbox.get reports the limits in force (the daemon's defaults are the
-- host's: docs/limits.md)
local function shape_of(call, id)
  local l = assert(call("sandbox.get", { id = id })).limits
  return ("%%-%d%%-%s%%-%d%%-r%%x+$"):format(l.memory // 1048576, ("%g"):format(l.cpus), l.disk // 1048576)
end

describe("the microvm backend", function()
  local d, c, vm_undo

  setup(function()
    vm_undo = vm.vm_setup(300000) -- cold boots under TCG emulation, on a loaded machine
    d = helper.start_daemon(nil, { pool = 0 })
    c = assert(d.connect())
  end)

  teardown(function()
    if c then c:close() end
    if d then assert.are.equal(0, d.stop()) end
    if vm_undo then vm_undo() end
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
    local pid = math.tointeger(vm.record(d, id).pid)
    assert.is_true(qemu_alive(pid))
    -- QEMU runs as an unprivileged uid, not root
    local st = helper.read_file("/proc/" .. pid .. "/status")
    local quid = tonumber(st:match("Uid:%s*(%d+)"))
    assert.is_true(quid >= 100065536, st)
    assert.truthy(call("sandbox.kill", { id = id }).killed)
    assert.is_false(qemu_alive(pid))
    -- removed just after the kill's answer
    assert.is_true(helper.path_gone(d.state .. "/boxes/" .. id))
    assert.is_true(helper.path_gone(d.state .. "/boxes/" .. id .. ".json"))
  end)

  it("turns a guest kernel panic into a clear error and cleans up", function()
    local id = create()
    local pid = math.tointeger(vm.record(d, id).pid)
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
    local pid = math.tointeger(vm.record(d, id).pid)
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
    -- the default shape's (the default limits'); the first spec made its own
    local default
    local shape = shape_of(call, a)
    for _, n in ipairs(snaps) do if n:match(shape) then default = n end end
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
    finally(function() helper.release(d2) end) -- a failed assertion leaves no daemon (nor VM)
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
    finally(function() helper.release(d2) end) -- a failed assertion leaves no daemon (nor VM)
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
