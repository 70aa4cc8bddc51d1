-- fs.read_fd and fs.write_fd (docs/protocol.md, "Files as descriptors"):
-- the box's agent opens the file as the account and the daemon hands the
-- open file to the client.  Driven from outside as any program may
-- (tests/spec/fd_client.py) and through `tupper cp`: what the fd reaches
-- (never past the box: symlinks, a parent replaced while the fd is held),
-- what is refused (FIFOs, devices, directories, an account's permissions),
-- the disk cap, clients that go away (no fd left in the daemon or the
-- agent), and the streams for clients that do not ask for fds.
local uv = require("luv")
local json = require("tupper.util.json")
local async = require("tupper.util.async")
local helper = require("helper")
local stream = require("tupper.wire.stream")

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok and 0 or code, out
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

local function nfds(pid)
  local n, h = 0, uv.fs_scandir("/proc/" .. pid .. "/fd")
  while h and uv.fs_scandir_next(h) do n = n + 1 end
  return n
end

describe("open files of a box as descriptors", function()
  local d, tmp, id
  local CLIENT = helper.ROOT .. "/tests/spec/fd_client.py"

  local function cli(args, opts)
    local full = { "--socket", d.socket }
    for _, a in ipairs(args) do full[#full + 1] = a end
    return helper.cli(full, opts)
  end
  local function box(cmd, sid)
    local code, out, err = cli({ "exec", sid or id, "--", "sh", "-c", cmd })
    assert.are.equal(0, code, err)
    return out
  end
  -- one fs.*_fd call from fd_client.py: its report
  local function call(method, params, action)
    params.sandbox = params.sandbox or id
    local code, out = sh(table.concat({ "timeout 60 python3", q(CLIENT), q(d.socket), method,
      q(json.encode(params)), action and q(action) or "" }, " "))
    assert.are.equal(0, code, out)
    local r = json.decode(out:match("([^\n]*)\n?$"))
    assert(r, out)
    return r
  end
  -- errno: a name, or a number (names the daemon has no name for)
  local function refused(r, errno)
    assert.are.equal(0, r.fds, json.encode(r))
    assert.truthy(r.reply and r.reply.error, json.encode(r))
    local got = type(errno) == "number" and r.reply.error.data.errno or r.reply.error.data.code
    if errno then assert.are.equal(errno, got, json.encode(r)) end
  end
  -- the box's agent's pid on the host: the parent of a process it started
  local function agent_pid()
    local mark = tostring(40000 + math.random(9999))
    assert.are.equal(0, (sh(table.concat({ q(helper.BIN), "--socket", q(d.socket), "exec", id, "--", "sleep", mark,
      ">/dev/null 2>&1 &" }, " "))))
    local pid
    helper.sync(function()
      local deadline = helper.now() + 10000
      while not pid and helper.now() < deadline do
        local _, out = sh("pgrep -x -f " .. q("sleep " .. mark))
        pid = out:match("^(%d+)")
        if not pid then async.sleep(10) end
      end
    end)
    assert(pid, "no sleep " .. mark)
    local status = helper.read_file("/proc/" .. pid .. "/status") or ""
    sh("kill " .. pid)
    return assert(status:match("\nPPid:%s*(%d+)"))
  end

  setup(function()
    tmp = helper.tmpdir()
    d = helper.start_daemon(nil, { pool = 0 })
    local code, out, err = cli({ "create", "--timeout", "15m" })
    assert.are.equal(0, code, err)
    id = out:match("%S+")
  end)
  teardown(function()
    if id then cli({ "kill", id }) end
    if d then d.stop() end
    helper.rmrf(tmp)
    helper.drain()
  end)
  before_each(function() box("rm -rf /tmp/fd && mkdir /tmp/fd") end)

  it("hands the box's file over for writing and for reading, as the account", function()
    local code, out = sh(table.concat({ "python3 -c", q("import socket,json,sys;s=socket.socket(socket.AF_UNIX);"
      .. "s.connect(sys.argv[1]);s.sendall(b'{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\",\"params\":{}}\\n');"
      .. "print(json.loads(s.makefile().readline())['result'].get('file_fds'))"), q(d.socket) }, " "))
    assert.are.equal(0, code, out)
    assert.are.equal("1\n", out)
    local r = call("fs.write_fd", { path = "/tmp/fd/new/a", mode = 416 }, "write:hello")
    assert.are.same({ fds = 1, type = "reg", acc = "w", wrote = 5 },
      { fds = r.fds, type = r.type, acc = r.acc, wrote = r.wrote })
    assert.are.equal("hello 640 0:0\n", box("cat /tmp/fd/new/a; echo \" $(stat -c '%a %u:%g' /tmp/fd/new/a)\""))
    r = call("fs.read_fd", { path = "/tmp/fd/new/a" }, "read")
    assert.are.same({ 1, "reg", "r", "hello", 5 }, { r.fds, r.type, r.acc, r.data, r.reply.result.size })
    -- as an account: its file, its ids
    box("chmod 777 /tmp/fd")
    r = call("fs.write_fd", { path = "/tmp/fd/theirs", user = "nobody" }, "write:x")
    assert.are.equal(1, r.fds)
    assert.are.equal("nobody\n", box("stat -c %U /tmp/fd/theirs"))
    -- truncate (the default) and append
    r = call("fs.write_fd", { path = "/tmp/fd/new/a", append = true }, "write:!")
    assert.are.equal("hello!", box("cat /tmp/fd/new/a"))
    r = call("fs.write_fd", { path = "/tmp/fd/new/a" }, "write:z")
    assert.are.equal("z", box("cat /tmp/fd/new/a"))
  end)

  it("never reaches past the box: symlinks last and in a parent, a parent replaced while the fd is held", function()
    local outside = tmp .. "/outside"
    helper.rmrf(outside)
    assert(uv.fs_mkdir(outside, 511))
    write(outside .. "/victim", "host")
    box("ln -s " .. q(outside .. "/victim") .. " /tmp/fd/last && ln -s " .. q(outside) .. " /tmp/fd/parent")
    refused(call("fs.write_fd", { path = "/tmp/fd/last" }, "write:box"), "ENOENT")
    refused(call("fs.read_fd", { path = "/tmp/fd/last" }, "read"), "ENOENT")
    refused(call("fs.read_fd", { path = "/tmp/fd/parent/victim" }, "read"), "ENOENT")
    local r = call("fs.write_fd", { path = "/tmp/fd/parent/new" }, "write:box")
    if r.fds > 0 then -- made inside the box, if at all
      assert.are.equal("box", box("cat " .. q(outside .. "/new")))
    end
    assert.are.equal("host", helper.read_file(outside .. "/victim"))
    assert.is_nil(uv.fs_stat(outside .. "/new"))
    -- the fd is held while its parent is renamed and a link out takes its place
    box("mkdir /tmp/fd/dir")
    local flag, report = tmp .. "/go", tmp .. "/held.json"
    os.remove(flag)
    assert.are.equal(0, (sh(table.concat({ "timeout 60 python3", q(CLIENT), q(d.socket), "fs.write_fd",
      q(json.encode({ sandbox = id, path = "/tmp/fd/dir/f" })), q("hold:" .. flag), ">", q(report), "2>&1 &" }, " "))))
    helper.sync(function()
      local deadline = helper.now() + 20000
      while helper.now() < deadline and not (helper.read_file(report) or ""):find("\n", 1, true) do async.sleep(10) end
    end)
    local first = json.decode((helper.read_file(report) or ""):match("^([^\n]*)") or "")
    assert.truthy(first and first.fds == 1, helper.read_file(report))
    box("mv /tmp/fd/dir /tmp/fd/dir2 && ln -s " .. q(outside) .. " /tmp/fd/dir")
    write(flag, "")
    helper.sync(function()
      local deadline = helper.now() + 20000
      while helper.now() < deadline and not (helper.read_file(report) or ""):find("wrote", 1, true) do async.sleep(10) end
    end)
    assert.truthy((helper.read_file(report) or ""):find('"wrote": 4', 1, true), helper.read_file(report))
    assert.are.equal("held", box("cat /tmp/fd/dir2/f"))
    assert.is_nil(uv.fs_stat(outside .. "/f"))
    local _, list = sh("ls -A " .. q(outside))
    assert.are.equal("victim\n", list)
  end)

  it("refuses a FIFO, a device and a directory both ways, and a file the account may not open", function()
    box("mkfifo /tmp/fd/fifo && echo s > /tmp/fd/secret && chmod 600 /tmp/fd/secret")
    refused(call("fs.read_fd", { path = "/tmp/fd/fifo" }, "read"), "EINVAL")
    refused(call("fs.write_fd", { path = "/tmp/fd/fifo" }, "write:x"), 6) -- ENXIO, no reader: no hang either
    refused(call("fs.write_fd", { path = "/dev/null" }, "write:x"), "EINVAL")
    refused(call("fs.read_fd", { path = "/dev/zero" }, "read"), "EINVAL")
    refused(call("fs.read_fd", { path = "/tmp/fd" }, "read"), "EISDIR")
    refused(call("fs.write_fd", { path = "/tmp/fd" }, "write:x"), "EISDIR")
    refused(call("fs.read_fd", { path = "/tmp/fd/secret", user = "nobody" }, "read"), "EACCES")
    refused(call("fs.write_fd", { path = "/tmp/fd/secret", user = "nobody" }, "write:x"), "EACCES")
    refused(call("fs.write_fd", { path = "/etc/passwd", user = "nobody" }, "write:x"), "EACCES")
    assert.are.equal("s\n", box("cat /tmp/fd/secret"))
    -- `tupper cp` says the same
    local code, _, err = cli({ "cp", id .. ":/tmp/fd/fifo", tmp .. "/fifo-out" })
    assert.are.equal(125, code)
    assert.truthy(err:find("not a file or directory", 1, true) or err:find("not a regular file", 1, true), err)
  end)

  it("past the box's disk cap: a clear error, no temp file, no fd left", function()
    local code, out, err = cli({ "create", "--disk", "16m", "--timeout", "5m" })
    assert.are.equal(0, code, err)
    local small = out:match("%S+")
    local ok, perr = pcall(function()
      local before = nfds(d.pid)
      assert.are.equal(0, (sh("head -c 41943040 /dev/zero | tr '\\0' x > " .. q(tmp .. "/x40"))))
      local c2, _, e2 = cli({ "cp", tmp .. "/x40", small .. ":/tmp/x40" })
      assert.are.equal(125, c2)
      assert.truthy(e2:find("Disk quota exceeded", 1, true) or e2:find("No space left on device", 1, true), e2)
      assert.are.equal("", box("ls -A /tmp | grep tupper- || true", small))
      assert.are.equal(before, nfds(d.pid))
      -- the box goes on: a copy that fits
      c2, _, e2 = cli({ "cp", tmp .. "/x40", small .. ":/tmp/x40" }, { env = { "TUPPER_FILE_FDS=0" } })
      assert.are.equal(125, c2, "the streams say the same")
      assert.truthy(e2:find("Disk quota exceeded", 1, true) or e2:find("No space left on device", 1, true), e2)
      -- a write stream of a client (the SDKs' way), written by the daemon from its pool
      local c = d.connect()
      local dc = assert(helper.sync(stream.open, c))
      local sent = 0
      local n, serr = helper.sync(function()
        return dc:write_file(c, { sandbox = small, path = "/tmp/sdk" }, function()
          if sent >= 40 * 1048576 then return nil end
          sent = sent + 1048576
          return ("s"):rep(1048576)
        end)
      end)
      assert.is_nil(n)
      local m = tostring(serr and serr.message)
      assert.truthy(m:find("Disk quota exceeded", 1, true) or m:find("No space left on device", 1, true), m)
      dc:close()
      c:close()
      helper.sync(function()
        local deadline = helper.now() + 5000
        while nfds(d.pid) ~= before and helper.now() < deadline do async.sleep(20) end
      end)
      assert.are.equal(before, nfds(d.pid))
      box("rm -f /tmp/sdk", small)
      write(tmp .. "/one", "one")
      c2, _, e2 = cli({ "cp", tmp .. "/one", small .. ":/tmp/one" })
      assert.are.equal(0, c2, e2)
      assert.are.equal("one", box("cat /tmp/one", small))
    end)
    cli({ "kill", small })
    os.remove(tmp .. "/x40")
    assert(ok, perr)
  end)

  it("clients that go away leave no fd in the daemon or the agent", function()
    box("head -c 1048576 /dev/zero > /tmp/fd/z")
    call("fs.read_fd", { path = "/tmp/fd/z" }, "read") -- the first call's lasting fds (the daemon's caches) are not leaks
    local apid = agent_pid()
    helper.sync(function() async.sleep(200) end) -- the sleep's exit is reaped
    local daemon_before, agent_before = nfds(d.pid), nfds(apid)
    for i = 1, 10 do
      call(i % 2 == 0 and "fs.read_fd" or "fs.write_fd", { path = "/tmp/fd/g" .. i }, "gone")
      call("fs.read_fd", { path = "/tmp/fd/z" }) -- takes the fd and exits without using it
    end
    helper.sync(function()
      local deadline = helper.now() + 10000
      while helper.now() < deadline and nfds(d.pid) ~= daemon_before do async.sleep(20) end
    end)
    assert.are.equal(daemon_before, nfds(d.pid))
    assert.are.equal(agent_before, nfds(apid))
  end)

  it("tupper cp is byte-exact both ways through the fd and through the streams", function()
    local src = tmp .. "/rand"
    assert.are.equal(0, (sh("head -c 9437187 /dev/urandom > " .. q(src))))
    local _, want = sh("sha256sum < " .. q(src))
    for _, env in ipairs({ false, { "TUPPER_FILE_FDS=0" } }) do
      env = env or nil
      local code, _, err = cli({ "cp", src, id .. ":/tmp/fd/rand" }, { env = env })
      assert.are.equal(0, code, err)
      assert.are.equal(want, box("sha256sum < /tmp/fd/rand"))
      os.remove(tmp .. "/back")
      code, _, err = cli({ "cp", id .. ":/tmp/fd/rand", tmp .. "/back" }, { env = env })
      assert.are.equal(0, code, err)
      local _, got = sh("sha256sum < " .. q(tmp .. "/back"))
      assert.are.equal(want, got)
      box("rm /tmp/fd/rand")
    end
  end)
end)
