--- The microVM's accelerator: KVM where a guest kernel really runs on it,
-- else TCG (emulation), with the reason said once.
--
-- A /dev/kvm that opens is not enough. QEMU runs as an unprivileged uid
-- of its own with no supplementary groups, so the device must be open to
-- others (udev's usual 0666); and some hosts offer a /dev/kvm on which no
-- ordinary guest kernel boots (a nested PVM device: KVM's ioctls and even
-- a real-mode guest work, but the kernel hangs once it leaves real mode).
-- So the first start tries it: the guest kernel itself, no initramfs, on
-- the console; KVM is usable once the kernel prints its banner. The answer
-- is kept per boot of the host (and QEMU binary, and kernel) in the state
-- dir, so a daemon pays for the trial once per boot at most: about 0.2 s
-- where KVM works, TRIAL_MS where it does not.
local uv = require("luv")
local async = require("tupper.util.async")

local M = {}

M.TRIAL_MS = 10000      -- a working KVM prints the banner in well under a second
M.TRIAL_OUTPUT_MAX = 65536
M.CACHE_MAX = 4096
M.DEVICE = "/dev/kvm"
M.getenv = os.getenv    -- where TUPPER_VM_ACCEL is read (a spec gives its own)
M.warn = function(msg) io.stderr:write(msg) end -- the daemon's log

local decided           -- { accel =, why = } once known
local inflight          -- callbacks waiting for a trial under way
local warned = false

local function read_small(path, max)
  local fd = uv.fs_open(path, "r", 0)
  if not fd then return nil end
  local s = uv.fs_read(fd, max, 0)
  uv.fs_close(fd)
  return s
end

M.CHOICES = { kvm = true, tcg = true, auto = true }
local daemon_choice -- `tupper daemon --accel kvm|tcg`; nil: auto

--- The daemon's own choice (`tupper daemon --accel`): "kvm" or "tcg" skip
-- the trial, "auto" or nil let it decide.  Returns true or nil, err.
function M.set_default(a)
  if a ~= nil and not M.CHOICES[a] then return nil, "accel must be kvm, tcg or auto" end
  daemon_choice = a ~= "auto" and a or nil
  decided, warned = nil, false
  return true
end

-- What the host says before any trial: "kvm" with no reason when a trial
-- must decide, or the accelerator and why.
local function static_choice()
  if daemon_choice then return daemon_choice, "tupper daemon --accel " .. daemon_choice end
  local env = M.getenv("TUPPER_VM_ACCEL")
  if env == "kvm" or env == "tcg" then return env, "TUPPER_VM_ACCEL=" .. env end
  local st = uv.fs_stat(M.DEVICE)
  if not st then return "tcg", "this host has no " .. M.DEVICE end
  local mode = st.mode & 511
  if mode & 6 ~= 6 then
    return "tcg", ("%s is mode %04o: QEMU's unprivileged uid cannot open it (udev's usual 0666 lets it)")
      :format(M.DEVICE, mode)
  end
  local fd, err = uv.fs_open(M.DEVICE, "r+", 0)
  if not fd then return "tcg", M.DEVICE .. " does not open: " .. tostring(err) end
  uv.fs_close(fd)
  return "kvm", nil
end

-- The key of a cached answer: the host's boot, QEMU's binary, the kernel.
local function cache_key(qemu_bin, vmlinuz)
  local boot = (read_small("/proc/sys/kernel/random/boot_id", 64) or ""):match("^[%x%-]+")
  local q, k = uv.fs_stat(qemu_bin), uv.fs_stat(vmlinuz)
  if not boot or not q or not k then return nil end
  return ("%s %d-%d-%d %d-%d-%d"):format(boot, q.size, q.mtime.sec, q.ino, k.size, k.mtime.sec, k.ino)
end

-- A cached answer for key, or nil (the file is the daemon's own, in its
-- 0700 state dir, but is read as if hostile: one exact line or nothing).
local function cached(path, key)
  local s = read_small(path, M.CACHE_MAX)
  if not s then return nil end
  local k, accel, why = s:match("^([^\t\n]+)\t(%l+)\t([^\t\n]*)\n$")
  if k ~= key or (accel ~= "kvm" and accel ~= "tcg") then return nil end
  return { accel = accel, why = why ~= "" and why or nil }
end

local function store(dir, path, key, d)
  uv.fs_mkdir(dir, 448) -- the first VM start makes it otherwise later; EEXIST is fine
  local tmp = path .. ".tmp-" .. uv.getpid()
  local fd = uv.fs_open(tmp, "w", 384)
  if not fd then return end
  uv.fs_write(fd, ("%s\t%s\t%s\n"):format(key, d.accel, (d.why or ""):gsub("[\t\n]", " ")), 0)
  uv.fs_close(fd)
  if not uv.fs_rename(tmp, path) then uv.fs_unlink(tmp) end
end

--- Boots the guest kernel vmlinuz under KVM as uid (QEMU's own kind of
-- uid) until its banner shows on the console, or TRIAL_MS pass, or QEMU
-- exits.  Call from a coroutine.  Returns true, or false and why.
function M.trial(qemu_bin, vmlinuz, uid)
  local kfd, kerr = uv.fs_open(vmlinuz, "r", 0)
  if not kfd then return false, "the guest kernel does not open: " .. tostring(kerr) end
  local out, errp = uv.new_pipe(), uv.new_pipe()
  local args = { "-M", "microvm,accel=kvm", "-m", "128M", "-smp", "1", "-nodefaults",
    "-no-user-config", "-display", "none", "-no-reboot",
    "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    "-serial", "stdio", "-kernel", "/proc/self/fd/3", "-append", "console=ttyS0 panic=-1 reboot=t" }
  local res = async.wait(function(cb)
    local seen, size, exited, timer, handle = {}, 0, false, nil, nil
    local done = false
    local function finish(ok, why)
      if done then return end
      done = true
      if timer and not timer:is_closing() then timer:close() end
      if handle and not exited then handle:kill("sigkill") end
      cb({ ok = ok, why = why, tail = table.concat(seen):sub(-300) })
    end
    local perr
    handle, perr = uv.spawn(qemu_bin, { args = args, stdio = { nil, out, errp, kfd }, uid = uid, gid = uid },
      function(code, sig)
        exited = true
        handle:close()
        if not out:is_closing() then out:close() end
        if not errp:is_closing() then errp:close() end
        finish(false, ("QEMU exited (code %s, signal %s) before the guest kernel printed anything")
          :format(tostring(code), tostring(sig)))
      end)
    if not handle then
      out:close(); errp:close()
      return finish(false, "QEMU does not start: " .. tostring(perr))
    end
    timer = uv.new_timer()
    timer:start(M.TRIAL_MS, 0, function()
      finish(false, ("the guest kernel printed nothing in %.1f s under KVM"):format(M.TRIAL_MS / 1000))
    end)
    local function reader(_, data)
      if not data then return end
      if size < M.TRIAL_OUTPUT_MAX then seen[#seen + 1] = data; size = size + #data end
      if table.concat(seen):find("Linux version", 1, true) then finish(true) end
    end
    out:read_start(reader)
    errp:read_start(reader)
  end)
  uv.fs_close(kfd)
  if res.ok then return true end
  local tail = res.tail:gsub("[^%g ]+", " "):gsub("^%s+", ""):gsub("%s+$", "")
  return false, res.why .. (tail ~= "" and (" (its last output: " .. tail .. ")") or "")
end

--- Decides the accelerator once per daemon (call from a coroutine, before
-- a VM starts): static checks, then the cached trial of this boot, else a
-- trial.  opts: state_dir, vmlinuz, qemu (the binary), uid (an unprivileged
-- uid QEMU may run as for the trial).  Returns "kvm" or "tcg".
function M.decide(opts)
  if decided then return decided.accel end
  if inflight then
    return async.wait(function(cb) inflight[#inflight + 1] = cb end)
  end
  local accel, why = static_choice()
  if accel == "kvm" and why == nil then
    inflight = {}
    local dir = opts.state_dir .. "/microvm"
    local path = dir .. "/accel"
    local key = cache_key(opts.qemu, opts.vmlinuz)
    local d = key and cached(path, key)
    if not d then
      local ok, terr = M.trial(opts.qemu, opts.vmlinuz, opts.uid)
      d = ok and { accel = "kvm" } or { accel = "tcg", why = "KVM cannot run a guest here: " .. terr }
      if key then store(dir, path, key, d) end
    end
    accel, why = d.accel, d.why
  end
  decided = { accel = accel, why = why }
  if accel == "tcg" and not warned then
    warned = true
    M.warn("tupper: warning: microVMs run under TCG emulation, which is slow and meant for testing: " ..
      (why or "") .. " (docs/microvm.md)\n")
  end
  local waiting = inflight or {}
  inflight = nil
  for _, cb in ipairs(waiting) do cb(accel) end
  return accel
end

--- The accelerator of one VM: requested ("kvm" or "tcg", a create's
-- `accel`) as asked, with no trial (a start that fails says why, QEMU's
-- own words included); "auto" or nil: the daemon's (decide).  Returns the
-- accelerator and why it was chosen.
function M.choose(requested, opts)
  if requested == "kvm" or requested == "tcg" then return requested, "asked for by the create" end
  local a = M.decide(opts)
  local _, why = M.current()
  return a, why
end

--- What a daemon with state_dir learnt from its trial of this boot (for
-- `tupper doctor`): { accel =, why = } or nil when there is none (or it is
-- for another boot, QEMU or kernel).  Runs nothing.
function M.cached_trial(state_dir, qemu_bin, vmlinuz)
  local key = cache_key(qemu_bin, vmlinuz)
  return key and cached(state_dir .. "/microvm/accel", key) or nil
end

--- What the host says before any trial: "kvm" with no reason when a trial
-- must decide, else the accelerator and why.
function M.static()
  return static_choice()
end

--- The accelerator decided, or (before the first VM start) what the host
-- says without a trial; and why, when it is TCG.
function M.current()
  if decided then return decided.accel, decided.why end
  return static_choice()
end

return M
