-- Security specs (issue 3): a static probe (tests/probe/probe.c) runs inside
-- a real box and tries what a box must not do; every denial is one test.
-- Then the limits, driven through the socket API: pids, memory, disk, cpu,
-- the sandbox timeout, the process timeout, pause and resume.
--
-- These are written to issue 3 and docs/protocol.md, not to what the daemon
-- does today: a test of a layer that is still being built fails until it
-- lands, with a message that says what the probe saw.
local uv = require("luv")
local async = require("tupper.util.async")
local helper = require("helper")

local sync = helper.sync

local PROBE = os.getenv("TUPPER_PROBE") or "build/tupper-probe"
local PROBE_IN_BOX = "/usr/local/bin/tupper-probe"
local CHUNK = 1048576
local MiB = 1048576

--- Lines of probe output as a table: check name -> the rest of its line
-- (a name printed twice keeps its last line).
local function parse(out)
  local res = {}
  for line in out:gmatch("[^\n]+") do
    local name, rest = line:match("^(%S+)%s*(.-)%s*$")
    if name then res[name] = rest end
  end
  return res
end

describe("a box", function()
  local d, c
  local boxes = {}

  setup(function()
    d = helper.start_daemon()
    c = assert(d.connect())
  end)

  teardown(function()
    if c then
      for id in pairs(boxes) do sync(function() return c:call("sandbox.kill", { id = id }) end) end
      c:close()
    end
    sync(function() async.sleep(1) end)
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  local function call(method, params) return helper.call(c, method, params) end

  local function kill(id)
    if id and boxes[id] then
      call("sandbox.kill", { id = id })
      boxes[id] = nil
    end
  end

  local function run(id, argv, opts)
    return sync(function() return helper.run(c, id, argv, opts) end)
  end

  --- Creates a sandbox (with limits when given) and copies the probe in.
  local function create(limits)
    local sb, err = call("sandbox.create", { limits = limits })
    assert(sb, "sandbox.create: " .. tostring(err and err.message))
    boxes[sb.id] = true
    local f = assert(io.open(PROBE, "rb"),
      "no probe at " .. PROBE .. " (build tupper-probe, set TUPPER_PROBE)")
    local bin = f:read("a")
    f:close()
    local off = 0
    while off < #bin do
      local chunk = bin:sub(off + 1, off + CHUNK)
      assert(call("fs.write", { sandbox = sb.id, path = PROBE_IN_BOX, data = helper.b64encode(chunk),
        offset = off }))
      off = off + #chunk
    end
    local r = run(sb.id, { "chmod", "755", PROBE_IN_BOX })
    assert.are.equal(0, r.exit_code, r.stderr)
    return sb.id
  end

  --- Runs the probe in box id; returns the parsed lines and the run.
  local function probe(id, ...)
    local r = assert(run(id, { PROBE_IN_BOX, ... }))
    return parse(r.stdout), r
  end

  ---------------------------------------------------------------------------
  describe("probed from inside", function()
    local id, res, raw

    setup(function()
      id = create()
      local r
      res, r = probe(id, "all")
      raw = r.stdout
      -- the whole report, for whoever reads a failure
      io.stderr:write("\n--- probe all:\n", raw, r.stderr, "---\n")
    end)

    teardown(function() kill(id) end)

    local function line(name)
      local v = res[name]
      assert(v, "the probe printed no line for '" .. name .. "'")
      return v
    end

    --- The check was refused (DENIED with errno, when given, or any), or
    -- its process was killed (seccomp's SIGSYS, ...).
    local function refused(name, errno)
      local v = line(name)
      if v:match("^KILLED") then return end
      assert(v:match("^DENIED"), name .. " was not denied: " .. name .. " " .. v)
      if errno then
        assert.are.equal(errno, v:match("^DENIED (%S+)"), name .. ": " .. v)
      end
    end

    local function refused_all(names, errno)
      local bad = {}
      for _, n in ipairs(names) do
        local ok = pcall(refused, n, errno)
        if not ok then bad[#bad + 1] = n .. " " .. tostring(res[n]) end
      end
      assert(#bad == 0, "not denied:\n  " .. table.concat(bad, "\n  "))
    end

    it("cannot mount with mount(2)", function()
      refused_all({ "mount", "umount" })
    end)

    it("cannot mount with the new mount API", function()
      refused_all({ "fsopen", "fsmount", "open_tree", "move_mount", "fspick", "mount_setattr" })
    end)

    it("cannot create namespaces with unshare", function()
      refused_all({ "unshare-user", "unshare-mnt", "unshare-net", "unshare-mount" })
    end)

    it("cannot enter namespaces with setns", function()
      refused_all({ "setns-mnt", "setns-net", "setns-pid", "setns-user" })
    end)

    it("cannot create a user namespace with a raw clone", function()
      refused("clone-newuser")
    end)

    it("gets ENOSYS from clone3, so libc falls back to clone", function()
      assert.are.equal("DENIED ENOSYS", line("clone3"))
    end)

    it("cannot use the kernel keyring", function()
      refused_all({ "keyctl", "add_key", "request_key" })
    end)

    it("cannot use bpf", function() refused("bpf") end)

    it("cannot use perf_event_open", function() refused("perf_event_open") end)

    it("cannot use userfaultfd", function() refused("userfaultfd") end)

    it("cannot use io_uring", function() refused("io_uring_setup") end)

    it("cannot load a kexec kernel", function()
      refused_all({ "kexec_load", "kexec_file_load" })
    end)

    it("cannot load or unload kernel modules", function()
      refused_all({ "init_module", "finit_module", "delete_module" })
    end)

    it("cannot reboot", function() refused("reboot") end)

    it("cannot swapon", function() refused("swapon") end)

    it("cannot set the clock", function()
      refused_all({ "settimeofday", "clock_settime" })
    end)

    it("cannot set the hostname", function() refused("sethostname") end)

    it("cannot ptrace the agent or read its memory", function()
      refused_all({ "ptrace", "process_vm_readv" })
    end)

    it("cannot open files by handle", function() refused("open_by_handle_at") end)

    it("cannot switch to a weakening personality", function()
      refused_all({ "personality-rie", "personality-norandom" })
    end)

    it("cannot raise its I/O privilege", function()
      refused_all({ "iopl", "ioperm" })
    end)

    it("cannot switch process accounting", function() refused("acct") end)

    it("cannot read the kernel log with syslog", function() refused("syslog") end)

    it("cannot escape the filter through the i386 (int 0x80) or x32 ABIs", function()
      refused_all({ "int80-getpid", "int80-unshare", "x32-getpid", "x32-unshare" })
    end)

    it("cannot create device nodes", function()
      refused("mknod-dev")
    end)

    it("cannot write /proc/sys or /proc/sysrq-trigger", function()
      refused_all({ "proc-sys-write", "sysrq-trigger" })
    end)

    it("cannot read masked /proc files", function()
      local bad = {}
      for _, n in ipairs({ "proc-kcore", "proc-keys", "proc-timer_list", "proc-sched_debug",
                           "proc-latency_stats", "proc-kmsg" }) do
        local v = line(n)
        if not (v:match("^DENIED") or v == "EMPTY" or v == "MASKED") then bad[#bad + 1] = n .. " " .. v end
      end
      assert(#bad == 0, "readable:\n  " .. table.concat(bad, "\n  "))
    end)

    it("cannot read the agent's environment", function()
      local v = line("agent-environ")
      assert(v:match("^DENIED") or v == "EMPTY" or v == "MASKED", "agent-environ " .. v)
    end)

    it("inherits no descriptor beyond 0-2", function()
      assert.are.equal("ok", line("fds"))
    end)

    it("holds no capability", function()
      local v = line("caps")
      for _, set in ipairs({ "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb" }) do
        local mask = v:match(set .. "=(%x+)")
        assert(mask, "no " .. set .. " in: " .. v)
        assert(tonumber(mask, 16) == 0, set .. " is " .. mask .. " (" .. v .. ")")
      end
    end)

    it("runs with no_new_privs", function()
      assert.are.equal("1", line("caps"):match("NoNewPrivs=(%d+)"), line("caps"))
    end)

    it("runs under a seccomp filter", function()
      assert.are.equal("2", line("caps"):match("Seccomp=(%d+)"), line("caps"))
    end)

    it("sees /sys read-only", function()
      refused_all({ "sys-write", "sys-mkdir" })
      local v = line("sys-write")
      assert(v:match("EROFS") or v:match("EACCES") or v:match("EPERM") or v:match("^KILLED"), v)
    end)

    it("has a minimal /dev", function()
      local allowed = { null = 1, zero = 1, full = 1, random = 1, urandom = 1, tty = 1, pts = 1, shm = 1,
        ptmx = 1, fd = 1, stdin = 1, stdout = 1, stderr = 1, console = 1, mqueue = 1 }
      local extra = {}
      for name in line("dev"):gmatch("%S+") do
        if not allowed[name] then extra[#extra + 1] = name end
      end
      assert(#extra == 0, "unexpected in /dev: " .. table.concat(extra, " "))
    end)

    it("runs as root of its own user namespace, mapped to an unprivileged host range", function()
      local v = line("ids")
      local inside, outside = v:match("uid_map=(%d+):(%d+):%d+")
      assert.are.equal("0", inside, v)
      assert(tonumber(outside) and tonumber(outside) >= 100000,
        "box root maps to host uid " .. tostring(outside))
    end)
  end)

  ---------------------------------------------------------------------------
  -- Limits.  One box per test, with only the limit under test.

  describe("with a pids limit", function()
    local id
    after_each(function() kill(id); id = nil end)

    it("stops a fork bomb at the limit", function()
      id = create({ pids = 64 })
      local res = probe(id, "forkbomb", "2000")
      local v = assert(res.forkbomb, "no forkbomb line")
      local count, errno = v:match("^STOPPED count=(%d+) errno=(%S+)")
      assert(count, "the fork bomb was not stopped: forkbomb " .. v)
      assert.are.equal("EAGAIN", errno)
      assert(tonumber(count) < 64, "forked " .. count .. " processes under a limit of 64")
      assert.are.equal("alive\n", run(id, { "echo", "alive" }).stdout)
    end)
  end)

  describe("with a memory limit", function()
    local id
    after_each(function() kill(id); id = nil end)

    it("OOM-kills a memory bomb while the box keeps answering", function()
      id = create({ memory = "64M" })
      local res, r = probe(id, "membomb", "256")
      local v = res.membomb or ""
      assert(not v:match("^ALLOCATED"), "allocated 256 MB under a 64M limit: membomb " .. v)
      assert(v == "KILLED SIGKILL" or r.signal == 9,
        "membomb " .. v .. ", exit signal " .. tostring(r.signal))
      assert.are.equal("alive\n", run(id, { "echo", "alive" }).stdout)
    end)
  end)

  describe("with a disk limit", function()
    local id
    after_each(function() kill(id); id = nil end)

    it("stops a disk fill with ENOSPC", function()
      id = create({ disk = "64M" })
      local res = probe(id, "diskfill", "/fill.bin", "256")
      local v = assert(res.diskfill, "no diskfill line")
      local bytes, errno = v:match("^STOPPED bytes=(%d+) errno=(%S+)")
      assert(bytes, "the disk fill was not stopped: diskfill " .. v)
      assert(errno == "ENOSPC" or errno == "EDQUOT", "diskfill " .. v)
      assert(tonumber(bytes) <= 64 * MiB, "wrote " .. bytes .. " bytes under a 64M limit")
      -- the space comes back once the file is gone
      local again = probe(id, "diskfill", "/fill2.bin", "8")
      assert.are.equal("CAPPED bytes=" .. 8 * MiB, again.diskfill)
    end)
  end)

  -- The cpu limit is asserted from the box cgroup's own accounting, not from
  -- wall time alone: a loaded host may give a box less than a share of half
  -- a core, and then it is never throttled.  So the share is 2% of a core
  -- (2 ms in each 100 ms period), which a burner exceeds on any host that
  -- runs it at all (at a load of 24 on 2 cores a busy box gets about 8%).
  -- Without the limit nr_throttled stays 0 and the test fails.
  describe("with a cpu limit", function()
    local id
    after_each(function() kill(id); id = nil end)
    local CPUS, PERIOD_US, TICK_US = 0.02, 100000, 10000 -- a tick at HZ=100, the longest

    it("throttles a CPU burn to its share, as sandbox.metrics reports", function()
      id = create({ cpus = CPUS })
      local m0 = assert(call("sandbox.metrics", { id = id }))
      local t0 = uv.hrtime()
      local res = probe(id, "cpuburn", "2000")
      local wall_us = (uv.hrtime() - t0) / 1000
      local m = assert(call("sandbox.metrics", { id = id }))
      local v = assert(res.cpuburn, "no cpuburn line")
      local ratio = tonumber(v:match("ratio=([%d.]+)"))
      assert(ratio, v)
      -- the burner's own cpu time over its wall time: its share, plus one
      -- period's quota at its start and a tick past the quota at its end
      assert(ratio <= 2.5 * CPUS, "used " .. ratio .. " of a core under cpus = " .. CPUS .. " (" .. v .. ")")
      assert(tonumber(m.nr_throttled), "no nr_throttled in sandbox.metrics")
      assert(m.nr_throttled > (m0.nr_throttled or 0), "nr_throttled " .. tostring(m0.nr_throttled) .. " -> "
        .. m.nr_throttled .. " after a burn at cpus = " .. CPUS)
      assert(m.throttled_usec > (m0.throttled_usec or 0), "throttled_usec " .. tostring(m0.throttled_usec)
        .. " -> " .. tostring(m.throttled_usec))
      -- the whole box (the agent starting the probe too) within the quota of
      -- the periods the call lasted (load only lowers what it gets), plus the
      -- runtime at hand at its start (a period's quota, a ms on each cpu) and
      -- a tick past the quota on each cpu
      local ncpu = uv.available_parallelism and uv.available_parallelism() or 2
      local budget = CPUS * (wall_us + 2 * PERIOD_US) + ncpu * (1000 + TICK_US)
      local used = m.cpu_usage_usec - m0.cpu_usage_usec
      assert(used > 0 and used <= budget, ("the box used %.0f us of cpu in %.0f us (at most %.0f)"):format(used,
        wall_us, budget))
    end)
  end)

  describe("with a sandbox timeout", function()
    local id
    after_each(function() kill(id); id = nil end)

    it("kills the box when its time is up", function()
      local t0 = uv.now()
      local sb, err = call("sandbox.create", { limits = { timeout = 2 } })
      assert(sb, "sandbox.create: " .. tostring(err and err.message))
      id = sb.id
      boxes[id] = true
      assert.are.equal("started\n", run(id, "sleep 1000 & echo started").stdout)
      local gone_at
      sync(function()
        local deadline = uv.now() + 15000
        while uv.now() < deadline do
          local _, e = c:call("sandbox.get", { id = id })
          if e and e.code == -32000 then gone_at = uv.now(); return end
          async.sleep(100)
        end
      end)
      assert(gone_at, "the box outlived its 2 s timeout by more than 13 s")
      assert(gone_at - t0 >= 1500, "the box went away after " .. (gone_at - t0) .. " ms, before its timeout")
      local box_dir = d.state .. "/boxes/" .. id
      assert.is_true(helper.path_gone(box_dir), "the box directory is still there")
      boxes[id] = nil
    end)
  end)

  describe("with a process timeout", function()
    local id
    after_each(function() kill(id); id = nil end)

    it("kills a process that outlives its timeout", function()
      id = create()
      local exit
      c:on("process.exit", function(p) if p.sandbox == id then exit = p end end)
      local t0 = uv.now()
      local r, err = call("process.start", { sandbox = id, argv = { "sleep", "100" }, timeout = 1 })
      assert(r, "process.start: " .. tostring(err and err.message))
      sync(function()
        local deadline = uv.now() + 10000
        while not exit and uv.now() < deadline do async.sleep(20) end
      end)
      assert(exit, "sleep 100 still runs 10 s after its 1 s timeout")
      assert.are.equal(r.pid, exit.pid)
      assert.are.equal(9, exit.signal)
      assert.is_true(exit.timed_out)
      assert(uv.now() - t0 >= 900, "killed before its timeout")
    end)
  end)

  describe("paused", function()
    local id
    after_each(function() kill(id); id = nil end)

    it("stops running until it is resumed", function()
      local hello = assert(call("hello", {}))
      local has = false
      for _, m in ipairs(hello.methods or {}) do has = has or m == "sandbox.pause" end
      assert(has, "the daemon has no sandbox.pause (issue 3)")
      id = create()
      local lines = 0
      c:on("process.output", function(p) if p.sandbox == id then lines = lines + 1 end end)
      assert(call("process.start", { sandbox = id, cmd = "while true; do echo tick; sleep 0.05; done",
        encoding = "utf8" }))
      sync(function() while lines < 3 do async.sleep(10) end end)
      assert(call("sandbox.pause", { id = id }))
      -- frozen: the box's cpu time stands still (its output counts for
      -- nothing here: lines already on their way may come in late)
      local m1 = assert(call("sandbox.metrics", { id = id }))
      sync(function() async.sleep(500) end)
      local m2 = assert(call("sandbox.metrics", { id = id }))
      assert.are.equal(m1.cpu_usage_usec, m2.cpu_usage_usec, "the box kept running while paused")
      local frozen = lines
      assert(call("sandbox.resume", { id = id }))
      local ran = sync(function()
        return helper.poll(function()
          local m = c:call("sandbox.metrics", { id = id })
          return lines > frozen and m and m.cpu_usage_usec > m2.cpu_usage_usec
        end)
      end)
      assert(ran, "the box did not run again after resume")
    end)

    -- dash runs each command through vfork(): a freeze on a v1 freezer
    -- that catches a process inside the call leaves it unfrozen until
    -- FROZEN is written again (tp_cgroup_freeze does, while it waits)
    it("pauses a box whose processes vfork in a loop, every time", function()
      id = create()
      local pids = {}
      for i = 1, 2 do
        pids[i] = assert(call("process.start", { sandbox = id, argv = { PROBE_IN_BOX, "vforkloop", "600000" } })).pid
      end
      for i = 1, 40 do
        local r, err = call("sandbox.pause", { id = id })
        assert(r, ("pause %d: %s"):format(i, tostring(err and err.message)))
        assert(call("sandbox.resume", { id = id }))
      end
      -- and they were vforking all along
      local running = {}
      for _, p in ipairs(assert(call("process.list", { sandbox = id })).processes) do running[p.pid] = true end
      assert(running[pids[1]] and running[pids[2]], "the vforking probes ended early")
    end)

    -- a freeze in flight is the box's only one: a resume or a kill sent
    -- right behind a pause waits for it, then runs (docs/protocol.md)
    it("runs a resume or a kill sent during a pause after the pause", function()
      id = create()
      for _ = 1, 2 do
        assert(call("process.start", { sandbox = id, argv = { PROBE_IN_BOX, "vforkloop", "600000" } }))
      end
      for i = 1, 10 do
        local p, r = sync(function()
          local p
          async.spawn(function() p = table.pack(c:call("sandbox.pause", { id = id })) end)
          local r = table.pack(c:call("sandbox.resume", { id = id }))
          helper.poll(function() return p end)
          return p, r
        end)
        assert(p[1] and p[1].state == "paused", ("pause %d: %s"):format(i, tostring(p[2] and p[2].message)))
        assert(r[1] and r[1].state == "running", ("resume %d: %s"):format(i, tostring(r[2] and r[2].message)))
        assert.are.equal("running", assert(call("sandbox.get", { id = id })).state)
      end
      local p, k = sync(function()
        local p
        async.spawn(function() p = table.pack(c:call("sandbox.pause", { id = id })) end)
        local k = table.pack(c:call("sandbox.kill", { id = id }))
        helper.poll(function() return p end)
        return p, k
      end)
      boxes[id] = nil
      assert(p[1], "the pause: " .. tostring(p[2] and p[2].message))
      assert(k[1] and k[1].killed, "the kill: " .. tostring(k[2] and k[2].message))
      assert.are.equal(0, (helper.box_pids(id)))
      assert.is_nil(call("sandbox.get", { id = id }))
      id = nil
    end)

    -- the freeze waits in the thread pool, not on the loop (issue 14): a
    -- second client's sandbox.list keeps being answered while a pause of
    -- a vforking box is in flight.  A freeze on the loop answers nothing
    -- else before the pause's reply, so no two round trips (the second
    -- sent after the first's reply) can both fit inside one pause.
    it("answers other clients while a pause is in flight", function()
      id = create()
      for _ = 1, 2 do
        assert(call("process.start", { sandbox = id, argv = { PROBE_IN_BOX, "vforkloop", "600000" } }))
      end
      local c2 = assert(d.connect())
      local trips, stop, stopped = {}, false, false -- trips: { sent, answered } of c2's calls
      local best, slowest, pauses, longest = 0, 0, 0, 0
      sync(function()
        async.spawn(function()
          while not stop do
            local t0 = helper.now()
            assert(c2:call("sandbox.list", {}))
            trips[#trips + 1] = { t0, helper.now() }
          end
          stopped = true
        end)
        local deadline = helper.now() + 20000
        while helper.now() < deadline and best < 3 do
          local p0 = helper.now()
          local r, err = c:call("sandbox.pause", { id = id })
          local p1 = helper.now()
          assert(r, "pause: " .. tostring(err and err.message))
          pauses, longest = pauses + 1, math.max(longest, p1 - p0)
          local inside = 0
          for _, t in ipairs(trips) do
            if t[1] > p0 and t[2] < p1 then inside = inside + 1 end
          end
          best = math.max(best, inside)
          assert(c:call("sandbox.resume", { id = id }))
        end
        stop = true
        helper.poll(function() return stopped end, 5000)
      end)
      for _, t in ipairs(trips) do slowest = math.max(slowest, t[2] - t[1]) end
      c2:close()
      assert(best >= 2, ("in %d pauses (the longest %d ms) the other client never had two calls " ..
        "answered inside one pause (at most %d; its slowest call %d ms)"):format(pauses, longest, best, slowest))
    end)
  end)
end)
