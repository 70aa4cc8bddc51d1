-- tupper as a service (docs/install.md): the systemd units pass
-- `systemd-analyze verify`, the daemon takes a socket from
-- systemd-socket-activate and tells NOTIFY_SOCKET it is ready, refuses a
-- wrong activation with a clear error, and `make install` / `make deb` give
-- a binary that runs boxes from where it was installed.
local uv = require("luv")
local client = require("tupper.wire.client")
local helper = require("helper")

local BIN = helper.BIN
local BUILD = BIN:match("^(.*)/[^/]*$") or "."
local ROOT = helper.ROOT
local PY = "/usr/bin/python3"

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Runs a shell command line; returns its exit code and its output (stdout
-- and stderr together), bounded by `timeout`.
local function sh(cmd, secs)
  local p = assert(io.popen(("timeout %d sh -c %s 2>&1"):format(secs or 120, q(cmd))))
  local out = p:read("a")
  local _, _, code = p:close()
  return code, out
end

local function exists(path)
  return uv.fs_stat(path) ~= nil
end

-- Spawns argv (a list) with env (a list of K=V or nil); its stdout is
-- collected in proc.out, its stderr in proc.err.  The process is recorded for helper.cleanup_all.
local function spawn(argv, env)
  local proc = { out = {} }
  local stdout, stderr = uv.new_pipe(false), uv.new_pipe(false)
  local args = {}
  for i = 2, #argv do args[#args + 1] = argv[i] end
  local handle, pid = uv.spawn(argv[1], { args = args, env = env, stdio = { nil, stdout, stderr } },
    function(code, signal) proc.exit_code = signal ~= 0 and 128 + signal or code end)
  assert(handle, pid)
  proc.handle, proc.pid, proc.pipes = handle, pid, { stdout, stderr }
  stdout:read_start(function(_, chunk) if chunk then proc.out[#proc.out + 1] = chunk end end)
  proc.err = {}
  stderr:read_start(function(_, chunk) if chunk then proc.err[#proc.err + 1] = chunk end end)
  return helper.track(proc, argv[1])
end

local function wait_for(what, fn, ms)
  local deadline = helper.now() + (ms or 30000)
  helper.sync(function()
    while not fn() do
      if helper.now() > deadline then error("timed out waiting for " .. what) end
      require("tupper.util.async").sleep(10)
    end
  end)
end

local function stop(proc)
  if proc.exit_code == nil then uv.kill(proc.pid, "sigterm") end
  wait_for("pid " .. proc.pid .. " to exit", function() return proc.exit_code ~= nil end)
  for _, p in ipairs(proc.pipes) do if not p:is_closing() then p:close() end end
  if not proc.handle:is_closing() then proc.handle:close() end
  return proc.exit_code
end

local function env_with(extra)
  local env = { "PATH=" .. (os.getenv("PATH") or "/usr/bin:/bin"), "HOME=" .. (os.getenv("HOME") or "/") }
  for _, e in ipairs(extra or {}) do env[#env + 1] = e end
  return env
end

describe("the systemd units", function()
  it("pass systemd-analyze verify as installed, ExecStart naming the installed binary", function()
    assert.truthy(exists("/usr/bin/systemd-analyze"), "systemd-analyze is missing (bootstrap.sh test installs systemd)")
    local dir = helper.tmpdir()
    -- a prefix that exists on this host, so that verify finds ExecStart's binary
    local code, out = sh(("cmake --install %s --prefix %s/usr"):format(q(BUILD), q(dir)))
    assert.are.equal(0, code, out)
    local units = dir .. "/usr/lib/systemd/system"
    local service = helper.read_file(units .. "/tupper.service")
    assert.truthy(service, "tupper.service not installed")
    assert.are.equal(dir .. "/usr/bin/tupper daemon", service:match("\nExecStart=([^\n]*)"))
    assert.truthy(exists(units .. "/tupper.socket"))
    -- a unit verify only warns about still exits 0: no output at all is the pass
    code, out = sh(("systemd-analyze verify --man=no %s/tupper.socket %s/tupper.service"):format(q(units), q(units)))
    assert.are.equal(0, code, out)
    assert.are.equal("", out)
    local socket = helper.read_file(units .. "/tupper.socket")
    assert.truthy(socket:find("\nListenStream=/run/tupper/tupper.sock\n", 1, true))
    assert.truthy(socket:find("\nSocketMode=0660\n", 1, true))
    assert.truthy(service:find("\nType=notify\n", 1, true))
    helper.rmrf(dir)
  end)
end)

describe("socket activation", function()
  it("serves create, exec and kill on the socket systemd-socket-activate passed, reports READY, leaves the socket", function()
    assert.truthy(exists("/usr/bin/systemd-socket-activate"), "systemd-socket-activate is missing (bootstrap.sh test installs systemd)")
    local dir = helper.tmpdir()
    local sock, notify, log = dir .. "/activated.sock", dir .. "/notify", dir .. "/daemon.log"
    -- the service manager's end of sd_notify: prints each datagram it gets
    local listener = spawn({ PY, "-c", [[
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(60)
for _ in range(2):
    print(s.recv(4096).decode(), flush=True)
]], notify })
    wait_for("the notify socket", function() return exists(notify) end)
    local act = spawn({ "/usr/bin/systemd-socket-activate", "-l", sock, "--fdname=tupper.socket",
      "-E", "NOTIFY_SOCKET=" .. notify,
      BIN, "daemon", "--state-dir", dir .. "/state", "--log", log, "--pool", "0" }, env_with())
    -- nothing runs the daemon yet: systemd-socket-activate execs it on the
    -- first connection (refused between its bind and its listen)
    local c
    wait_for("the activation socket", function()
      c = client.connect({ socket = sock, autostart = false })
      return c ~= nil
    end)
    local created = assert(helper.call(c, "sandbox.create", {}))
    local r = assert(helper.sync(helper.run, c, created.id, { "sh", "-c", "echo activated; exit 3" }))
    assert.are.equal("activated\n", r.stdout)
    assert.are.equal(3, r.exit_code)
    assert(helper.call(c, "sandbox.kill", { id = created.id }))
    local list = assert(helper.call(c, "sandbox.list", {}))
    assert.are.equal(0, #list.sandboxes)
    c:close()
    wait_for("READY=1", function() return table.concat(listener.out):find("READY=1", 1, true) end)
    -- systemd-socket-activate exec'd the daemon: same pid
    local cmdline = helper.read_file("/proc/" .. act.pid .. "/cmdline") or ""
    assert.truthy(cmdline:find("daemon", 1, true), cmdline)
    assert.are.equal(0, stop(act))
    wait_for("STOPPING=1", function() return table.concat(listener.out):find("STOPPING=1", 1, true) end)
    stop(listener)
    local text = helper.read_file(log) or ""
    assert.truthy(text:find("listening on " .. sock .. " (socket-activated)", 1, true), text)
    -- the path is the service manager's: the daemon did not unlink it
    local st = uv.fs_stat(sock)
    assert.truthy(st and st.type == "socket", "the activated socket's path is gone")
    helper.rmrf(dir)
  end)

  it("ignores LISTEN_PID of another process and binds its own socket", function()
    local dir = helper.tmpdir()
    local d = helper.start_daemon(dir, { pool = 0, env = env_with({ "LISTEN_PID=1", "LISTEN_FDS=1" }) })
    local c = assert(d.connect())
    assert(helper.call(c, "sandbox.list", {}))
    c:close()
    local text = helper.read_file(d.log) or ""
    assert.truthy(text:find("listening on " .. d.socket .. " (state", 1, true), text)
    assert.are.equal(0, d.stop())
    assert.falsy(exists(d.socket), "a daemon that bound its own socket removes it")
  end)

  -- Runs the daemon with LISTEN_PID = its own pid (sh's $$, kept by exec)
  -- and `setup` (shell: variables, redirections) or, with py, a python
  -- program that puts a socket on fd 3 first.  Returns code, output, state dir.
  local function activate(setup, py)
    local dir = helper.tmpdir()
    local state = dir .. "/state"
    local daemon = ("%s daemon --socket %s --state-dir %s --pool 0"):format(q(BIN), q(dir .. "/s.sock"), q(state))
    local cmd
    if py then
      cmd = ("%s -c %s %s"):format(PY, q(py .. [[

import os, sys
os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)  # dup2 onto itself (s was fd 3) keeps close-on-exec
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
os.execv(sys.argv[1], sys.argv[1:])
]]), daemon)
    else
      cmd = ("LISTEN_PID=$$ %s exec %s"):format(setup, daemon)
    end
    local code, out = sh(cmd, 60)
    return code, out, state, dir
  end

  local BAD = {
    { "a LISTEN_FDS that is not a number", "LISTEN_FDS=abc", 'LISTEN_FDS="abc" is not a number of fds' },
    { "an empty LISTEN_FDS", "LISTEN_FDS=", 'LISTEN_FDS="" is not a number of fds' },
    { "a negative LISTEN_FDS", "LISTEN_FDS=-1", 'LISTEN_FDS="-1" is not a number of fds' },
    { "a huge LISTEN_FDS", "LISTEN_FDS=99999999999999999999", "is not a number of fds" },
    { "two fds", "LISTEN_FDS=2", "2 fds passed; the daemon takes exactly one" },
    { "no fd", "LISTEN_FDS=0", "0 fds passed" },
    { "more names than fds", "LISTEN_FDS=1 LISTEN_FDNAMES=a:b 3</dev/null", "names more fds than LISTEN_FDS=1" },
    { "an fd 3 that is not open", "LISTEN_FDS=1 3>&-", "fd 3 was not passed in" },
    { "an fd 3 that is not a socket", "LISTEN_FDS=1 3</dev/null", "fd 3 is not a socket" },
  }
  for _, case in ipairs(BAD) do
    it("refuses " .. case[1] .. " with a clear error, before touching the state dir", function()
      local code, out, state, dir = activate(case[2])
      assert.are.equal(1, code, out)
      assert.truthy(out:find("tupper daemon: socket activation: ", 1, true), out)
      assert.truthy(out:find(case[3], 1, true), out)
      assert.falsy(exists(state), "the daemon made its state dir")
      helper.rmrf(dir)
    end)
  end

  it("refuses a LISTEN_PID that is not a pid", function()
    local code, out, state, dir = activate("LISTEN_PID=12x LISTEN_FDS=1")
    assert.are.equal(1, code, out)
    assert.truthy(out:find('LISTEN_PID="12x" is not a pid', 1, true), out)
    assert.falsy(exists(state))
    helper.rmrf(dir)
  end)

  local SOCKETS = {
    { "a TCP socket", 'import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n'
      .. 's.bind(("127.0.0.1", 0))\ns.listen()', "fd 3 is not a unix socket" },
    { "a unix datagram socket", 'import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)',
      "fd 3 is not a stream socket" },
    { "a unix stream socket that does not listen", 'import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)',
      "fd 3 is not listening" },
  }
  for _, case in ipairs(SOCKETS) do
    it("refuses " .. case[1] .. " on fd 3", function()
      local code, out, state, dir = activate(nil, case[2])
      assert.are.equal(1, code, out)
      assert.truthy(out:find("socket activation: " .. case[3], 1, true), out)
      assert.falsy(exists(state))
      helper.rmrf(dir)
    end)
  end
end)

describe("make install and make deb", function()
  it("make install honours PREFIX and DESTDIR; the installed binary runs a box", function()
    local dir = helper.tmpdir()
    local dest = dir .. "/dest"
    local code, out = sh(("make -C %s install BUILD=%s PREFIX=/usr DESTDIR=%s"):format(q(ROOT), q(BUILD), q(dest)), 300)
    assert.are.equal(0, code, out)
    local bin = dest .. "/usr/bin/tupper"
    for _, f in ipairs({ bin, dest .. "/usr/bin/tupper-core" }) do
      local st = uv.fs_stat(f)
      assert.truthy(st and st.type == "file", "no " .. f)
    end
    local service = helper.read_file(dest .. "/usr/lib/systemd/system/tupper.service") or ""
    -- the unit names the final path, not the staging one
    assert.are.equal("/usr/bin/tupper daemon", service:match("\nExecStart=([^\n]*)"))
    assert.truthy(exists(dest .. "/usr/lib/systemd/system/tupper.socket"))
    -- every file the manifest lists is below PREFIX, and went below DESTDIR
    local n = 0
    for line in (helper.read_file(BUILD .. "/install_manifest.txt") or ""):gmatch("[^\n]+") do
      assert.are.equal("/usr/", line:sub(1, 5))
      assert.truthy(exists(dest .. line), dest .. line)
      n = n + 1
    end
    assert.truthy(n >= 3, "install_manifest.txt lists " .. n .. " files")
    -- the installed binary alone (no source tree, no build dir) runs a box
    local saved = helper.BIN
    helper.BIN = bin
    local ok, err = pcall(function()
      local d = helper.start_daemon(nil, { pool = 0, env = env_with() })
      local rc, o, e = helper.cli({ "--socket", d.socket, "run", "--", "true" }, { env = env_with() })
      assert.are.equal(0, rc, o .. e)
      rc, o, e = helper.cli({ "--socket", d.socket, "run", "--", "sh", "-c", "exit 7" }, { env = env_with() })
      assert.are.equal(7, rc, o .. e)
      assert.are.equal(0, d.stop())
    end)
    helper.BIN = saved
    assert(ok, err)
    helper.rmrf(dir)
  end)

  it("make deb builds a package with the binary, the units, Depends and maintainer scripts", function()
    local dir = helper.tmpdir()
    local code, out = sh(("make -C %s deb BUILD=%s"):format(q(ROOT), q(BUILD)), 300)
    assert.are.equal(0, code, out)
    local deb = out:match("([^\n]*/tupper_[^/\n]*_amd64%.deb)")
    assert.truthy(deb and exists(deb), out)
    local _, list = sh("dpkg-deb -c " .. q(deb))
    for _, f in ipairs({ "./usr/bin/tupper", "./usr/bin/tupper-core", "./usr/lib/systemd/system/tupper.service",
                         "./usr/lib/systemd/system/tupper.socket" }) do
      assert.truthy(list:find(" " .. f .. "\n", 1, true), f .. " not in the package:\n" .. list)
    end
    local _, fields = sh("dpkg-deb -f " .. q(deb) .. " Package Version Architecture Depends")
    assert.truthy(fields:find("Package: tupper\n", 1, true), fields)
    assert.truthy(fields:find("Architecture: amd64\n", 1, true), fields)
    -- linked (dpkg-shlibdeps) and opened with dlopen (stated)
    for _, dep in ipairs({ "libc6", "libedit2", "libcurl4", "libssl3", "libarchive13", "passwd" }) do
      assert.truthy(fields:find("[ ,]" .. dep .. "[ ,\n(]"), dep .. " not in Depends:\n" .. fields)
    end
    code, out = sh(("dpkg-deb -e %s %s/control"):format(q(deb), q(dir)))
    assert.are.equal(0, code, out)
    for _, s in ipairs({ "postinst", "prerm", "postrm" }) do
      code, out = sh("sh -n " .. q(dir .. "/control/" .. s))
      assert.are.equal(0, code, s .. ": " .. out)
    end
    assert.truthy(helper.read_file(dir .. "/control/postinst"):find("groupadd --system tupper", 1, true))
    os.remove(deb)
    helper.rmrf(dir)
  end)
end)

teardown(function()
  helper.drain()
end)
