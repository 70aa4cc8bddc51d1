-- Templates are recipes: recipe.register/list/remove (names checked, kept
-- across a daemon restart), sandbox.create's `template` resolved as a
-- registered recipe, a shipped one (`base` = python), then an image; and a
-- recipe's start command and ready check, run at every create, bounded,
-- with a failing check failing the create and leaving nothing behind.
local uv = require("luv")
local helper = require("helper")
local recipe = require("tupper.recipe.file")

-- an error's message (the client hands back { code, message, data })
local function msg(err)
  return type(err) == "table" and tostring(err.message) or tostring(err)
end

local START = [[
return recipe "served" {
  image = "default",
  env = { GREETING = "hi" },
  workdir = "/srv",
  start = {
    cmd = "sleep 0.3; echo $GREETING > /tmp/ready; exec sleep 1000",
    ready = "[ -e /tmp/ready ]",
    timeout = "20s",
  },
}]]

describe("recipe field start", function()
  it("is validated", function()
    local r = assert(recipe.load_string(START, "served.lua"))
    assert.are.same({ cmd = "sleep 0.3; echo $GREETING > /tmp/ready; exec sleep 1000",
                      ready = "[ -e /tmp/ready ]", timeout = 20 }, r.start)
    r = assert(recipe.load_string('return recipe "x" { start = { ready = "true" } }', "x.lua"))
    assert.are.equal(recipe.START_TIMEOUT, r.start.timeout)
    local bad = {
      { "start = 'x'", "'start' must be" },
      { "start = {}", "needs a 'cmd', a 'ready' check or both" },
      { "start = { cmd = '' }", "'start.cmd' must be 1 to" },
      { "start = { cmd = 'a\\0b' }", "without NUL" },
      { "start = { cmd = 'x', wait = 1 }", "unknown field 'wait'" },
      { "start = { cmd = 'x', timeout = '2h' }", "'start.timeout' must be a duration above 0" },
      { "start = { cmd = 'x', timeout = 0 }", "'start.timeout' must be a duration above 0" },
      { "start = { cmd = 'x', timeout = 'soon' }", "'start.timeout'" },
    }
    for _, case in ipairs(bad) do
      local ok, err = recipe.load_string('return recipe "x" {\n ' .. case[1] .. ' }', "bad.lua")
      assert.is_nil(ok, case[1])
      assert.truthy(err:find(case[2], 1, true), err)
      assert.truthy(err:find("^bad%.lua:%d+:"), err)
    end
  end)

  it("knows base as the shipped python recipe", function()
    local r = assert(recipe.load_embedded("base"))
    assert.are.equal("python", r.name)
    assert.are.equal("bookworm", r.image.debian)
  end)
end)

