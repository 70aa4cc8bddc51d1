-- Recipes against a real daemon: sandbox.create{recipe = ...}, setup(box)
-- and its cached layer, `tupper run --recipe`, `tupper build` and its
-- lockfile, and hostile recipes (each refusal asserted, and the daemon
-- still serving after it).
local uv = require("luv")
local helper = require("helper")
local json = require("tupper.util.json")

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local function ls(dir)
  local names = {}
  local h = uv.fs_scandir(dir)
  while h do
    local n = uv.fs_scandir_next(h)
    if not n then break end
    names[#names + 1] = n
  end
  table.sort(names)
  return names
end

describe("recipes in sandboxes", function()
  local d, c

  setup(function()
    d = helper.start_daemon(nil, { pool = 1 })
    c = d.connect()
  end)

  teardown(function()
    if c then
      local r = helper.call(c, "sandbox.list", {})
      for _, s in ipairs(r and r.sandboxes or {}) do helper.call(c, "sandbox.kill", { id = s.id }) end
      c:close()
    end
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)
  -- a failed test's box must not fail the next test's no_leftovers
  after_each(function() if c then helper.kill_sandboxes(c) end end)

  local function create(source, name, extra)
    local p = { recipe = { name = name or "spec.lua", source = source } }
    for k, v in pairs(extra or {}) do p[k] = v end
    return helper.call(c, "sandbox.create", p)
  end

  local function sh(id, cmd)
    local r = assert(helper.sync(helper.run, c, id, cmd))
    return r.stdout, r.exit_code, r.stderr
  end

  local function kill(id) helper.call(c, "sandbox.kill", { id = id }) end

  -- nothing of a recipe's boxes is left: no sandbox, no half-made layer
  local function no_leftovers()
    local r = helper.call(c, "sandbox.list", {})
    assert.are.same({}, r.sandboxes)
    for _, n in ipairs(ls(d.state .. "/layers")) do assert.is_nil(n:match("^tmp%-"), n) end
  end

  it("applies the recipe's image, env, workdir, user, limits and files", function()
    local sb = assert(create([[
      return recipe "full" {
        image = "default",
        env = { FOO = "bar", KEEP = "recipe" },
        workdir = "/home/user/work",
        user = "user",
        limits = { memory = "256M", pids = 64, timeout = "10m" },
        files = { ["/etc/motd"] = "hello from the recipe\n", ["/home/user/a/b.txt"] = "deep" },
      }]]))
    assert.are.equal("default", sb.image)
    assert.are.equal(256 * 1024 * 1024, sb.limits.memory)
    assert.are.equal(64, sb.limits.pids)
    assert.are.equal(600, sb.timeout)
    assert.are.equal("full", sb.recipe.name)
    local out = sh(sb.id, "id -u; id -g; pwd; echo $FOO-$KEEP-$HOME; cat /etc/motd /home/user/a/b.txt")
    assert.are.equal("1000\n1000\n/home/user/work\nbar-recipe-/home/user\nhello from the recipe\ndeep", out)
    kill(sb.id)
  end)

  it("lets explicit create params override the recipe's", function()
    local sb = assert(create([[
      return recipe "over" {
        env = { FOO = "recipe", KEEP = "recipe" }, workdir = "/tmp",
        limits = { memory = "256M", pids = 64 },
      }]], nil, { env = { FOO = "explicit" }, cwd = "/root", limits = { pids = 32 } }))
    assert.are.equal(32, sb.limits.pids)
    assert.are.equal(256 * 1024 * 1024, sb.limits.memory)
    assert.are.equal("explicit-recipe\n/root\n", (sh(sb.id, "echo $FOO-$KEEP; pwd")))
    kill(sb.id)
    local _, err = create('return recipe "img" {}', nil, { image = "default" })
    assert.matches("'image' and 'recipe' together", err.message)
  end)

  it("runs setup once and serves the next sandbox from the cached layer", function()
    local src = [[
      return recipe "cached" {
        files = { ["/etc/app.conf"] = "x = 1\n" },
        setup = function(box)
          -- a value a second run of setup could not reproduce
          box:run("cat /proc/sys/kernel/random/uuid > /built")
          local r = box:run({ "cat", "/etc/app.conf" })
          box:write("/opt/seen", r.stdout)
          box:mkdir("/opt/dir/sub")
          assert(box:exists("/opt/dir/sub") and not box:exists("/opt/nothing"))
          box:remove("/etc/hostname") -- a whiteout in the layer
        end,
      }]]
    local a = assert(create(src))
    assert.is_false(a.recipe.cached)
    local key = a.recipe.layer
    assert.matches("^%x+$", key)
    assert.are.equal(64, #key)
    local built_a = sh(a.id, "cat /built")
    assert.matches("^%x+%-", built_a)
    assert.are.equal("x = 1\n", (sh(a.id, "cat /opt/seen")))
    local _, code = sh(a.id, "test -e /etc/hostname")
    assert.are.equal(1, code)
    -- the layer is on disk, with the marker inside it and what made it
    assert.are.equal(built_a, helper.read_file(d.state .. "/layers/" .. key .. "/fs/built"))
    local info = json.decode(helper.read_file(d.state .. "/layers/" .. key .. "/layer.json"))
    assert.are.equal("cached", info.recipe)
    local b = assert(create(src))
    assert.is_true(b.recipe.cached)
    assert.are.equal(key, b.recipe.layer)
    assert.are.equal(built_a, (sh(b.id, "cat /built"))) -- setup did not run again
    assert.are.equal(1, select(2, sh(b.id, "test -e /etc/hostname")))
    -- a box's writes stay its own: the layer is read-only below it
    sh(b.id, "echo changed > /built")
    local c2 = assert(create(src))
    assert.are.equal(built_a, (sh(c2.id, "cat /built")))
    -- different files make a different layer, and setup runs for it
    local other = assert(create((src:gsub("x = 1", "x = 2"))))
    assert.is_false(other.recipe.cached)
    assert.are_not.equal(key, other.recipe.layer)
    assert.are_not.equal(built_a, (sh(other.id, "cat /built")))
    for _, s in ipairs({ a, b, c2, other }) do kill(s.id) end
  end)

  it("runs one setup for creates of one recipe at the same time", function()
    local src = [[
      return recipe "together" { setup = function(box)
        box:run("cat /proc/sys/kernel/random/uuid > /built; sleep 0.5")
      end }]]
    local async = require("tupper.util.async")
    local results = {}
    helper.sync(function()
      local left = 2
      async.wait(function(cb)
        for i = 1, 2 do
          async.spawn(function()
            results[i] = c:call("sandbox.create", { recipe = { name = "t.lua", source = src } })
            left = left - 1
            if left == 0 then cb() end
          end)
        end
      end)
    end)
    local a, b = assert(results[1]), assert(results[2])
    assert.are.equal(a.recipe.layer, b.recipe.layer)
    assert.are_not.equal(a.recipe.cached, b.recipe.cached) -- one built it, one waited for it
    assert.are.equal((sh(a.id, "cat /built")), (sh(b.id, "cat /built")))
    kill(a.id)
    kill(b.id)
  end)

  it("fails a create whose setup fails, with file:line and the stderr tail", function()
    local _, err = create([[
      return recipe "broken" {
        setup = function(box)
          box:run("echo fine")
          box:run("echo something went wrong >&2; exit 3")
        end,
      }]], "recipes/broken.lua")
    assert.matches('setup failed: recipes/broken.lua:4: command "echo something went wrong >&2; exit 3" exited with 3:\nsomething went wrong', err.message, nil, true)
    -- a Lua error in setup is placed too, and box calls check their arguments
    _, err = create('return recipe "e" { setup = function(box)\n  box:write("relative", "x")\nend }', "e.lua")
    assert.matches("e.lua:2: box:write: the path must be absolute", err.message, nil, true)
    _, err = create('return recipe "e" { setup = function(box)\n\n  error("no luck")\nend }', "e.lua")
    assert.matches("e.lua:3: no luck", err.message, nil, true)
    _, err = create('return recipe "e" { setup = function(box)\n  box.run("true")\nend }', "e.lua")
    assert.matches("e.lua:2: box:run: call it with a colon", err.message, nil, true)
    _, err = create('return recipe "e" { setup = function(box)\n  box:run("true", { bogus = 1 })\nend }', "e.lua")
    assert.matches("e.lua:2: box:run: unknown option 'bogus'", err.message, nil, true)
    -- check = false hands back a failed command's result instead
    local sb = assert(create([[
      return recipe "nocheck" { setup = function(box)
        local r = box:run("echo out; echo err >&2; exit 7", { check = false })
        box:write("/result", r.stdout .. r.stderr .. r.exit_code)
      end }]]))
    assert.are.equal("out\nerr\n7", (sh(sb.id, "cat /result")))
    kill(sb.id)
    no_leftovers()
  end)

  it("stops a setup that loops, calls the box forever or eats memory, and keeps serving", function()
    for _, case in ipairs({
      { "while true do end", "loop.lua:2: recipe: instruction limit exceeded" },
      { "while true do box:exists('/') end", "loop.lua:2: recipe: instruction limit exceeded" },
      { "local t = {} while true do t[#t + 1] = ('x'):rep(4096) .. #t end", "loop.lua:2: recipe: memory limit exceeded" },
      { "local s = 'x' while true do s = s .. s end", "loop.lua:2: recipe: memory limit exceeded" },
    }) do
      local _, err = create("return recipe 'l' { setup = function(box)\n" .. case[1] .. "\nend }", "loop.lua")
      assert.is_table(err, case[1])
      assert.matches(case[2], err.message, nil, true)
    end
    -- a command that outlives its timeout fails the setup, and nothing stays
    local _, err = create([[return recipe 't' { setup = function(box)
      box:run("sleep 100", { timeout = "1s" })
    end }]])
    assert.matches('command "sleep 100" timed out', err.message, nil, true)
    local sb = assert(helper.call(c, "sandbox.create", {}))
    assert.are.equal("ok\n", (sh(sb.id, "echo ok")))
    kill(sb.id)
    no_leftovers()
  end)

  it("refuses hostile recipes with a clear error", function()
    local cases = {
      { 'return recipe "x" {\n  limits = { memory = "12Q" },\n}', "spec.lua:2: 'limits.memory': bad size" },
      { 'return recipe "x" {\n  imgae = "default",\n}', "spec.lua:2: unknown field 'imgae'" },
      { 'return recipe "x" { env = { A = 1 } }', "'env.A' must be a string" },
      { 'return recipe "x" { setup = "rm -rf /" }', "'setup' must be a function(box)" },
      { 'local f = {} for i = 1, 1025 do f["/f" .. i] = "x" end\nreturn recipe "x" { files = f }',
        "'files' has more than 1024 entries" },
      { 'return recipe "x" { files = { ["/big"] = ("x"):rep(1024 * 1024 + 1) } }', "must be a string of at most" },
      { 'return recipe "x" { files = { ["../etc/passwd"] = "x" } }', "must be an absolute path" },
      { 'return io.open("/etc/shadow"):read("a")', "global 'io'" },
      { 'while true do end', "instruction limit exceeded" },
      { 'return recipe "x" { network = { allow = { "pypi.org:99999" } } }', "bad port '99999'" },
      { 'return recipe "x" { network = { allow = { "pypi\\0.org" } } }', "'network.allow[1]' must be a rule" },
    }
    for _, case in ipairs(cases) do
      local _, err = create(case[1])
      assert.is_table(err, case[1])
      assert.matches(case[2], err.message, nil, true)
    end
    -- the socket API's own bounds: source size, unknown fields, a missing source
    local _, err = helper.call(c, "sandbox.create", { recipe = { source = ("-"):rep(1048577) } })
    assert.matches("'recipe.source' is longer than", err.message, nil, true)
    _, err = helper.call(c, "sandbox.create", { recipe = { path = "/etc/passwd" } })
    assert.matches("'recipe' has an unknown field 'path'", err.message, nil, true)
    _, err = helper.call(c, "sandbox.create", { recipe = { name = "no-such-recipe" } })
    assert.matches('no shipped recipe "no-such-recipe"', err.message, nil, true)
    _, err = helper.call(c, "sandbox.create", { recipe = { name = "../../etc/passwd" } })
    assert.matches("no shipped recipe", err.message, nil, true)
    -- network = "none" is fine, and rules are enforced (network_spec.lua);
    -- so is a shipped recipe by name
    local sb = assert(create('return recipe "x" { network = "none" }'))
    kill(sb.id)
    sb = assert(create('return recipe "x" { network = { allow = { "pypi.org:443" } } }'))
    local r = assert(helper.sync(helper.run, c, sb.id, { "nslookup", "pypi.org", "127.0.0.1" }))
    assert.matches("198%.18%.", r.stdout)
    r = assert(helper.sync(helper.run, c, sb.id, { "nslookup", "example.com", "127.0.0.1" }))
    assert.matches("NXDOMAIN", r.stdout)
    kill(sb.id)
    sb = assert(helper.call(c, "sandbox.create", { recipe = { name = "default" } }))
    assert.are.equal("default", sb.recipe.name)
    kill(sb.id)
    no_leftovers()
  end)

  it("is bound by the sandbox's policy: its limits, setup commands and files", function()
    local pol = { name = "tupper.lua", source = [[
      return policy {
        max = { memory = "128M" },
        on_exec = function(argv)
          for _, a in ipairs(argv) do if a:find("wget") then return false, "no downloads" end end
          return true
        end,
        on_file = function(op, path)
          if op == "write" and path:find("^/etc/") then return false, "/etc is read-only" end
          return true
        end,
      }]] }
    local function with_policy(src)
      return helper.call(c, "sandbox.create", { recipe = { name = "p.lua", source = src }, policy = pol })
    end
    local _, err = with_policy('return recipe "big" { limits = { memory = "1G" } }')
    assert.matches("memory", err.message)
    assert.matches("128", err.message)
    _, err = with_policy('return recipe "dl" { setup = function(box)\n  box:run("wget http://x")\nend }')
    assert.matches("p.lua:2: policy tupper.lua: on_exec refused: no downloads", err.message, nil, true)
    _, err = with_policy('return recipe "f" { files = { ["/etc/x"] = "y" } }')
    assert.matches("/etc is read-only", err.message, nil, true)
    _, err = with_policy('return recipe "w" { setup = function(box)\n  box:write("/tmp/../etc/x", "y")\nend }')
    assert.matches("p.lua:2: .*/etc is read%-only", err.message)
    local sb = assert(with_policy('return recipe "ok" { limits = { memory = "64M" } }'))
    assert.are.equal(64 * 1024 * 1024, sb.limits.memory)
    kill(sb.id)
    no_leftovers()
  end)

  it("gives setup the recipe's network rules, and none without them", function()
    local sb = assert(create([[
      return recipe "net-setup" {
        network = { allow = { "pypi.org:443" } },
        setup = function(box)
          local r = box:run({ "nslookup", "pypi.org", "127.0.0.1" }, { check = false })
          box:write("/allowed", r.stdout)
          r = box:run({ "nslookup", "example.com", "127.0.0.1" }, { check = false })
          box:write("/denied", r.stdout)
        end,
      }]]))
    assert.matches("198%.18%.", (sh(sb.id, "cat /allowed")))
    assert.matches("NXDOMAIN", (sh(sb.id, "cat /denied")))
    kill(sb.id)
    sb = assert(create([[
      return recipe "no-net-setup" { setup = function(box)
        local r = box:run({ "nslookup", "pypi.org", "127.0.0.1" }, { check = false })
        box:write("/out", r.stdout .. r.exit_code)
      end }]]))
    assert.is_nil((sh(sb.id, "cat /out")):match("198%.18%."))
    kill(sb.id)
  end)

  it("is what tupper.sdk's create{recipe = ...} sends", function()
    local sdk = require("tupper.sdk")
    sdk.configure({ socket = d.socket, autostart = false })
    local box = sdk.create({ recipe = "default", policy = false })
    assert.are.equal("default", box:info().recipe.name)
    box:kill()
    box = sdk.create({ policy = false, envs = { B = "explicit" }, recipe = {
      name = "sdk.lua", source = 'return recipe "sdk" { env = { A = "a", B = "b" }, files = { ["/f"] = "x" } }' } })
    assert.are.equal("a explicit x\n", box:run("echo $A $B $(cat /f)").stdout)
    box:kill()
    local ok, err = pcall(sdk.create, { policy = false, recipe = "/no/such/recipe.lua" })
    assert.is_false(ok)
    assert.matches("recipe: /no/such/recipe.lua", err, nil, true)
    sdk.close()
  end)

  it("tupper run --recipe, tupper build and its lockfile", function()
    local dir = helper.tmpdir()
    finally(function() helper.rmrf(dir) end) -- boxes left go with the block's daemon
    local path = dir .. "/app.lua"
    local src = [[
return recipe "app" {
  env = { GREETING = "hi" },
  setup = function(box)
    box:run("cat /proc/sys/kernel/random/uuid > /built")
  end,
}
]]
    write(path, src)
    local g = { "--socket", d.socket }
    local function cli(...)
      local args = { table.unpack(g) }
      for _, a in ipairs({ ... }) do args[#args + 1] = a end
      return helper.cli(args)
    end
    local code, out, err = cli("run", "--recipe", path, "--", "sh", "-c", "echo $GREETING; cat /built")
    assert.are.equal(0, code, err)
    local built = out:match("^hi\n(%x[%x-]+\n)$")
    assert.is_string(built, out)
    -- build: the layer is cached already; the lock pins it
    code, out, err = cli("build", path)
    assert.are.equal(0, code, err)
    local lock_path = dir .. "/app.lock"
    assert.are.equal(lock_path .. "\n", out)
    local lock = json.decode(helper.read_file(lock_path))
    assert.are.equal(1, lock.version)
    assert.are.equal("app", lock.recipe)
    assert.are.equal("default", lock.image)
    assert.matches("^sha256:%x+$", lock.image_digest)
    assert.are.equal(64, #lock.layer)
    -- a create from the locked recipe uses that layer
    code, out = cli("run", "--recipe", path, "--", "cat", "/built")
    assert.are.equal(0, code)
    assert.are.equal(built, out)
    -- the recipe changed since the lock: refused, saying so
    write(path, src:gsub('"hi"', '"hello"'))
    code, out, err = cli("run", "--recipe", path, "--", "true")
    assert.are.equal(125, code)
    assert.matches("app.lua changed since it was locked", err, nil, true)
    -- a lock naming an image this daemon does not have, or another layer
    write(path, src)
    local bad = json.decode(helper.read_file(lock_path))
    bad.image_digest = "sha256:" .. ("0"):rep(64)
    write(lock_path, json.encode(bad))
    code, out, err = cli("run", "--recipe", path, "--", "true")
    assert.are.equal(125, code)
    assert.matches("pinned by the lock (sha256:000", err, nil, true)
    bad = json.decode(helper.read_file(lock_path))
    bad.image_digest, bad.layer = lock.image_digest, ("a"):rep(64)
    write(lock_path, json.encode(bad))
    code, out, err = cli("run", "--recipe", path, "--", "true")
    assert.are.equal(125, code)
    assert.matches("the lock names layer aaaaaaaaaaaa", err, nil, true)
    write(lock_path, "not json")
    code, out, err = cli("run", "--recipe", path, "--", "true")
    assert.are.equal(125, code)
    assert.matches("the lock is not a JSON object", err, nil, true)
    -- build again rewrites the lock; create honours it
    code = cli("build", path)
    assert.are.equal(0, code)
    code, out = cli("create", "--recipe", path)
    assert.are.equal(0, code)
    local id = out:match("^(%S+)\n$")
    assert.are.equal(built, (sh(id, "cat /built")))
    kill(id)
    no_leftovers()
  end)
end)

describe("a recipe's setup when the daemon stops", function()
  it("ends the setup, keeps no layer and exits cleanly", function()
    local d = helper.start_daemon(nil, { pool = 0 })
    local c = d.connect()
    finally(function()
      c:close()
      helper.release(d)
      helper.drain()
    end)
    local done, res, err
    require("tupper.util.async").spawn(function()
      res, err = c:call("sandbox.create", { recipe = { name = "slow.lua", source = [[
        return recipe "slow" { setup = function(box) box:run("sleep 30") end }]] } })
      done = true
    end)
    -- wait until the setup's command runs, then stop the daemon
    helper.sync(function()
      for _ = 1, 500 do
        local names = ls(d.state .. "/layers")
        if #names > 0 then return end
        require("tupper.util.async").sleep(10)
      end
    end)
    helper.sync(function() require("tupper.util.async").sleep(300) end)
    local state = d.state
    local layers_before = ls(state .. "/layers")
    assert.are.equal(1, #layers_before) -- the build's tmp dir
    uv.kill(d.pid, "sigterm")
    helper.sync(function()
      while not (d.exit_code and done) do require("tupper.util.async").sleep(10) end
    end)
    assert.are.equal(0, d.exit_code)
    assert.is_nil(res)
    assert.matches("setup", err.message)
    local left = {}
    for _, n in ipairs(ls(state .. "/layers")) do
      if not n:match("^tmp%-") then left[#left + 1] = n end
    end
    assert.are.same({}, left) -- no layer committed from a setup cut short
  end)
end)
