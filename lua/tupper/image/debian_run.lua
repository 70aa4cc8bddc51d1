--- The mmdebstrap driver of Debian images (image/debian.lua): the build's
-- child processes, each in a process group of its own that a time bound or
-- the daemon's shutdown kills whole; the hooks the build runs in the
-- chroot; what the host's apt configuration passes on; and the files of a
-- build's work dir.  Call from a coroutine (tupper.async): a run waits on
-- the loop.
local uv = require("luv")
local async = require("tupper.util.async")
local apt = require("tupper.image.debian_apt")

local M = {}

M.STDOUT_MAX = 1024 * 1024 -- bytes of mmdebstrap's stdout kept
M.GROUP_WAIT_MS = 2000     -- how long a stopped run waits for the last of its process group

-- ------------------------------------------------------------ children

local running = {} -- pid -> stop(), of the children running now

--- Stops every build this process runs (the daemon's shutdown): each
-- child's process group gets SIGTERM, SIGKILL 10 s later; the builds fail
-- and remove their work dirs.
function M.cancel_all()
  for _, stop in pairs(running) do stop("cancel") end
end

local function close(h)
  if h and not h:is_closing() then h:close() end
end

-- The state (R, S, Z, ...) and process group of the process pid, from
-- /proc/<pid>/stat ("pid (comm) state ppid pgrp ..."; comm may hold
-- spaces and parentheses, hence the last ')').
local function proc_state(pid)
  local fd = uv.fs_open("/proc/" .. pid .. "/stat", "r", 0)
  if not fd then return nil end
  local text = uv.fs_read(fd, 4096, 0)
  uv.fs_close(fd)
  local state, pgrp = (text or ""):match("^%d+ %(.*%) (%a) %-?%d+ (%-?%d+)")
  return state, tonumber(pgrp)
end

-- Whether a process of group pgid is alive.  A zombie is not: it has
-- exited, and its new parent (the members are reparented once the leader
-- is reaped) reaps it when it will, which kill(-pgid, 0) cannot tell.
local function group_alive(pgid)
  local ok, _, name = uv.kill(-pgid, 0)
  if not ok and name == "ESRCH" then return false end
  local dir = uv.fs_scandir("/proc")
  if not dir then return true end
  while true do
    local pid = uv.fs_scandir_next(dir)
    if not pid then return false end
    if pid:match("^%d+$") then
      local state, pgrp = proc_state(pid)
      if pgrp == pgid and state ~= "Z" then return true end
    end
  end
end

-- SIGKILLs group pgid, then calls done() once none of it is alive, or
-- after wait_ms (a process stuck in the kernel does not hold the caller
-- for ever); polls every 20 ms, killing again what a fork let in.
local function kill_group(pgid, wait_ms, done)
  uv.kill(-pgid, "sigkill")
  if not group_alive(pgid) then return done() end
  local t, left = uv.new_timer(), wait_ms
  t:start(20, 20, function()
    left = left - 20
    uv.kill(-pgid, "sigkill")
    if left > 0 and group_alive(pgid) then return end
    t:close()
    done()
  end)
end

--- Runs argv (argv[1] an absolute path) with environment env (a list of
-- "K=V"); waits in the calling coroutine.  Keeps at most stdout_max bytes
-- of stdout (more fails the run).  After timeout seconds, or on
-- cancel_all, its whole process group is stopped (SIGTERM, SIGKILL 10 s
-- later); a run stopped so, or past stdout_max, returns only once no
-- process of its group is alive (GROUP_WAIT_MS at most after the leader
-- and stdout are done).  Returns { code, signal, stdout, over, stopped =
-- "timeout"|"cancel"|nil }, or nil, err.
function M.run(argv, env, stdout_max, timeout)
  local null = uv.fs_open("/dev/null", "r", 0)
  if not null then return nil, "cannot open /dev/null" end
  local res = async.wait(function(cb)
    local out = uv.new_pipe(false)
    local chunks, size, over = {}, 0, false
    local code, sig, pending = nil, nil, 2
    local handle, pid, timer, killer, why
    local function finish()
      pending = pending - 1
      if pending > 0 then return end
      running[pid] = nil
      close(timer); close(killer)
      local function done()
        cb({ code = code, signal = sig, stdout = table.concat(chunks), over = over,
             stopped = why })
      end
      if not (why or over) then return done() end
      -- the leader is gone and stdout is at EOF, but a member may live on:
      -- one that ignored SIGTERM and let go of stdout, or one that closed
      -- its fds on its way out and is not a zombie yet
      kill_group(pid, M.GROUP_WAIT_MS, done)
    end
    local args = {}
    for i = 2, #argv do args[#args + 1] = argv[i] end
    handle, pid = uv.spawn(argv[1], { args = args, env = env, stdio = { null, out, 2 }, detached = true },
      function(c, s)
        code, sig = c, s
        close(handle)
        finish()
      end)
    if not handle then
      close(out)
      cb({ err = ("cannot run %s: %s"):format(argv[1], tostring(pid)) })
      return
    end
    local function stop(reason)
      why = why or reason
      if killer then return end
      uv.kill(-pid, "sigterm")
      killer = uv.new_timer()
      killer:start(10000, 0, function() uv.kill(-pid, "sigkill") end)
    end
    running[pid] = stop
    timer = uv.new_timer()
    timer:start(math.floor(timeout * 1000), 0, function() stop("timeout") end)
    out:read_start(function(err, data)
      if data and not over then
        size = size + #data
        if size > stdout_max then
          over = true
          chunks = {}
          uv.kill(-pid, "sigkill")
        else
          chunks[#chunks + 1] = data
        end
      elseif not data then
        close(out)
        finish()
      end
    end)
  end)
  uv.fs_close(null)
  if res.err then return nil, res.err end
  return res
end

-- ------------------------------------------------------------- files

--- Removes a tree without following symlinks.
function M.rmtree(path)
  local st = uv.fs_lstat(path)
  if not st then return end
  if st.type == "directory" then
    local dir = uv.fs_scandir(path)
    while dir do
      local name = uv.fs_scandir_next(dir)
      if not name then break end
      M.rmtree(path .. "/" .. name)
    end
    uv.fs_rmdir(path)
  else
    uv.fs_unlink(path)
  end
end

--- Writes text to path (mode, default 0644).  Returns true, or nil, err.
function M.write_file(path, text, mode)
  local fd, err = uv.fs_open(path, "w", mode or tonumber("644", 8))
  if not fd then return nil, err end
  local ok
  ok, err = uv.fs_write(fd, text, 0)
  uv.fs_close(fd)
  if not ok then return nil, err end
  return true
end

-- The last lines of mmdebstrap's log that say what failed ("E: ...").
local function log_errors(path)
  local fd = uv.fs_open(path, "r", 0)
  if not fd then return "" end
  local st = uv.fs_fstat(fd)
  local from = math.max(0, (st and st.size or 0) - 16384)
  local text = uv.fs_read(fd, 16384, from) or ""
  uv.fs_close(fd)
  local errs = {}
  for line in text:gmatch("[^\n]+") do
    if line:match("^E: ") then
      errs[#errs + 1] = #line > 300 and line:sub(1, 300) .. "..." or line
    end
  end
  if #errs == 0 then
    for line in text:gmatch("[^\n]+") do errs[#errs + 1] = line end
    while #errs > 5 do table.remove(errs, 1) end
  end
  while #errs > 12 do table.remove(errs, 1) end
  return table.concat(errs, "\n")
end

-- ------------------------------------------------------------- hooks

-- The customize hook: the account, sudo rule, locale and host files an agent
-- expects, written the same way on every build.
local CUSTOMIZE = [[
#!/bin/sh
# Written by tupper (lua/tupper/image/debian_run.lua): what an agent expects of a
# general-purpose sandbox.  $1 is the chroot.
set -eu
root=$1
if ! chroot "$root" getent passwd @USER@ >/dev/null; then
  chroot "$root" useradd --uid @UID@ --user-group --create-home --home-dir @HOME@ --shell /bin/bash @USER@
fi
if [ -e "$root/usr/bin/sudo" ]; then
  printf '@USER@ ALL=(ALL:ALL) NOPASSWD: ALL\n' > "$root/etc/sudoers.d/tupper-@USER@"
  chmod 0440 "$root/etc/sudoers.d/tupper-@USER@"
fi
printf 'tupper\n' > "$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"
chmod 0644 "$root/etc/hostname" "$root/etc/hosts"
rm -f "$root/etc/resolv.conf"
printf 'LANG=C.UTF-8\n' > "$root/etc/default/locale"
rm -f "$root/etc/apt/preferences.d/tupper-lock"
]]

-- The setup hook of a locked build: pins every package at its locked
-- version, so that even the essential set (which mmdebstrap picks before
-- any --include) comes at the lock's versions.  The --include stays the
-- recipe's names, as in the first build: naming every package would mark
-- them all as installed by hand, and the image would differ from the first
-- build in /var/lib/apt/extended_states.
local function pin_hook(packages)
  local lines = {}
  for _, p in ipairs(packages) do
    local name, version = p:match("^([^=]+)=(.+)$")
    lines[#lines + 1] = ("Package: %s\nPin: version %s\nPin-Priority: 1001\n"):format(name, version)
  end
  return "#!/bin/sh\n# Written by tupper: the lock's versions.\nset -eu\n" ..
    "mkdir -p \"$1/etc/apt/preferences.d\"\n" ..
    "cat > \"$1/etc/apt/preferences.d/tupper-lock\" <<'TUPPER_LOCK_EOF'\n" ..
    table.concat(lines, "\n") .. "TUPPER_LOCK_EOF\n"
end

--- Writes the build's hook dir, work/hooks: the customize hook (the agent's
-- account, given as { user, uid, home }) and, for a locked build, the
-- setup hook pinning pins ("name=version").  Returns its path, or nil, err.
function M.write_hooks(work, account, pins)
  local hooks = work .. "/hooks"
  uv.fs_mkdir(hooks, tonumber("755", 8))
  uv.fs_chmod(work, tonumber("755", 8))
  local customize = CUSTOMIZE:gsub("@(%u+)@", { USER = account.user, UID = tostring(account.uid), HOME = account.home })
  local ok, err = M.write_file(hooks .. "/customize50-tupper.sh", customize, tonumber("755", 8))
  if ok and pins then
    ok, err = M.write_file(hooks .. "/setup50-tupper-lock.sh", pin_hook(pins), tonumber("755", 8))
  end
  if not ok then return nil, err end
  return hooks
end

-- ------------------------------------------------------------- mmdebstrap

-- The host's apt options that mmdebstrap's own apt should share: a host on
-- a snapshot mirror turns off the Valid-Until check, or nothing would build.
--- The host's apt options that mmdebstrap's own apt should share (see above).
function M.host_aptopts()
  local res = M.run({ "/usr/bin/apt-config", "shell", "V", "Acquire::Check-Valid-Until", "D",
                    "Acquire::Check-Date" }, { "PATH=/usr/bin:/bin" }, 4096, 30)
  local out = {}
  if res and res.code == 0 then
    if res.stdout:match("V='false'") then out[#out + 1] = 'Acquire::Check-Valid-Until "false"' end
    if res.stdout:match("D='false'") then out[#out + 1] = 'Acquire::Check-Date "false"' end
  end
  return out
end

--- One mmdebstrap run of a build, logging to work/<what>.log (removed when
-- it succeeds).  o: bin (mmdebstrap's path), work, what, suite, mirror
-- (entries), include (names), target ("/dev/null" with --simulate: apt
-- only resolves), extra (arguments), aptopts, env, timeout (s), on_start(argv).
-- Returns true, or nil, err (apt's error lines from the log, a time bound,
-- a cancel).
function M.mmdebstrap(o)
  local log = o.work .. "/" .. o.what .. ".log"
  local argv = { o.bin, "--mode=unshare", "--variant=apt", "--logfile=" .. log, "--verbose" }
  for _, a in ipairs(o.extra) do argv[#argv + 1] = a end
  for _, a in ipairs(o.aptopts) do argv[#argv + 1] = "--aptopt=" .. a end
  if #o.include > 0 then argv[#argv + 1] = "--include=" .. table.concat(o.include, ",") end
  argv[#argv + 1] = "--"
  argv[#argv + 1] = o.suite
  argv[#argv + 1] = o.target
  for _, m in ipairs(o.mirror) do
    for _, line in ipairs(apt.source_lines(m)) do argv[#argv + 1] = line end
  end
  if o.on_start then o.on_start(argv) end
  local res, rerr = M.run(argv, o.env, M.STDOUT_MAX, o.timeout)
  if not res then return nil, rerr end
  if res.stopped == "cancel" then return nil, "the build was stopped (the daemon is shutting down)" end
  if res.stopped == "timeout" then
    return nil, ("mmdebstrap took longer than %s s and was killed"):format(o.timeout)
  end
  if res.code ~= 0 or res.signal ~= 0 then
    return nil, ("mmdebstrap failed (exit %d%s):\n%s"):format(res.code or -1,
      (res.signal or 0) ~= 0 and (", signal " .. res.signal) or "", log_errors(log))
  end
  uv.fs_unlink(log)
  return true
end

return M