describe("templates", function()
  local d, c

  setup(function()
    d = helper.start_daemon()
    c = d.connect()
  end)

  teardown(function()
    if c then
      helper.kill_sandboxes(c)
      c:close()
    end
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)
  after_each(function() if c then helper.kill_sandboxes(c) end end)

  local function sh(id, cmd)
    local r = assert(helper.sync(helper.run, c, id, cmd))
    return r.stdout, r.exit_code
  end

  local function no_boxes()
    assert.are.same({}, helper.call(c, "sandbox.list", {}).sandboxes)
  end

  it("refuses bad names", function()
    for _, name in ipairs({ "a/b", "..", "a..b", "../x", ".x", "-x", "a\0b", "a\nb", "a b", "x\27[1m",
                            ("a"):rep(129) }) do
      local r, err = helper.call(c, "recipe.register", { name = name, source = START })
      assert.is_nil(r, name)
      -- the schema refuses a NUL first, the registry the rest
      assert.truthy(msg(err):find("template's name", 1, true) or msg(err):find("bad template name", 1, true)
        or msg(err):find("'name' contains a NUL byte", 1, true), msg(err))
      local r2, err2 = helper.call(c, "recipe.remove", { name = name })
      assert.is_nil(r2, name)
      assert.truthy(err2)
    end
    -- a recipe that does not load is not registered
    local r, err = helper.call(c, "recipe.register", { name = "broken", source = 'return recipe "x" { imgae = 1 }' })
    assert.is_nil(r)
    assert.truthy(msg(err):find("unknown field 'imgae'", 1, true), msg(err))
    assert.are.same({}, helper.call(c, "recipe.list", {}).recipes)
    local _, terr = helper.call(c, "sandbox.create", { template = "default", image = "default" })
    assert.truthy(msg(terr):find("not with 'image' or 'recipe'", 1, true), msg(terr))
  end)

  it("runs the start command at every create and waits for its ready check", function()
    local reg = assert(helper.call(c, "recipe.register", { name = "served:v1", source = START, build = true }))
    assert.are.equal("served", reg.recipe)
    for _ = 1, 2 do
      local t0 = helper.now()
      local sb = assert(helper.call(c, "sandbox.create", { template = "served:v1" }))
      assert.truthy(helper.now() - t0 >= 250, "the create waited for the ready check")
      assert.are.equal("served", sb.recipe and sb.recipe.name)
      -- ready when the create returned: the file is there at once
      assert.are.equal("hi\n", (sh(sb.id, "cat /tmp/ready")))
      assert.are.equal("/srv\n", (sh(sb.id, "pwd")))
      local procs = helper.call(c, "process.list", { sandbox = sb.id }).processes
      local found
      for _, p in ipairs(procs) do
        if p.argv[3] and p.argv[3]:find("exec sleep 1000", 1, true) then found = p end
      end
      assert.truthy(found, "the start command runs in the background")
      helper.call(c, "sandbox.kill", { id = sb.id })
    end
    no_boxes()
    -- the policies that bind the sandbox judge the start command, as any process start
    local pol = { name = "tupper.lua", source = [[
      return policy { on_exec = function(argv)
        if (argv[3] or ""):find("exec sleep 1000", 1, true) then return false, "no servers here" end
        return true
      end }]] }
    local sb, err = helper.call(c, "sandbox.create", { template = "served:v1", policy = pol })
    assert.is_nil(sb)
    assert.truthy(msg(err):find("no servers here", 1, true), msg(err))
    no_boxes()
  end)

  it("fails a create whose ready check never passes, in bounded time", function()
    assert(helper.call(c, "recipe.register", { name = "never", source = [[
      return recipe "never" {
        start = { cmd = "echo starting; exec sleep 1000", ready = "echo not yet; exit 1", timeout = "1s" },
      }]] }))
    local t0 = helper.now()
    local sb, err = helper.call(c, "sandbox.create", { template = "never" })
    assert.is_nil(sb)
    assert.truthy(helper.now() - t0 < 10000, "bounded")
    err = msg(err)
    assert.truthy(err:find("did not pass within 1 s", 1, true), err)
    assert.truthy(err:find("not yet", 1, true), err)
    assert.truthy(err:find("starting", 1, true), err)
    no_boxes()
    -- a start command that dies first fails the create with its output
    assert(helper.call(c, "recipe.register", { name = "dies", source = [[
      return recipe "dies" { start = { cmd = "echo boom >&2; exit 3", ready = "false", timeout = "30s" } }]] }))
    t0 = helper.now()
    sb, err = helper.call(c, "sandbox.create", { template = "dies" })
    assert.is_nil(sb)
    assert.truthy(helper.now() - t0 < 10000, "it did not wait out the timeout")
    err = msg(err)
    assert.truthy(err:find("ended (exit code 3)", 1, true), err)
    assert.truthy(err:find("boom", 1, true), err)
    no_boxes()
  end)

  it("resolves a template as registered, then shipped, then an image", function()
    -- a registered name wins over the shipped recipe (alpine's would pull)
    assert(helper.call(c, "recipe.register", { name = "alpine", source = 'return recipe "mine" { env = { MINE = "1" } }' }))
    local sb = assert(helper.call(c, "sandbox.create", { template = "alpine" }))
    assert.are.equal("mine", sb.recipe and sb.recipe.name)
    assert.are.equal("1\n", (sh(sb.id, "echo $MINE")))
    helper.call(c, "sandbox.kill", { id = sb.id })
    assert.are.same({ removed = true }, helper.call(c, "recipe.remove", { name = "alpine" }))
    assert.are.same({ removed = false }, helper.call(c, "recipe.remove", { name = "alpine" }))
    -- base is the shipped python recipe: a policy sees its Debian image (and
    -- refuses it here, so that nothing is built or pulled)
    local pol = { name = "tupper.lua", source = [[
      return policy { on_create = function(spec)
        return false, "saw " .. tostring(spec.image) .. " " .. tostring(spec.user or spec.cwd)
      end }]] }
    local _, err = helper.call(c, "sandbox.create", { template = "base", policy = pol })
    assert.truthy(msg(err):find("saw debian:bookworm /home/user", 1, true), msg(err))
    -- default and any other name are images
    sb = assert(helper.call(c, "sandbox.create", { template = "default" }))
    assert.are.equal("default", sb.image)
    helper.call(c, "sandbox.kill", { id = sb.id })
    _, err = helper.call(c, "sandbox.create", { template = "localhost:1/none/such:tag" })
    assert.truthy(err)
    no_boxes()
  end)

  it("keeps registered templates across a daemon restart", function()
    local list = helper.call(c, "recipe.list", {}).recipes
    local names = {}
    for _, r in ipairs(list) do names[#names + 1] = r.name end
    assert.are.same({ "dies", "never", "served:v1" }, names)
    c:close()
    c = nil
    d.crash() -- no boxes live: the state dir is all that is left
    d = helper.start_daemon(d.dir)
    c = d.connect()
    local again = helper.call(c, "recipe.list", {}).recipes
    assert.are.same(list, again)
    local sb = assert(helper.call(c, "sandbox.create", { template = "served:v1" }))
    assert.are.equal("hi\n", (sh(sb.id, "cat /tmp/ready")))
    helper.call(c, "sandbox.kill", { id = sb.id })
    no_boxes()
  end)
end)
