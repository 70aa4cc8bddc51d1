-- Recipes and policy files: loading, strict validation with file and line,
-- policy caps and hooks (lua/tupper/recipe/file.lua, lua/tupper/recipe/policy.lua).
local recipe = require("tupper.recipe.file")
local policy = require("tupper.recipe.policy")

local helper = require("helper")

-- each block's files in a temp dir of its own, removed after it (they were
-- left in $TMPDIR)
local tmp
local function own_tmpdir()
  setup(function() tmp = helper.tmpdir() end)
  teardown(function() helper.rmrf(tmp) end)
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

describe("recipe", function()
  own_tmpdir()
  it("loads the embedded default recipe", function()
    local r = assert(recipe.load_embedded("default"))
    assert.are.equal("default", r.name)
    assert.are.equal("default", r.image)
    assert.are.equal("none", r.network)
    assert.is_nil(r.limits)
    assert.is_true(recipe.check_enforceable(r))
    assert.is_nil((recipe.load_embedded("../etc/passwd")))
  end)
  it("loads a full recipe and normalises its units", function()
    local path = write(tmp .. "/python.lua", [[
return recipe "python" {
  image   = "default",
  limits  = { memory = "512M", cpus = 1, pids = 256, disk = "2G", timeout = "30m" },
  env     = { PYTHONUNBUFFERED = "1" },
  workdir = "/home/user",
  user    = "user",
  files   = { ["/home/user/README"] = "scratch space\n" },
  setup   = function(box) box:run("true") end,
}]])
    local r = assert(recipe.load(path))
    assert.are.equal("python", r.name)
    assert.are.same({ memory = 512 * 1024 ^ 2, cpus = 1, pids = 256, disk = 2 * 1024 ^ 3, timeout = 1800 },
      r.limits)
    assert.is_function(r.setup)
    assert.are.equal(path, r.origin.file)
    assert.are.equal(1, r.origin.line)
    assert.are.same({ image = "default", env = { PYTHONUNBUFFERED = "1" }, cwd = "/home/user",
      limits = r.limits }, recipe.create_params(r))
  end)
  it("carries the backend to the create parameters", function()
    local r = assert(recipe.load_string('return recipe "vm" { backend = "microvm" }', "vm.lua"))
    assert.are.equal("microvm", recipe.create_params(r).backend)
  end)
  it("accepts a plain table", function()
    local r = assert(recipe.load_string('return { name = "plain", limits = { memory = 8388608 } }', "p.lua"))
    assert.are.equal(8388608, r.limits.memory)
  end)
  it("names the file, the line and what was expected", function()
    local cases = {
      { 'return recipe "x" {\n  image = "default",\n  limits = {\n    memory = "12Q",\n  },\n}',
        '^x%.lua:4: \'limits%.memory\': bad size "12Q"' },
      { 'return recipe "x" {\n  image = "default",\n  imgae = "y",\n}',
        "^x%.lua:3: unknown field 'imgae' %(expected one of: name, image" },
      { 'return recipe "x" {\n\n  image = 3,\n}', "^x%.lua:3: 'image' must be an image name" },
      { '\n\nreturn recipe "x" {\n  limits = { pids = "many" } }', "^x%.lua:4: 'limits%.pids' must be an integer" },
      { 'return recipe "x" {\n  limits = { memory = "1K" } }', "^x%.lua:2: 'limits%.memory' must be at least 4M" },
      { 'return recipe "x" {\n  workdir = "home" }', "^x%.lua:2: 'workdir' must be an absolute path" },
      { 'return recipe "x" {\n  setup = "pip install" }', "^x%.lua:2: 'setup' must be a function" },
      { 'return recipe "x" {\n  network = "some" }', "^x%.lua:2: 'network' must be" },
      { 'return recipe "x" {\n  env = { A = 1 } }', "^x%.lua:2: 'env.A' must be a string" },
      { 'return recipe "x y" {}', "^x%.lua:1: 'name' must be letters" },
      { 'return { image = "default" }', "^x%.lua: 'name' is missing" },
      { 'return 42', "^x%.lua: a recipe file must return" },
      { 'return recipe "x" {\n  image = "default",\n', "^x%.lua:3: .*expected" },
      { 'return recipe "x" {\n  backend = "xen" }', "^x%.lua:2: 'backend' must be one of: linux, microvm" },
    }
    for _, c in ipairs(cases) do
      local r, err = recipe.load_string(c[1], "x.lua")
      assert.is_nil(r)
      assert.matches(c[2], err)
    end
  end)
  it("reports a missing file", function()
    local r, err = recipe.load(tmp .. "/no-such-recipe.lua")
    assert.is_nil(r)
    assert.matches("no%-such%-recipe", err)
  end)
  it("enforces network rules, and refuses one the daemon cannot parse", function()
    local r = assert(recipe.load_string(
      'return recipe "net" {\n network = { allow = { "pypi.org:443" }, deny = { "10.0.0.0/8" } } }', "n.lua"))
    assert.is_true(recipe.check_enforceable(r))
    assert.same({ allow = { "pypi.org:443" }, deny = { "10.0.0.0/8" } }, recipe.create_params(r).network)
    local bad = assert(recipe.load_string(
      'return recipe "net" {\n network = { allow = { "pypi.org:99999" } } }', "b.lua"))
    local ok, err = recipe.check_enforceable(bad)
    assert.is_nil(ok)
    assert.matches("^b%.lua:1: network%.allow%[1%] \"pypi%.org:99999\": bad port", err)
    assert.is_true(recipe.check_enforceable(assert(recipe.load_string(
      'return recipe "off" { network = "none" }', "o.lua"))))
  end)
  it("stops a recipe that never finishes loading", function()
    local r, err = recipe.load_string('while true do end return recipe "x" {}', "loop.lua")
    assert.is_nil(r)
    assert.matches("^loop%.lua:.*instruction limit exceeded", err)
  end)
end)

