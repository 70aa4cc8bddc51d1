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
    -- the console: everything the guest writes to its serial port
    local r = run(id, "head -c 200000 /dev/zero | tr '\\0' x > /dev/console; echo done")
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
    for _, n in ipairs(snaps) do if n:match("%-512%-1%-1024$") then default = n end end
    assert.is_not_nil(default, table.concat(snaps, " "))
    assert.is_not_nil(uv.fs_stat(d.state .. "/microvm/" .. default .. "/vm.state"))
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
    assert.truthy(call("sandbox.kill", { id = a }).killed)
    assert.truthy(call("sandbox.kill", { id = b }).killed)
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

  it("refuses a limit it cannot enforce in a VM", function()
    local _, err = call("sandbox.create", { backend = "microvm", limits = { pids = 10 } })
    assert.matches("'pids' limit is not enforced by the microvm backend", err.message)
  end)
end)
