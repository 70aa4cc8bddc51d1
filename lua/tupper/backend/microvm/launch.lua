--- Starts a microVM's QEMU: the files it gets as fds, its argv, its
-- console and its monitor.  Call from a coroutine.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local qemu = require("tupper.backend.microvm.qemu")
local console = require("tupper.backend.microvm.console")
local qmp = require("tupper.backend.microvm.qmp")

local M = {}

M.MONITOR_SOCK = "monitor.sock" -- in the VM's dir: QEMU listens (its second monitor)

--- Starts QEMU.  o: id, dir (exists), uid, cgroup, limits, mem, cpus, rw,
-- accel; ram_fd (the guest memory: the template's memfd, or a snapshot's
-- sealed one) and share; incoming (a snapshot's device state file to start
-- from: with -incoming defer, see restore()); template (a snapshot's VM:
-- it dies with the daemon).  Returns core's box, the console reader, the
-- QMP client.
function M.launch(p, o)
  local cmdline = qemu.cmdline(o.accel)
  -- QEMU opens nothing by path: the daemon opens, QEMU gets fds 4..11
  -- (kernel, initramfs, image, writable disk, monitor, state, memory, the
  -- listening monitor); a
  -- VM started from a snapshot gets no kernel nor initramfs
  local files = { { p.k.vmlinuz, "r" }, { p.initrd, "r" }, { p.root, "r" }, { o.rw, "r+" } }
  if o.incoming then files[1], files[2], files[6] = false, false, { o.incoming, "r" } end

  local pass = {}
  local qpair = uv.socketpair("stream", 0, { cloexec = true }, { cloexec = true })
  local function close_pass()
    for i, f in pairs(pass) do if f ~= qpair[2] and i ~= 7 and i ~= 8 then uv.fs_close(f) end end
  end
  -- a second monitor, on a socket QEMU listens on in the VM's root-only
  -- dir (monitor.sock): the way back to the monitor for a daemon that
  -- re-adopts the VM after a crash (the socketpair's end died with the
  -- old one).  Bound through the dir's fd: the dir's path may be longer
  -- than a socket path may be.  Not for a template, which dies with us.
  local msrv
  if not o.template then
    local dfd, derr = uv.fs_open(o.dir, "r", 0)
    if not dfd then uv.fs_close(qpair[1]); uv.fs_close(qpair[2]); return nil, derr end
    msrv = uv.new_pipe(false)
    local bok, berr = msrv:bind("/proc/self/fd/" .. dfd .. "/" .. M.MONITOR_SOCK)
    uv.fs_close(dfd)
    if bok then bok, berr = msrv:listen(1, function() end) end
    if not bok then
      msrv:close(); uv.fs_close(qpair[1]); uv.fs_close(qpair[2])
      return nil, "the VM's monitor socket: " .. tostring(berr)
    end
  end
  for i = 1, 7 do
    if i == 5 then
      pass[5] = qpair[2]
    elseif i == 7 and o.ram_fd then
      pass[7] = o.ram_fd -- the caller's
    elseif files[i] then
      local pfd, oerr = uv.fs_open(files[i][1], files[i][2], 384)
      if not pfd then close_pass(); uv.fs_close(qpair[1]); uv.fs_close(qpair[2]); return nil, oerr end
      pass[i] = pfd
    else
      pass[i] = qpair[2] -- a placeholder keeps the numbering: that fd is then unused
    end
  end
  pass[8] = msrv and msrv:fileno() or qpair[2]
  local function qfd(i) return "/proc/self/fd/" .. (3 + i) end
  local argv = qemu.argv({ accel = o.accel, kernel = not o.incoming and qfd(1) or nil, initrd = qfd(2),
    root = qfd(3), rw = qfd(4), mem = o.mem, cpus = o.cpus, cmdline = cmdline,
    ram = o.ram_fd and qfd(7) or nil, share = o.share })
  argv[#argv + 1] = "-chardev"
  argv[#argv + 1] = "socket,id=qmp,fd=8"
  argv[#argv + 1] = "-mon"
  argv[#argv + 1] = "chardev=qmp,mode=control"
  if msrv then
    for _, v in ipairs({ "-chardev", "socket,id=qmp2,fd=11,server=on,wait=off", "-mon", "chardev=qmp2,mode=control" }) do
      argv[#argv + 1] = v
    end
  end
  if o.incoming then
    argv[#argv + 1] = "-incoming"
    argv[#argv + 1] = "defer"
  end
  local fds = uv.pipe({ nonblock = true }, { nonblock = false })
  local cpipe = uv.new_pipe()
  cpipe:open(fds.read)
  local con = console.open(cpipe)
  local limits = o.limits or {}
  local box, serr = async.wait(function(cb)
    local sok, e = core.start("microvm", { id = o.id, dir = o.dir, argv = argv, fds = pass,
      uid = o.uid, gid = o.uid, cgroup = o.cgroup, console_fd = fds.write, die_with_parent = o.template,
      limits = { memory = o.mem + qemu.MEMORY_OVERHEAD, pids = qemu.QEMU_PIDS,
                 cpu_quota = limits.cpu_quota, cpu_period = limits.cpu_period } }, cb)
    if not sok then cb(nil, e) end
  end)
  uv.fs_close(fds.write)
  close_pass()
  uv.fs_close(qpair[2])
  -- QEMU holds the listening socket now; ours must never accept on it
  if msrv then msrv:close() end
  if not box then
    local hint = console.last_words(con)
    con.close()
    uv.fs_close(qpair[1])
    return nil, tostring(serr) .. hint
  end
  local q, qerr = qmp.open(qpair[1])
  if not q then
    -- QEMU exited (or will not talk): what it printed says why
    local hint = console.last_words(con)
    con.close()
    async.wait(function(cb) box:destroy(cb) end)
    return nil, ("QEMU (accel %s) failed: its monitor: %s%s"):format(o.accel, tostring(qerr), hint)
  end
  return box, con, q
end


return M