describe("policy", function()
  own_tmpdir()
  local function pol(text) return assert(policy.load_string(text, "tupper.lua")) end

  it("caps limits and refuses above the cap, naming the rule", function()
    local p = pol('return policy { max = { memory = "1G", pids = 100, timeout = "1h" } }')
    local out, err = policy.apply_create(p, { image = "default", limits = { memory = 2 * 1024 ^ 3 } })
    assert.is_nil(out)
    assert.are.equal("policy tupper.lua: max.memory is 1G, asked 2G", err)
    out = assert(policy.apply_create(p, { image = "default", limits = { memory = 512 * 1024 ^ 2 } }))
    assert.are.same({ memory = 512 * 1024 ^ 2, pids = 100, timeout = 300 }, out.limits)
    out, err = policy.apply_create(p, { limits = { timeout = 0 } })
    assert.is_nil(out)
    assert.matches("max.timeout is 1h, asked 0", err)
    out, err = policy.apply_create(p, { limits = { pids = 101 } })
    assert.matches("max.pids is 100, asked 101", err)
  end)
  it("refuses bad policy files with file and line", function()
    local cases = {
      { 'return policy {\n  max = { memory = "12Q" } }', "^tupper%.lua:2: 'max%.memory': bad size" },
      { 'return policy {\n  on_exec = true }', "^tupper%.lua:2: 'on_exec' must be a function" },
      { 'return policy {\n  maxx = {} }', "^tupper%.lua:2: unknown field 'maxx'" },
      { 'return { network = "all" }', "^tupper%.lua:1: 'network' = \"all\" is not a cap" },
    }
    for _, c in ipairs(cases) do
      local p, err = policy.load_string(c[1], "tupper.lua")
      assert.is_nil(p)
      assert.matches(c[2], err)
    end
  end)
  it("on_create allows, refuses with a reason, or rewrites (capped again)", function()
    local p = pol([[return policy {
      max = { memory = "1G" },
      on_create = function(spec)
        if spec.image == "bad" then return false, "no bad images" end
        if spec.image == "grow" then spec.limits.memory = 2 * 1024 ^ 3 return spec end
        if spec.image == "env" then spec.env = { FROM_POLICY = "1" } return spec end
        if spec.image == "quiet" then return end
        return true
      end }]])
    assert.are.equal("default", assert(policy.apply_create(p, { image = "default" })).image)
    local out, err = policy.apply_create(p, { image = "bad" })
    assert.is_nil(out)
    assert.are.equal("policy tupper.lua: on_create refused: no bad images", err)
    assert.matches("max.memory is 1G, asked 2G", select(2, policy.apply_create(p, { image = "grow" })))
    assert.are.same({ FROM_POLICY = "1" }, assert(policy.apply_create(p, { image = "env" })).env)
    assert.matches("on_create refused", select(2, policy.apply_create(p, { image = "quiet" })))
  end)
  it("on_exec allows, denies with a reason, or rewrites argv", function()
    local p = pol([[return policy {
      on_exec = function(argv)
        if argv[1] == "rm" then return false, "rm is not allowed" end
        if argv[1] == "python" then argv[1] = "python3" return argv end
        if argv[1] == "bad" then return { 1, 2 } end
        return true
      end }]])
    assert.are.same({ "ls", "-l" }, policy.check_exec(p, { "ls", "-l" }))
    local argv, err = policy.check_exec(p, { "rm", "-rf", "/" })
    assert.is_nil(argv)
    assert.are.equal("policy tupper.lua: on_exec refused: rm is not allowed", err)
    assert.are.same({ "python3", "x.py" }, policy.check_exec(p, { "python", "x.py" }))
    assert.matches("bad argv", select(2, policy.check_exec(p, { "bad" })))
  end)
  it("on_file allows or denies", function()
    local p = pol([[return policy {
      on_file = function(op, path)
        if op ~= "read" and path:find("^/etc/") then return false, "read-only" end
        return true
      end }]])
    assert.is_true(policy.check_file(p, "read", "/etc/passwd"))
    local ok, err = policy.check_file(p, "write", "/etc/passwd")
    assert.is_nil(ok)
    assert.matches("on_file refused: read%-only", err)
    assert.is_true(policy.check_file(pol("return {}"), "write", "/etc/passwd"))
  end)
  it("stops hooks that loop or eat memory, and refuses (fail closed)", function()
    local p = pol([[return policy {
      on_exec = function() while true do end end,
      on_file = function() local t = {} while true do t[#t + 1] = ("x"):rep(1e6) end end,
      on_create = function() error("oops") end }]])
    local argv, err = policy.check_exec(p, { "ls" })
    assert.is_nil(argv)
    assert.matches("on_exec failed: recipe: instruction limit exceeded", err)
    local ok, ferr = policy.check_file(p, "read", "/x")
    assert.is_nil(ok)
    assert.matches("on_file failed: recipe: memory limit exceeded", ferr)
    local out, cerr = policy.apply_create(p, {})
    assert.is_nil(out)
    assert.matches("on_create failed: tupper.lua:4: oops", cerr)
  end)
  it("is found upward from a project directory", function()
    local root = tmp .. "/policy-find"
    finally(function() os.execute(("rm -rf '%s'"):format(root)) end)
    os.execute(("mkdir -p '%s/a/b/c'"):format(root))
    write(root .. "/a/tupper.lua", "return { max = { pids = 10 } }")
    assert.are.equal(root .. "/a/tupper.lua", policy.find(root .. "/a/b/c"))
    assert.are.equal(root .. "/a/tupper.lua", policy.find(root .. "/a/"))
    local p = assert(policy.load(policy.find(root .. "/a/b")))
    assert.are.equal(10, p.max.pids)
  end)
end)
