-- Where a client looks for the daemon (docs/install.md): $TUPPER_SOCKET
-- alone when set; root: the system's socket; any other user: its own
-- ($XDG_RUNTIME_DIR/tupper.sock, else /tmp/tupper-UID/tupper.sock), then
-- the system's when that one exists, so a member of the tupper group needs
-- no TUPPER_SOCKET.  The choice on fake environments, then a real CLI run
-- as an unprivileged user against a daemon on a socket that stands in for
-- the system's (TUPPER_SYSTEM_SOCKET, the hook for tests).
local uv = require("luv")
local paths = require("tupper.util.paths")
local helper = require("helper")

local function env(t) return function(name) return t[name] end end

describe("the client's socket", function()
  it("is chosen from the environment and the user", function()
    local user = env({ XDG_RUNTIME_DIR = "/run/user/1000" })
    assert.are.same({ "/run/user/1000/tupper.sock", "/run/tupper/tupper.sock" }, paths.client_sockets(user, 1000))
    assert.are.equal("/run/user/1000/tupper.sock", paths.socket(user, 1000))
    assert.are.same({ "/tmp/tupper-1000/tupper.sock", "/run/tupper/tupper.sock" }, paths.client_sockets(env({}), 1000))
    -- an empty XDG_RUNTIME_DIR is none
    assert.are.same({ "/tmp/tupper-7/tupper.sock", "/run/tupper/tupper.sock" },
      paths.client_sockets(env({ XDG_RUNTIME_DIR = "" }), 7))
    -- root: the system's only
    assert.are.same({ "/run/tupper/tupper.sock" }, paths.client_sockets(user, 0))
    -- TUPPER_SOCKET: that one only, root or not, no fallback
    local named = env({ TUPPER_SOCKET = "/a/b.sock", XDG_RUNTIME_DIR = "/run/user/1000" })
    assert.are.same({ "/a/b.sock" }, paths.client_sockets(named, 1000))
    assert.are.same({ "/a/b.sock" }, paths.client_sockets(named, 0))
    -- the test hook moves the system's socket, for root and for the fallback
    local moved = env({ TUPPER_SYSTEM_SOCKET = "/s/sys.sock", XDG_RUNTIME_DIR = "/r" })
    assert.are.same({ "/s/sys.sock" }, paths.client_sockets(moved, 0))
    assert.are.same({ "/r/tupper.sock", "/s/sys.sock" }, paths.client_sockets(moved, 1000))
    assert.are.equal("/run/tupper/tupper.sock", paths.system_socket(env({ TUPPER_SYSTEM_SOCKET = "" })))
  end)
end)

describe("a client that is not root", function()
  local dir, d, bin

  setup(function()
    -- a dir an unprivileged user can pass through (a test's TMPDIR may not be)
    dir = assert(uv.fs_mkdtemp("/tmp/tupper-syssock-XXXXXX"))
    assert(uv.fs_chmod(dir, tonumber("711", 8)))
    -- the binaries as the other user can run them: the checkout may sit
    -- where it cannot (a fresh machine clones into /root); tupper-core
    -- embeds its Lua, and tupper execs it from its own directory
    bin = dir .. "/tupper"
    local core = helper.BIN:gsub("[^/]*$", "tupper-core")
    for from, to in pairs({ [helper.BIN] = bin, [core] = dir .. "/tupper-core" }) do
      assert(uv.fs_copyfile(from, to))
      assert(uv.fs_chmod(to, tonumber("755", 8)))
    end
    d = helper.start_daemon(dir)
  end)

  teardown(function()
    if d then assert.are.equal(0, d.stop()) end
    if dir then helper.rmrf(dir) end
    helper.drain()
  end)

  -- Runs the CLI as uid/gid 65534 (no supplementary groups) with env.
  local function cli_as_nobody(args, extra)
    local e = { "PATH=" .. os.getenv("PATH"), "HOME=/nonexistent", "XDG_RUNTIME_DIR=" .. dir .. "/no-run" }
    for _, kv in ipairs(extra or {}) do e[#e + 1] = kv end
    local out, err, code = {}, {}, nil
    local so, se = uv.new_pipe(false), uv.new_pipe(false)
    local h = assert(uv.spawn(bin, { args = args, env = e, uid = 65534, gid = 65534, stdio = { nil, so, se } },
      function(c, s) code = s ~= 0 and 128 + s or c end))
    local open = 2
    so:read_start(function(_, chunk) if chunk then out[#out + 1] = chunk else open = open - 1 end end)
    se:read_start(function(_, chunk) if chunk then err[#err + 1] = chunk else open = open - 1 end end)
    local deadline = helper.now() + 30000
    while (code == nil or open > 0) and helper.now() < deadline do uv.run("once") end
    if code == nil then uv.process_kill(h, "sigkill") end
    h:close(); so:close(); se:close()
    uv.run("nowait")
    return code, table.concat(out), table.concat(err)
  end

  it("falls back to the system's socket when its own does not answer, and names both when neither does", function()
    assert(uv.fs_chmod(d.socket, tonumber("666", 8))) -- as tupper.socket's 0660 root:tupper is to a member
    local code, out, err = cli_as_nobody({ "ls", "--json" }, { "TUPPER_SYSTEM_SOCKET=" .. d.socket })
    assert.are.equal(0, code, err)
    assert.are.equal("[]", (out:gsub("%s+$", "")))
    -- TUPPER_SOCKET is taken as it is: no fallback behind it
    code, _, err = cli_as_nobody({ "ls" }, { "TUPPER_SYSTEM_SOCKET=" .. d.socket, "TUPPER_SOCKET=" .. dir .. "/none.sock" })
    assert.are.equal(125, code)
    assert.truthy(err:find("no tupper daemon answers at " .. dir .. "/none.sock (ENOENT): start", 1, true), err)
    -- neither answers: both are named
    code, _, err = cli_as_nobody({ "ls" }, { "TUPPER_SYSTEM_SOCKET=" .. dir .. "/gone.sock" })
    assert.are.equal(125, code)
    assert.truthy(err:find(("no tupper daemon answers at %s/no-run/tupper.sock (ENOENT) nor at %s/gone.sock (ENOENT)")
      :format(dir, dir), 1, true), err)
    -- the system's is there but not this user's to use
    assert(uv.fs_chmod(d.socket, tonumber("600", 8)))
    code, _, err = cli_as_nobody({ "ls" }, { "TUPPER_SYSTEM_SOCKET=" .. d.socket })
    assert.are.equal(125, code)
    assert.truthy(err:find(d.socket .. " (EACCES)", 1, true), err)
    assert.truthy(err:find("usermod -aG tupper", 1, true), err)
  end)
end)
