--- `tupper doctor`: what this host can do for tupper and what to fix.  Each
-- check reads the host (and asks the same code the daemon decides with:
-- core.cgroup_init, the microVM accelerator's checks and cached trial);
-- nothing is changed, and no guest boots unless --kvm-check asks.  A
-- failed check that every sandbox needs is a blocker: the exit code is 1
-- only then.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")
local client = require("tupper.wire.client")
local accel = require("tupper.backend.microvm.accel")
local kernel = require("tupper.backend.microvm.kernel")
local qemu = require("tupper.backend.microvm.qemu")

local M = {}

M.NOFILE_WANT = 4096 -- open files a daemon with a few dozen boxes wants

-- The file at path, up to max bytes (64 KiB unless given), or nil.  Read
-- to its end: a /proc file of many records (mountinfo, mounts) gives about
-- a page per read, and a host with many mounts has its pool's line past it.
local function read(path, max)
  max = max or 65536
  local fd = uv.fs_open(path, "r", 0)
  if not fd then return nil end
  local parts, have = {}, 0
  while have < max do
    local s = uv.fs_read(fd, math.min(max - have, 65536), have)
    if not s or s == "" then
      if not s and have == 0 then parts = nil end
      break
    end
    parts[#parts + 1] = s
    have = have + #s
  end
  uv.fs_close(fd)
  return parts and table.concat(parts)
end

-- Runs argv (no shell) and waits (from a coroutine); returns its exit
-- code and its output (bounded), or nil when it does not start.
local function run(argv)
  local pipes = { uv.new_pipe(false), uv.new_pipe(false) }
  local buf, code, open, waiter = {}, nil, 2, nil
  local args = {}
  for i = 2, #argv do args[#args + 1] = argv[i] end
  local function wake() if waiter and code ~= nil and open == 0 then local w = waiter; waiter = nil; w() end end
  local h = uv.spawn(argv[1], { args = args, stdio = { nil, pipes[1], pipes[2] } }, function(c, sig)
    code = sig ~= 0 and 128 + sig or c
    wake()
  end)
  if not h then
    for _, pp in ipairs(pipes) do pp:close() end
    return nil, ""
  end
  for _, pp in ipairs(pipes) do
    pp:read_start(function(_, data)
      if data then
        if #buf < 64 then buf[#buf + 1] = data end
      else
        open = open - 1
        pp:close()
        wake()
      end
    end)
  end
  if code == nil or open > 0 then async.wait(function(cb) waiter = cb end) end
  h:close()
  return code, table.concat(buf)
end

local checks = {}
local function check(name, status, detail, fix, blocker)
  checks[#checks + 1] = { name = name, status = status, detail = detail, fix = fix,
    blocker = (status == "fail" and blocker) or nil }
end

-- What the last check found, as data for --json (its "facts").
local function facts(t)
  checks[#checks].facts = t
end

local function mounts()
  local list = {}
  for line in (read("/proc/self/mounts", 1 << 20) or ""):gmatch("[^\n]+") do
    local _, dir, fstype = line:match("^(%S+) (%S+) (%S+)")
    if dir then list[#list + 1] = { dir = dir, type = fstype } end
  end
  return list
end

local function check_cgroups()
  local info, err = core.cgroup_init()
  if not info then
    return check("cgroups", "warn", "no usable cgroups: " .. tostring(err) ..
      "; limits, pause, stats and whole-tree kill are off",
      "mount cgroup2 on /sys/fs/cgroup (or the v1 memory, pids, cpu and freezer hierarchies)")
  end
  local kind, hybrid = "v" .. tostring(info.version), nil
  if info.version == 1 then
    for _, m in ipairs(mounts()) do
      if m.type == "cgroup2" then
        kind = ("v1 (hybrid: cgroup2 at %s, unused)"):format(m.dir)
        hybrid = m.dir
      end
    end
  end
  local f = { version = info.version, hybrid = hybrid, memory = info.memory, pids = info.pids, cpu = info.cpu,
    freezer = info.freezer }
  local have, missing = {}, {}
  for _, c in ipairs({ "memory", "pids", "cpu", "freezer" }) do
    if info[c] then have[#have + 1] = c else missing[#missing + 1] = c end
  end
  if #missing == 0 then
    check("cgroups", "ok", ("%s; usable: %s"):format(kind, table.concat(have, " ")))
    return facts(f)
  end
  local limit = { memory = "--memory", pids = "--pids", cpu = "--cpus", freezer = "pause" }
  local off = {}
  for _, c in ipairs(missing) do off[#off + 1] = limit[c] end
  check("cgroups", "warn", ("%s; usable: %s; missing: %s (%s off)"):format(kind, table.concat(have, " "),
    table.concat(missing, " "), table.concat(off, ", ")),
    info.version == 2 and "enable them in the parent's cgroup.subtree_control (systemd: Delegate=yes)"
      or "mount the missing v1 hierarchies under /sys/fs/cgroup")
  facts(f)
end

local function check_userns()
  local max = tonumber((read("/proc/sys/user/max_user_namespaces") or ""):match("%d+"))
  if max == 0 then
    return check("user namespaces", "fail", "user.max_user_namespaces is 0",
      "sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d)", true)
  end
  local notes = {}
  local clone = read("/proc/sys/kernel/unprivileged_userns_clone")
  if clone and clone:match("^0") and uv.getuid() ~= 0 then
    notes[#notes + 1] = "kernel.unprivileged_userns_clone is 0"
  end
  local aa = read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
  if aa and aa:match("^1") and uv.getuid() ~= 0 then
    notes[#notes + 1] = "kernel.apparmor_restrict_unprivileged_userns is 1"
  end
  -- the real question: can this process make one (unshare from util-linux)
  local code, out = run({ "unshare", "--user", "--map-root-user", "true" })
  if code == nil then
    return check("user namespaces", "warn", ("max %s; unshare(1) is not installed to try one"):format(max or "?"),
      "apt-get install util-linux")
  end
  if code ~= 0 then
    return check("user namespaces", "fail", ("cannot make one: %s%s"):format(out:gsub("%s+$", ""),
      #notes > 0 and (" (" .. table.concat(notes, "; ") .. ")") or ""),
      "sysctl -w kernel.unprivileged_userns_clone=1 / user.max_user_namespaces=15000, or run the daemon as root",
      true)
  end
  check("user namespaces", "ok", ("usable (max %s)"):format(max or "?"))
end

local function check_overlay()
  local fs = read("/proc/filesystems") or ""
  if fs:find("%soverlay\n") then return check("overlayfs", "ok", "in /proc/filesystems") end
  local rel = uv.os_uname().release
  if uv.fs_stat("/lib/modules/" .. rel .. "/kernel/fs/overlayfs") then
    return check("overlayfs", "ok", "a module (loaded on first mount)")
  end
  check("overlayfs", "fail", "the kernel has no overlay filesystem", "modprobe overlay (CONFIG_OVERLAY_FS)", true)
end

-- Where boxes' writes go (docs/limits.md): the btrfs pool (snapshots are
-- subvolume snapshots, O(1)) or an ext4 image per box (snapshots copy).
local function check_disk_pool(state)
  local off = state .. "/no-btrfs-pool"
  if uv.fs_stat(off) then
    check("disk pool", "ok", ("ext4 image per box: turned off by %s (snapshots copy the box's files)"):format(off))
    facts({ btrfs = false, mounted = false })
    return
  end
  local ok, err = core.pool_probe()
  if not ok then
    check("disk pool", "warn", ("ext4 image per box (snapshots copy the box's files): %s"):format(err),
      "apt-get install btrfs-progs (and a kernel with btrfs) for O(1) snapshots and forks")
    facts({ btrfs = false, mounted = false })
    return
  end
  local point, mounted = (uv.fs_realpath(state) or state) .. "/pool", false
  for line in (read("/proc/self/mountinfo", 1048576) or ""):gmatch("[^\n]+") do
    if line:match("^%S+ %S+ %S+ %S+ (%S+)") == point and line:find(" - btrfs ", 1, true) then mounted = true end
  end
  check("disk pool", "ok", ("btrfs: boxes' upper dirs are subvolumes of %s/pool.img, %s (snapshots are O(1))"):format(
    state, mounted and "mounted" or "mounted at the daemon's start"))
  facts({ btrfs = true, mounted = mounted })
end

local function check_seccomp()
  local status = read("/proc/self/status") or ""
  local actions = read("/proc/sys/kernel/seccomp/actions_avail")
  if not status:find("\nSeccomp:") then
    return check("seccomp", "fail", "the kernel has no seccomp (CONFIG_SECCOMP_FILTER)",
      "a kernel built with CONFIG_SECCOMP_FILTER", true)
  end
  if actions and not actions:find("errno", 1, true) then
    return check("seccomp", "fail", "seccomp has no errno action: " .. actions:gsub("%s+$", ""),
      "a newer kernel", true)
  end
  check("seccomp", "ok", "filters available" .. (actions and (" (" .. actions:gsub("%s+$", "") .. ")") or ""))
end

-- The guest kernel in the cache, without fetching it: its vmlinuz or nil.
local function cached_vmlinuz()
  local cache = kernel.cache_dir()
  local version = (read(cache .. "/current", 256) or ""):match("^([%w%.%-+]+)\n")
  local path = version and (cache .. "/" .. version .. "/vmlinuz")
  return path and uv.fs_stat(path) and path or nil, cache
end

local function check_qemu()
  if not uv.fs_access(qemu.QEMU, "x") then
    check("qemu", "warn", qemu.QEMU .. " is not installed: the microvm backend is off",
      "apt-get install qemu-system-x86")
    return false
  end
  local code, out = run({ qemu.QEMU, "--version" })
  local version = code == 0 and out:match("version ([%w%.%-+~]+)")
  check("qemu", version and "ok" or "warn", version and (qemu.QEMU .. " " .. version) or
    (qemu.QEMU .. " --version failed: " .. out:sub(1, 200)), not version and "reinstall qemu-system-x86" or nil)
  facts({ path = qemu.QEMU, version = version or nil })
  return version ~= nil
end

local function kvm_checks(state, kvm_check, have_qemu)
  local a, why = accel.static()
  local fix_mode = ("chmod 0666 %s (or a udev rule: KERNEL==\"kvm\", MODE=\"0666\")"):format(accel.DEVICE)
  if a == "tcg" then
    local fix = why and why:find("mode", 1, true) and fix_mode or
      (why and why:find("no ", 1, true) and "enable virtualization (VT-x/AMD-V) and load kvm_intel or kvm_amd") or nil
    return check("kvm", "warn", "not usable: " .. tostring(why) .. "; microVMs run under TCG emulation (slow)", fix)
  end
  if why then return check("kvm", "ok", why) end -- TUPPER_VM_ACCEL=kvm
  local vmlinuz = cached_vmlinuz()
  if kvm_check then
    if not have_qemu then return check("kvm", "warn", "/dev/kvm opens; no QEMU to try it", "apt-get install qemu-system-x86") end
    if not vmlinuz then
      return check("kvm", "warn", "/dev/kvm opens; no guest kernel cached to try it with",
        "start one microVM (tupper run --backend microvm -- true) to fetch it, then tupper doctor --kvm-check")
    end
    local uid = qemu.alloc_uid("doctor-trial")
    local ok, terr = accel.trial(qemu.QEMU, vmlinuz, uid)
    if uid then qemu.free_uid(uid) end
    if ok then return check("kvm", "ok", "a guest kernel boots under KVM (tried now)") end
    return check("kvm", "warn", "KVM cannot run a guest here: " .. tostring(terr) .. "; microVMs run under TCG",
      "check nested virtualization of this VM's host, or TUPPER_VM_ACCEL=tcg to skip the trial")
  end
  local d = vmlinuz and accel.cached_trial(state, qemu.QEMU, vmlinuz)
  if d and d.accel == "kvm" then return check("kvm", "ok", "a guest kernel booted under KVM (this boot's trial)") end
  if d then return check("kvm", "warn", tostring(d.why) .. " (this boot's trial); microVMs run under TCG") end
  check("kvm", "ok", accel.DEVICE .. " opens; the first microVM tries a guest on it (tupper doctor --kvm-check tries now)")
  return "untried"
end

-- the KVM line, with its facts: accel (what a microVM would run on) and why
local function check_kvm(state, kvm_check, have_qemu)
  local untried = kvm_checks(state, kvm_check, have_qemu) == "untried"
  local c = checks[#checks]
  -- accel: what a microVM runs on (kvm or tcg), or "untried" before the
  -- first trial of this boot
  facts({ accel = untried and "untried" or (c.status == "ok" and "kvm" or "tcg"), device = accel.DEVICE })
end

local function check_nofile()
  local soft, hard = (read("/proc/self/limits") or ""):match("Max open files%s+(%S+)%s+(%S+)")
  local n = soft == "unlimited" and math.huge or tonumber(soft)
  if not n then return check("open files", "warn", "cannot read /proc/self/limits") end
  local f = { soft = tonumber(soft) or soft, hard = tonumber(hard) or hard }
  if n < M.NOFILE_WANT then
    check("open files", "warn", ("limit %s (hard %s): a daemon with many boxes runs out"):format(soft, hard),
      ("ulimit -n %d before tupper daemon (systemd: LimitNOFILE=65536)"):format(M.NOFILE_WANT))
    return facts(f)
  end
  check("open files", "ok", ("limit %s (hard %s)"):format(soft, hard))
  facts(f)
end

-- socket: the one named, else nil: where a client looks (its own, then the system's)
local function check_daemon(socket)
  local res
  local c, err = client.connect({ socket = socket, autostart = false })
  socket = c and c.socket or socket or paths.socket()
  if c then
    res = { ok = true, server = c.server }
    c:close()
  else
    res = { ok = false, err = err }
  end
  if res.ok then
    local s = res.server or {}
    check("daemon", "ok", ("answers at %s (tupper %s, protocol %s)"):format(socket, tostring(s.version or "?"),
      tostring(math.tointeger(s.protocol) or s.protocol or "?")))
    return facts({ socket = socket, answers = true, version = s.version })
  end
  local e = tostring(res.err)
  check("daemon", "warn", e:find("^no tupper daemon") and e:match("^(.-): start one") or e,
    ("tupper daemon%s &  (or systemctl start tupper.socket)"):format(socket == paths.socket() and "" or
      (" --socket " .. socket)))
  facts({ socket = socket, answers = false })
end

local function check_state(dir)
  local st = uv.fs_stat(dir)
  if not st then
    -- the nearest existing parent must let the daemon make it
    local parent = dir
    repeat parent = parent:match("^(.*)/[^/]*$") or "/" until parent == "" or uv.fs_stat(parent ~= "" and parent or "/")
    parent = parent ~= "" and parent or "/"
    if uv.fs_access(parent, "w") then
      return check("state dir", "ok", dir .. " (made by the daemon's first start)")
    end
    return check("state dir", "fail", ("%s does not exist and %s is not writable"):format(dir, parent),
      ("mkdir -p %s, or tupper daemon --state-dir DIR"):format(dir), true)
  end
  if st.type ~= "directory" then
    return check("state dir", "fail", dir .. " is not a directory", "remove it or use --state-dir DIR", true)
  end
  if not uv.fs_access(dir, "rw") then
    return check("state dir", "fail", dir .. " is not writable by uid " .. uv.getuid(),
      "run the daemon as its owner, or --state-dir DIR", true)
  end
  local fs = uv.fs_statfs and uv.fs_statfs(dir)
  local free = fs and fs.bavail * fs.bsize
  if free and free < 2 * 1024 ^ 3 then
    return check("state dir", "warn", ("%s: %.1f GiB free"):format(dir, free / 1024 ^ 3),
      "free space there: images and writable layers live in it")
  end
  check("state dir", "ok", dir .. (free and (" (%.0f GiB free)"):format(free / 1024 ^ 3) or ""))
end

--- Runs the checks (from a coroutine); returns them (a list of { name, status = ok|warn|fail,
-- detail, fix, blocker }).  opts: socket, state_dir, kvm_check.
function M.checks(opts)
  checks = {}
  check("kernel", "ok", ("Linux %s (%s)"):format(uv.os_uname().release, uv.os_uname().machine))
  if uv.getuid() ~= 0 then
    check("user", "warn", "uid " .. uv.getuid() .. ": the daemon maps the boxes' uid ranges and mounts as root",
      "run tupper daemon as root (or through tupper.socket)")
  else
    check("user", "ok", "root")
  end
  check_cgroups()
  check_userns()
  check_overlay()
  check_seccomp()
  local have_qemu = check_qemu()
  check_kvm(opts.state_dir or paths.state_dir(), opts.kvm_check, have_qemu)
  check_nofile()
  check_daemon(opts.socket)
  check_state(opts.state_dir or paths.state_dir())
  check_disk_pool(opts.state_dir or paths.state_dir())
  return checks
end

--- `tupper doctor`: p the parsed arguments, g the global options.
function M.main(p, g)
  local list, cerr
  async.spawn(function()
    local ok, r = pcall(M.checks, { socket = g.socket, state_dir = g.state_dir, kvm_check = p.opts.kvm_check })
    if ok then list = r else cerr = r end
  end)
  uv.run()
  if not list then
    io.stderr:write("tupper: doctor: ", tostring(cerr), "\n")
    return 125
  end
  local blocked = false
  for _, c in ipairs(list) do blocked = blocked or c.blocker == true end
  if p.opts.json then
    print(json.encode({ ok = not blocked, checks = json.array(list) }))
  else
    for _, c in ipairs(list) do
      local tag = c.status == "ok" and "ok  " or (c.status == "warn" and "warn" or "FAIL")
      print(("%s  %-16s %s"):format(tag, c.name, c.detail))
      if c.fix then print(("      %-16s fix: %s"):format("", c.fix)) end
    end
    print(blocked and "tupper cannot run sandboxes here until the FAIL lines are fixed."
      or "tupper can run sandboxes here.")
  end
  uv.walk(function(h) if not h:is_closing() then h:close() end end)
  uv.run()
  return blocked and 1 or 0
end

return M
