-- The Lua client API (tupper.sdk) against a real daemon: sandboxes,
-- commands, files, background processes and errors, called the way a plain
-- script calls them (from the main thread) and from inside a task.
local uv = require("luv")
local helper = require("helper")
local tupper = require("tupper.sdk")
local b64 = require("tupper.util.b64")

-- The backend matrix: TUPPER_TEST_BACKEND=microvm runs this same spec
-- against microVMs (tests/slow/backend_matrix_spec.lua); default: linux.
local BACKEND = os.getenv("TUPPER_TEST_BACKEND")

local function create(opts)
  opts = opts or {}
  opts.backend = BACKEND
  local box = tupper.create(opts)
  if BACKEND then assert.are.equal(BACKEND, box:info().backend) end
  return box
end

describe("tupper.sdk" .. (BACKEND and (" on " .. BACKEND) or ""), function()
  local d

  setup(function()
    d = helper.start_daemon()
    tupper.configure({ socket = d.socket, autostart = false })
  end)

  teardown(function()
    -- a broken connection must not keep the daemon from its stop below
    pcall(function() for _, s in ipairs(tupper.list()) do tupper.kill(s.id) end end)
    pcall(tupper.close)
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  it("creates a sandbox, runs commands and kills it", function()
    local box = create({ envs = { FOO = "bar" }, metadata = { owner = "spec" }, timeout = "10m" })
    assert.are.equal("string", type(box.id))
    assert.are.equal("<sandbox " .. box.id .. ">", tostring(box))
    local r = box:run("echo $FOO; echo err >&2; exit 3")
    assert.are.same({ stdout = "bar\n", stderr = "err\n", exit_code = 3 }, r)
    assert.are.equal("/tmp\n", box:run({ "pwd" }, { cwd = "/tmp" }).stdout)
    assert.are.equal("x-y\n", box:run("echo $A-$B", { envs = { A = "x", B = "y" } }).stdout)
    assert.are.equal("piped", box:run({ "cat" }, { stdin = "piped" }).stdout)
    local info = box:info()
    assert.are.equal("spec", info.metadata.owner)
    assert.are.equal(600, info.timeout)
    local found = false
    for _, s in ipairs(tupper.list()) do found = found or s.id == box.id end
    assert.is_true(found)
    assert.are.equal(box.id, tupper.connect(box.id).id)
    assert.is_true(box:is_running())
    assert.is_true(box:kill())
    assert.is_false(box:is_running())
    assert.is_false(tupper.kill(box.id))
  end)

  it("raises on check = true, on unknown sandboxes and on bad programs", function()
    local box = create()
    local ok, err = pcall(box.run, box, "echo oops >&2; exit 2", { check = true })
    assert.is_false(ok)
    assert.are.equal("tupper: command failed (exit code 2): echo oops >&2; exit 2: oops", err)
    ok, err = pcall(box.run, box, { "/no/such/program" })
    assert.is_false(ok)
    assert.truthy(err:match("^tupper: "), err)
    ok, err = pcall(tupper.connect, "abc")
    assert.is_false(ok)
    assert.are.equal("tupper: no sandbox 'abc'", err)
    ok, err = pcall(box.files.read, box.files, "/no/such/file")
    assert.is_false(ok)
    assert.truthy(err:match("^tupper: .*/no/such/file"), err)
    box:kill()
    ok, err = pcall(box.run, box, "true")
    assert.are.equal("tupper: no sandbox '" .. box.id .. "'", err)
  end)

  it("reads, writes and manages files", function()
    local box = create()
    local f = box.files
    assert.are.same({ path = "/root/a/b.txt", size = 5 }, f:write("/root/a/b.txt", "hello"))
    assert.are.equal("hello", f:read("/root/a/b.txt"))
    assert.is_true(f:exists("/root/a/b.txt"))
    assert.is_false(f:exists("/root/nothing"))
    assert.is_false(f:exists("/root/a/b.txt/below"))
    -- binary and larger than one chunk: three fs.write calls with offsets
    local parts = {}
    for i = 0, 255 do parts[#parts + 1] = string.char(i) end
    local big = table.concat(parts):rep(10 * 1024 + 7) -- 2.5 MiB and a bit
    assert.are.equal(#big, f:write("/big.bin", big).size)
    assert.are.equal(#big, f:stat("/big.bin").size)
    assert.is_true(f:read("/big.bin") == big)
    assert.are.equal(#big .. "\n", box:run("wc -c < /big.bin").stdout:gsub("^%s+", ""))
    assert.are.equal("", (f:write("/big.bin", "") and f:read("/big.bin")))
    assert.is_true(f:mkdir("/root/x/y"))
    assert.is_false(f:mkdir("/root/x/y"))
    f:rename("/root/a/b.txt", "/root/x/y/c.txt")
    local names = {}
    for _, e in ipairs(f:list("/root/x/y")) do names[#names + 1] = e.name .. ":" .. e.type end
    assert.are.same({ "c.txt:file" }, names)
    assert.are.equal("dir", f:stat("/root/x").type)
    assert.has_error(function() f:remove("/root/x") end)
    f:remove("/root/x", { recursive = true })
    assert.is_false(f:exists("/root/x"))
    box:kill()
  end)

  it("acts as an account of the box in commands and files, relative paths from its home", function()
    local box = create()
    local f = box.files
    -- the E2B default account (the TypeScript SDK's) is shown; the Lua
    -- API's own default stays root
    local info = box:info()
    assert.are.equal("user", info.default_user)
    assert.are.equal("/home/user", info.home)
    assert.are.equal("root\n/\n", box:run("id -un; pwd").stdout)
    assert.are.equal("user\n/home/user\n", box:run("id -un; pwd", { user = "user" }).stdout)
    assert.are.equal("/home/user/sub\n", box:run("mkdir -p sub && cd sub && pwd", { user = "user" }).stdout)
    assert.are.equal("/home/user/sub\n", box:run("pwd", { user = "user", cwd = "sub" }).stdout)
    -- files: relative paths from the home, owned by the account
    assert.are.same({ path = "notes/a.txt", size = 2 }, f:write("notes/a.txt", "hi", { user = "user" }))
    local st = f:stat("/home/user/notes/a.txt")
    assert.are.same({ 1000, 1000 }, { st.uid, st.gid })
    assert.are.equal(1000, f:stat("/home/user/notes").uid)
    assert.are.equal("/home/user/notes/a.txt", f:stat("notes/a.txt", { user = "user" }).path)
    assert.are.equal("hi", f:read("notes/a.txt", { user = "user" }))
    assert.is_true(f:exists("./notes/../notes/a.txt", { user = "user" }))
    assert.is_true(f:mkdir("d/e", { user = "user" }))
    assert.are.equal(1000, f:stat("/home/user/d/e").uid)
    f:rename("notes/a.txt", "d/e/b.txt", { user = "user" })
    local names = {}
    for _, e in ipairs(f:list("d/e", { user = "user" })) do names[#names + 1] = e.path end
    assert.are.same({ "/home/user/d/e/b.txt" }, names)
    f:remove("d", { recursive = true, user = "user" })
    assert.is_false(f:exists("/home/user/d"))
    -- the account's permissions, not root's
    local ok, err = pcall(f.write, f, "/etc/x", "no", { user = "user" })
    assert.is_false(ok)
    assert.truthy(err:find("/etc/x", 1, true) and err:find("ermission denied", 1, true), err)
    assert.is_false(f:exists("/etc/x"))
    assert.are.equal(2, f:write("/etc/x", "ok").size)
    assert.are.equal(0, f:stat("/etc/x").uid)
    ok, err = pcall(f.remove, f, "/etc/x", { user = "user" })
    assert.truthy(not ok and err:find("ermission denied", 1, true), err)
    ok, err = pcall(f.list, f, "/root", { user = "user" })
    assert.truthy(not ok and err:find("ermission denied", 1, true), err)
    ok, err = pcall(f.read, f, "../../root/.profile", { user = "user" })
    assert.truthy(not ok and err:find("/root/.profile", 1, true), err)
    -- root explicitly: its home is /root
    f:write("r.txt", "r", { user = "root" })
    assert.are.equal("/root/r.txt", f:stat("r.txt", { user = "root" }).path)
    assert.are.equal(0, f:stat("/root/r.txt").uid)
    box:kill()
  end)

  it("takes root and / as the default account of an image without a `user` account", function()
    -- a recipe whose setup removes the account: its layer is the image
    -- (on the linux backend under the backend matrix too: the account
    -- logic is the daemon's, and a microVM would first build a root image
    -- of the recipe's layer)
    local box = tupper.create({ recipe = { name = "nouser.lua", source = [[
      return recipe "nouser" {
        setup = function(box) box:run("sed -i '/^user:/d' /etc/passwd") end,
      }]] } })
    local info = box:info()
    assert.are.same({ "root", "/" }, { info.default_user, info.home })
    local ok, err = pcall(box.run, box, "true", { user = "user" })
    assert.truthy(not ok and err:find("user 'user' is not in the box's /etc/passwd", 1, true), err)
    box:kill()
    -- a recipe's user is the default account
    box = tupper.create({ recipe = { name = "asuser.lua", source = 'return recipe "asuser" { user = "user" }' } })
    info = box:info()
    assert.are.same({ "user", "/home/user" }, { info.default_user, info.home })
    box:kill()
  end)

  it("refuses accounts the box does not have or describes in a hostile way", function()
    local box = create()
    local f = box.files
    local function refused(user, want, opts)
      local ok, err = pcall(f.write, f, "x.txt", "x", { user = user })
      assert.is_false(ok)
      assert.truthy(err:find(want, 1, true), err)
      local ok2, err2 = pcall(box.run, box, "true", { user = user })
      assert.is_false(ok2)
      assert.truthy(err2:find(want, 1, true), err2)
    end
    refused("ghost", "user 'ghost' is not in the box's /etc/passwd")
    local ok, err = pcall(f.write, f, "x", "x", { user = "bad:name" })
    assert.truthy(not ok and err:find("user", 1, true), err)
    local function passwd(text)
      f:write("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n" .. text)
    end
    -- malformed lines around a good one do not matter
    passwd("garbage\n::::\n:x:1:1\nuser:x:1000:1000:user:/home/user:/bin/sh\n" .. ("x"):rep(5000) .. "\n")
    f:write("ok.txt", "x", { user = "user" })
    assert.are.equal(1000, f:stat("/home/user/ok.txt").uid)
    passwd("user:x:0:0:user:/home/user:/bin/sh\n")
    refused("user", "user 'user' has uid 0 in the box's /etc/passwd")
    passwd("user:x:1000:1000:user:../../:/bin/sh\n")
    refused("user", "its home in the box's /etc/passwd is not a clean absolute path")
    passwd("user:x:1000:1000:user:/home/../etc:/bin/sh\n")
    refused("user", "not a clean absolute path")
    passwd("user:x:70000:1000:user:/home/user:/bin/sh\n")
    refused("user", "not a number in 0..65535")
    passwd("user:x:1000:99999999999999999999:user:/home/user:/bin/sh\n")
    refused("user", "not a number in 0..65535")
    passwd("user:x:-1:1000:user:/home/user:/bin/sh\n")
    refused("user", "not a number in 0..65535")
    -- a huge /etc/passwd is refused, not read whole
    f:write("/etc/passwd", ("#" .. ("p"):rep(1023) .. "\n"):rep(1100) .. "user:x:1000:1000::/home/user:/bin/sh\n")
    refused("user", "/etc/passwd is over 1048576 bytes")
    -- and a hostile /etc/group: too many groups, then too big
    passwd("user:x:1000:1000:user:/home/user:/bin/sh\n")
    local groups = {}
    for i = 1, 80 do groups[i] = ("g%d:x:%d:user"):format(i, 2000 + i) end
    f:write("/etc/group", table.concat(groups, "\n") .. "\n")
    refused("user", "is in more than 64 groups")
    groups = {}
    for i = 1, 20 do groups[i] = ("g%d:x:%d:nobody,user"):format(i, 2000 + i) end
    f:write("/etc/group", table.concat(groups, "\n") .. "\nbad:x:99999999:user\n")
    local id = box:run("id -G", { user = "user" }).stdout
    assert.truthy(id:find("^1000 2001 2002 ") and id:find(" 2020\n$"), id)
    f:write("/etc/group", ("#" .. ("g"):rep(1023) .. "\n"):rep(1100))
    refused("user", "/etc/group is over 1048576 bytes")
    box:kill()
  end)

  it("runs background processes with stdin, callbacks and kill", function()
    local box = create()
    local h = box:run("cat; echo done", { background = true, stdin = true })
    assert.are.equal("integer", math.type(h.pid))
    h:send_stdin("abc\n")
    h:close_stdin()
    assert.are.same({ stdout = "abc\ndone\n", stderr = "", exit_code = 0 }, h:wait())
    local seen = {}
    box:run("for i in 1 2 3; do echo $i; sleep 0.01; done", { on_stdout = function(data) seen[#seen + 1] = data end })
    assert.are.equal("1\n2\n3\n", table.concat(seen))
    local sleeper = box:run("sleep 30", { background = true })
    assert.are.equal(1, #box.commands:list())
    local t0 = uv.now()
    assert.is_true(sleeper:kill())
    local r = sleeper:wait()
    assert.are.equal(9, r.signal)
    assert.truthy(uv.now() - t0 < 15000) -- not the sleep's 30 s
    assert.are.equal(0, #box.commands:list())
    local slow = box:run("sleep 10", { timeout = "200ms" })
    assert.is_true(slow.timed_out)
    box:kill()
  end)

  it("runs inside a task, and cancels its wait on request", function()
    local box = create()
    -- several calls in one task: they share the loop with the caller
    local out = tupper.run(function()
      local a = box:run("echo a").stdout
      local b = box.files:write("/t", "b") and box.files:read("/t")
      return a .. b
    end)
    assert.are.equal("a\nb", out)
    -- cancel: the waiting call raises "interrupted" and its command is killed
    local t = tupper.task(function() return box:run("sleep 30") end)
    local timer = uv.new_timer()
    timer:start(200, 0, function() timer:close(); tupper.cancel(t) end)
    tupper.drive(t)
    assert.is_false(t.ok)
    assert.are.equal("interrupted", t.err)
    local left = 1
    local deadline = helper.now() + helper.WAIT_MS
    repeat
      left = #box.commands:list()
      if left == 0 then break end
      tupper.run(function() require("tupper.util.async").sleep(20) end)
    until helper.now() >= deadline
    assert.are.equal(0, left)
    box:kill()
  end)

  it("has a pure-Lua base64 that agrees with the codec", function()
    for _, s in ipairs({ "", "f", "fo", "foo", "foob", "fooba", "foobar", "\0\255\128" }) do
      assert.are.equal(s, b64.lua_decode(b64.lua_encode(s)))
      assert.are.equal(helper.b64encode(s), b64.lua_encode(s))
    end
    assert.is_nil(b64.lua_decode("Zm9v!A=="))
    assert.is_nil(b64.lua_decode("Zg="))
  end)
end)
