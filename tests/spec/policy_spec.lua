-- Policy files enforced by the daemon: caps at create, on_exec and on_file
-- for every process and file operation, the daemon's own policy, policies
-- kept across a daemon crash, and the CLI finding tupper.lua upward.
local uv = require("luv")
local helper = require("helper")
local guard = require("tupper.recipe.guard")
local paths = require("tupper.util.paths")
local policy = require("tupper.recipe.policy")

local sync = helper.sync
local call = helper.call

local POLICY = [[
return policy {
  max = { memory = "64M", timeout = "10m" },
  on_exec = function(argv)
    if argv[1] == "rm" then return false, "no rm here" end
    if argv[1] == "loop" then while true do end end
    if argv[1] == "echo" and argv[2] == "before" then return { "echo", "after" } end
    return true
  end,
  on_file = function(op, path)
    if op ~= "read" and op ~= "stat" and op ~= "list" and path:find("^/etc/") then
      return false, "/etc is read-only"
    end
    if path == "/secret" then return false, "not this one" end
    return true
  end,
}
]]

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

describe("guard", function()
  it("cleans paths lexically before hooks see them", function()
    assert.are.equal("/etc/passwd", paths.clean_path("/tmp/../etc/passwd"))
    assert.are.equal("/etc/passwd", paths.clean_path("//etc/./passwd/"))
    assert.are.equal("/", paths.clean_path("/../../.."))
    assert.are.equal("/home/user/a", paths.clean_path("a", "/home/user"))
    assert.are.equal("/etc", paths.clean_path("../../etc", "/home/user"))
  end)

  it("refuses a method no rule covers on a sandbox with hooks (fail closed)", function()
    local pol = assert(policy.load_string("return { on_file = function() return true end }", "p.lua"))
    local d = { sandboxes = { abc = { policy = pol } } }
    local p, err = guard.check(d, "sandbox.something_new", { sandbox = "abc" })
    assert.is_nil(p)
    assert.matches("not covered", err)
    -- also when the method names its sandbox `id`, as sandbox.* methods do
    p, err = guard.check(d, "sandbox.something_new", { id = "abc" })
    assert.is_nil(p)
    assert.matches("not covered", err)
    -- harmless methods and sandboxes without hooks pass
    assert.truthy(guard.check(d, "sandbox.get", { id = "abc" }))
    assert.truthy(guard.check({ sandboxes = { abc = {} } }, "sandbox.something_new", { sandbox = "abc" }))
  end)

  it("puts terminals through on_exec and watches through on_file", function()
    local pol = assert(policy.load_string([[return {
      on_exec = function(argv) if argv[1] == "/bin/sh" then return false, "no shells" end return true end,
      on_file = function(op, path) if path:find("^/secret") then return false, op .. " " .. path end return true end,
    }]], "p.lua"))
    local d = { sandboxes = { abc = { policy = pol } } }
    local p, err = guard.check(d, "pty.create", { sandbox = "abc", cols = 80, rows = 24 })
    assert.is_nil(p)
    assert.matches("no shells", err)
    assert.truthy(guard.check(d, "pty.create", { sandbox = "abc", cols = 80, rows = 24, argv = { "/bin/top" } }))
    p, err = guard.check(d, "fs.watch", { sandbox = "abc", path = "/tmp/../secret" })
    assert.is_nil(p)
    assert.matches("list /secret", err)
    p = assert(guard.check(d, "fs.watch", { sandbox = "abc", path = "/tmp//w/" }))
    assert.are.equal("/tmp/w", p.path)
    for _, m in ipairs({ "pty.resize", "process.connect", "fs.unwatch" }) do
      assert.truthy(guard.check(d, m, { sandbox = "abc" }), m)
    end
  end)

  it("gives on_file the path resolved from the home of the request's user", function()
    local pol = assert(policy.load_string([[return {
      on_file = function(op, path) if path:find("^/secret") then return false, op .. " " .. path end return true end,
    }]], "p.lua"))
    local asked = {}
    local sb = { policy = pol, state = "running" }
    function sb:account(user)
      asked[#asked + 1] = user
      if user == "ghost" then return nil, "user 'ghost' is not in the box's /etc/passwd", 2 end
      return { uid = 1000, gid = 1000, groups = { 1000 }, home = "/home/" .. user, name = user }
    end
    local d = { sandboxes = { abc = sb } }
    local p, err = guard.check(d, "fs.write", { sandbox = "abc", user = "user", path = "../../secret/x" })
    assert.is_nil(p)
    assert.matches("write /secret/x", err)
    p = assert(guard.check(d, "fs.write", { sandbox = "abc", user = "user", path = "./notes//a.txt" }))
    assert.are.equal("/home/user/notes/a.txt", p.path)
    assert.are.equal(1000, p._account.uid)
    p = assert(guard.check(d, "fs.rename", { sandbox = "abc", user = "bob", from = "a", to = "../b" }))
    assert.are.same({ "/home/bob/a", "/home/b" }, { p.from, p.to })
    -- without a user: from /, as root (no account)
    p = assert(guard.check(d, "fs.read", { sandbox = "abc", path = "etc/passwd" }))
    assert.are.same({ "/etc/passwd" }, { p.path, p._account })
    local code, data
    p, err, code, data = guard.check(d, "fs.read", { sandbox = "abc", user = "ghost", path = "x" })
    assert.is_nil(p)
    assert.are.same({ -32002, "ENOENT" }, { code, data.code })
    assert.matches("not in the box's /etc/passwd", err)
    assert.are.same({ "user", "user", "bob", "ghost" }, asked)
  end)
end)

describe("a policy sent with sandbox.create", function()
  local d, c, id

  setup(function()
    d = helper.start_daemon(nil, { pool = 0 })
    c = assert(d.connect())
    id = assert(call(c, "sandbox.create", { policy = { source = POLICY, name = "/project/tupper.lua" } })).id
  end)
  teardown(function()
    if c then c:close() end
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  local function run(argv) return sync(function() return helper.run(c, id, argv) end) end

  it("caps limits: a missing one gets the cap, a larger one is refused naming the rule", function()
    local info = assert(call(c, "sandbox.get", { id = id }))
    assert.are.equal(64 * 1024 * 1024, info.limits.memory)
    assert.are.equal("/project/tupper.lua", info.policy)
    local _, err = call(c, "sandbox.create", { limits = { memory = "128M" },
      policy = { source = POLICY, name = "/project/tupper.lua" } })
    assert.are.equal(-32005, err.code)
    assert.are.equal("policy /project/tupper.lua: max.memory is 64M, asked 128M", err.message)
  end)

  it("refuses, rewrites and allows process starts through on_exec", function()
    local _, err = run({ "rm", "-rf", "/tmp" })
    assert.are.equal(-32005, err.code)
    assert.matches("on_exec refused: no rm here", err.message, 1, true)
    local r = assert(run({ "echo", "before" }))
    assert.are.equal("after\n", r.stdout)
    r = assert(run({ "echo", "fine" }))
    assert.are.equal("fine\n", r.stdout)
    -- a cmd arrives as /bin/sh -c cmd
    r = assert(run("echo via-shell"))
    assert.are.equal("via-shell\n", r.stdout)
  end)

  it("refuses a runaway hook and keeps serving", function()
    local _, err = run({ "loop" })
    assert.are.equal(-32005, err.code)
    assert.matches("on_exec failed", err.message, 1, true)
    assert.truthy(call(c, "sandbox.get", { id = id }))
  end)

  it("checks every file path after cleaning it, with the path the handler uses", function()
    assert(call(c, "fs.write", { sandbox = id, path = "/tmp/ok", data = "x", encoding = "utf8" }))
    for _, path in ipairs({ "/etc/evil", "/tmp/../etc/evil", "etc/evil", "//etc//evil", "/secret" }) do
      local _, err = call(c, "fs.write", { sandbox = id, path = path, data = "x", encoding = "utf8" })
      assert.are.equal(-32005, err and err.code, path)
    end
    -- reads of /etc are allowed by this policy
    assert(call(c, "fs.read", { sandbox = id, path = "/tmp/../etc/passwd", encoding = "utf8" }))
    -- rename checks both ends
    local _, err = call(c, "fs.rename", { sandbox = id, from = "/tmp/ok", to = "/etc/ok" })
    assert.are.equal(-32005, err.code)
    _, err = call(c, "fs.remove", { sandbox = id, path = "/etc/passwd" })
    assert.are.equal(-32005, err.code)
    -- nothing was written where the policy said no
    local st = call(c, "fs.stat", { sandbox = id, path = "/etc/evil" })
    assert.is_nil(st)
    -- relative paths of a user's call are judged where they land: its home
    _, err = call(c, "fs.write", { sandbox = id, user = "user", path = "../../etc/evil", data = "x", encoding = "utf8" })
    assert.are.equal(-32005, err.code)
    assert.matches("/etc is read-only", err.message, 1, true)
    assert(call(c, "fs.write", { sandbox = id, user = "user", path = "fine", data = "x", encoding = "utf8" }))
    st = assert(call(c, "fs.stat", { sandbox = id, path = "/home/user/fine" }))
    assert.are.equal(1000, st.uid)
  end)

  it("refuses a policy that does not load, naming file and line", function()
    local _, err = call(c, "sandbox.create", { policy = { source = "return policy { max = { memory = '12Q' } }",
      name = "bad.lua" } })
    assert.are.equal(-32602, err.code)
    assert.matches("bad.lua:1", err.message, 1, true)
    _, err = call(c, "sandbox.create", { policy = { name = "x.lua" } })
    assert.are.equal(-32602, err.code)
  end)
end)

describe("the daemon's own policy", function()
  it("binds every sandbox, whatever the client sends, and survives a crash", function()
    local dir = helper.tmpdir()
    local file = dir .. "/daemon-policy.lua"
    write(file, [[return policy { on_exec = function(argv)
      if argv[1] == "cat" then return false, "no cat" end return true end }]])
    local d, d2
    -- both daemons go, and the box a crash left if the restart never came
    finally(function()
      helper.release(d, d2)
      helper.rmrf(dir)
      helper.drain()
    end)
    d = helper.start_daemon(dir .. "/d", { pool = 0, policy = file })
    local c = assert(d.connect())
    local sb = assert(call(c, "sandbox.create", {}))
    local _, err = sync(function() return helper.run(c, sb.id, { "cat", "/etc/passwd" }) end)
    assert.are.equal(-32005, err.code)
    assert.matches(file .. ": on_exec refused: no cat", err.message, 1, true)
    -- and a client policy adds to it: both must allow
    local sb2 = assert(call(c, "sandbox.create", { policy = { source = POLICY, name = "p.lua" } }))
    _, err = sync(function() return helper.run(c, sb2.id, { "rm", "x" }) end)
    assert.matches("p.lua: on_exec refused", err.message, 1, true)
    _, err = sync(function() return helper.run(c, sb2.id, { "cat", "x" }) end)
    assert.matches("no cat", err.message, 1, true)

    -- a crash: the next daemon re-adopts sb2 with its own policy
    c:close()
    d.crash()
    d2 = helper.start_daemon(dir .. "/d", { pool = 0 })
    local c2 = assert(d2.connect())
    assert.truthy(call(c2, "sandbox.get", { id = sb2.id }))
    _, err = sync(function() return helper.run(c2, sb2.id, { "rm", "x" }) end)
    assert.are.equal(-32005, err and err.code)
    local r = assert(sync(function() return helper.run(c2, sb2.id, { "echo", "before" }) end))
    assert.are.equal("after\n", r.stdout)
    c2:close()
    assert.are.equal(0, d2.stop())
  end)

  it("refuses to start with a bad policy file", function()
    local dir = helper.tmpdir()
    finally(function() helper.rmrf(dir) end)
    write(dir .. "/bad.lua", "return policy { nope = 1 }")
    local code, _, stderr = helper.cli({ "daemon", "--socket", dir .. "/s", "--state-dir", dir .. "/st",
      "--pool", "0", "--policy", dir .. "/bad.lua" })
    assert.are_not.equal(0, code)
    assert.matches("unknown field 'nope'", stderr, 1, true)
  end)
end)

describe("the CLI", function()
  local d, dir

  setup(function()
    d = helper.start_daemon(nil, { pool = 0 })
    dir = helper.tmpdir()
    uv.fs_mkdir(dir .. "/project", tonumber("755", 8))
    uv.fs_mkdir(dir .. "/project/sub", tonumber("755", 8))
    write(dir .. "/project/tupper.lua", POLICY)
  end)
  teardown(function()
    helper.rmrf(dir) -- first: a failed stop must not keep it
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  it("finds tupper.lua from the working directory upward", function()
    local code, _, stderr = helper.cli({ "--socket", d.socket, "run", "--", "rm", "-f", "/tmp/x" },
      { cwd = dir .. "/project/sub" })
    assert.are.equal(125, code)
    assert.matches(dir .. "/project/tupper.lua: on_exec refused: no rm here", stderr, 1, true)
  end)

  it("takes --policy FILE and --no-policy", function()
    local code, out = helper.cli({ "--socket", d.socket, "run", "--no-policy", "--", "rm", "-f", "/tmp/x" },
      { cwd = dir .. "/project/sub" })
    assert.are.equal(0, code, out)
    local code2, _, stderr = helper.cli({ "--socket", d.socket, "run", "--policy", dir .. "/project/tupper.lua",
      "--memory", "1G", "--", "true" }, { cwd = dir })
    assert.are.equal(125, code2)
    assert.matches("max.memory is 64M, asked 1G", stderr, 1, true)
  end)
end)
