-- Volumes (docs/volumes.md): named persistent ext4 filesystems of the state
-- dir, mounted at create, writable by the box's account, kept when the box
-- dies and across a daemon crash, size-capped, one sandbox at a time,
-- refused to destroy while mounted; bad names and mount points get clear
-- errors; nothing (loop device, mount) outlives the boxes.
local uv = require("luv")
local helper = require("helper")

-- the loop devices backed by path (as daemon/volumes.lua looks them up)
local volumes = {}
function volumes.loops_of(path)
  local real = uv.fs_realpath(path) or path
  local out = {}
  local h = uv.fs_scandir("/sys/block")
  while h do
    local name = uv.fs_scandir_next(h)
    if not name then break end
    local f = name:match("^loop%d+$") and io.open("/sys/block/" .. name .. "/loop/backing_file")
    if f then
      if (f:read("l") or ""):gsub(" %(deleted%)$", "") == real then out[#out + 1] = name end
      f:close()
    end
  end
  return out
end

local function msg(err)
  return type(err) == "table" and tostring(err.message) or tostring(err)
end

local function call(c, method, params)
  return helper.sync(function() return c:call(method, params) end)
end

-- the host's mounts that mention s
local function host_mounts(s)
  local f = assert(io.open("/proc/self/mountinfo"))
  local n = 0
  for line in f:lines() do if line:find(s, 1, true) then n = n + 1 end end
  f:close()
  return n
end

describe("volumes", function()
  local dir, d, c

  setup(function()
    dir = helper.tmpdir()
    d = helper.start_daemon(dir, { pool = 0 })
    c = d.connect()
  end)
  after_each(function()
    if c then helper.kill_sandboxes(c) end
  end)
  teardown(function()
    if c then
      helper.kill_sandboxes(c)
      for _, v in ipairs((call(c, "volume.list", {}) or { volumes = {} }).volumes) do
        call(c, "volume.destroy", { name = v.name })
      end
      c:close()
    end
    helper.release(d)
    if d then d.stop() end
    helper.rmrf(dir)
    helper.drain()
  end)

  local function sh(id, cmd, user)
    local r = assert(helper.sync(helper.run, c, id, cmd, { user = user }))
    return r.stdout .. r.stderr, r.exit_code
  end

  local function image(name) return d.state .. "/volumes/" .. name .. "/disk.img" end

  it("refuses bad names with a clear error", function()
    local cases = {
      { "..", "'..'" }, { "a..b", "'..'" }, { "a/b", "'/'" }, { "../etc", "'/'" },
      { "a\0b", "NUL" }, { "a\nb", "control character" }, { "x\27[1m", "control character" },
      { ".hidden", "starting with a letter or digit" }, { "a b", "letters, digits" },
      { ("v"):rep(64), "1 to 63 bytes" },
    }
    for _, case in ipairs(cases) do
      for _, method in ipairs({ "volume.create", "volume.get", "volume.destroy" }) do
        local r, err = call(c, method, { name = case[1] })
        assert.is_nil(r, method .. " " .. case[1])
        assert.truthy(msg(err):find(case[2], 1, true), method .. ": " .. msg(err))
      end
      local sb, err = call(c, "sandbox.create", { volumes = { ["/mnt/x"] = case[1] } })
      assert.is_nil(sb)
      assert.truthy(msg(err):find(case[2], 1, true) or msg(err):find("NUL", 1, true), msg(err))
    end
    assert.are.same({}, call(c, "volume.list", {}).volumes)
    -- nothing of them in the state dir
    local h = uv.fs_scandir(d.state .. "/volumes")
    assert.is_nil(h and uv.fs_scandir_next(h))
    -- sizes out of range
    local _, err = call(c, "volume.create", { name = "tiny", size = "1M" })
    assert.truthy(msg(err):find("size must be", 1, true), msg(err))
    _, err = call(c, "volume.create", { name = "huge", size = "1T" })
    assert.truthy(msg(err):find("size must be", 1, true), msg(err))
    _, err = call(c, "sandbox.create", { volumes = { ["/mnt/x"] = "missing" } })
    assert.truthy(msg(err):find("no volume 'missing'", 1, true), msg(err))
  end)

  it("refuses bad mount points", function()
    assert(call(c, "volume.create", { name = "mp", size = "16M" }))
    for _, case in ipairs({
      { "relative", "absolute path" }, { "/", "not /" }, { "/proc/x", "under /proc" }, { "/dev", "under /dev" },
      { "/a/../etc", "'..' component" }, { "/a//b", "empty" }, { "/a/", "ends with /" },
      { "/a\1b", "control character" },
    }) do
      local sb, err = call(c, "sandbox.create", { volumes = { [case[1]] = "mp" } })
      assert.is_nil(sb, case[1])
      assert.truthy(msg(err):find(case[2], 1, true), case[1] .. ": " .. msg(err))
    end
    -- a microVM has no way to mount one yet: refused, saying so
    local vm, verr = call(c, "sandbox.create", { backend = "microvm", volumes = { ["/mnt/x"] = "mp" } })
    assert.is_nil(vm)
    assert.truthy(msg(verr):find("not supported on the microvm backend", 1, true), msg(verr))
    local _, terr = call(c, "sandbox.create", { volumes = { ["/a"] = "mp", ["/b"] = "mp" } })
    assert.truthy(msg(terr):find("volume 'mp' is mounted twice", 1, true), msg(terr))
    -- more than a box may mount
    local many = {}
    for i = 1, 17 do many["/m" .. i] = "mp" end
    local _, merr = call(c, "sandbox.create", { volumes = many })
    assert.truthy(msg(merr):find("more than 16", 1, true) or msg(merr):find("at most 16", 1, true), msg(merr))
    assert.are.same({}, call(c, "sandbox.list", {}).sandboxes)
    assert.are.same({}, volumes.loops_of(image("mp")))
    assert(call(c, "volume.destroy", { name = "mp" }))
  end)

  it("keeps what a box's account wrote after the box dies, for the next box", function()
    local v = assert(call(c, "volume.create", { name = "data", size = "64M" }))
    assert.are.equal("data", v.name)
    assert.truthy(v.id:match("^vol%-%x+$"))
    assert.are.equal(64 * 1024 * 1024, v.size)
    assert.are.same({}, v.mounted_by)
    local sb = assert(call(c, "sandbox.create", { volumes = { ["/mnt/data"] = "data" } }))
    assert.are.same({ ["/mnt/data"] = "data" }, sb.volumes)
    local got = assert(call(c, "volume.get", { name = v.id })) -- by id too
    assert.are.same({ { sandbox = sb.id, path = "/mnt/data" } }, got.mounted_by)
    -- the root is the box's, 1777: the unprivileged account writes there
    assert.are.equal("0 1777\n", (sh(sb.id, "stat -c '%u %a' /mnt/data")))
    local out, code = sh(sb.id, "id -un; echo hello > /mnt/data/hello.txt && mkdir -p /mnt/data/d/e && stat -c %U /mnt/data/hello.txt", "user")
    assert.are.equal(0, code, out)
    assert.are.equal("user\nuser\n", out)
    -- mounted nosuid,nodev; a device node there opens nothing
    out = sh(sb.id, "grep ' /mnt/data ' /proc/self/mountinfo")
    assert.truthy(out:find("nosuid", 1, true) and out:find("nodev", 1, true), out)
    -- a second sandbox cannot mount it while the first does
    local sb2, err = call(c, "sandbox.create", { volumes = { ["/data"] = "data" } })
    assert.is_nil(sb2)
    assert.truthy(msg(err):find("mounted by sandbox " .. sb.id, 1, true), msg(err))
    -- nor can it be destroyed; the error names the sandbox
    local r, derr = call(c, "volume.destroy", { name = "data" })
    assert.is_nil(r)
    assert.truthy(msg(derr):find("mounted by sandbox " .. sb.id, 1, true), msg(derr))
    assert(call(c, "sandbox.kill", { id = sb.id }))
    -- the next box sees the data, at another path, files still the account's
    local sb3 = assert(call(c, "sandbox.create", { volumes = { ["/srv/vol"] = "data" } }))
    out = sh(sb3.id, "cat /srv/vol/hello.txt; stat -c %U /srv/vol/hello.txt; test -d /srv/vol/d/e && echo dir")
    assert.are.equal("hello\nuser\ndir\n", out)
    assert(call(c, "sandbox.kill", { id = sb3.id }))
    -- nothing left attached or mounted on the host
    assert.are.same({}, volumes.loops_of(image("data")))
    assert.are.equal(0, host_mounts(d.state .. "/volumes"))
    assert.are.same({ destroyed = true }, call(c, "volume.destroy", { name = "data" }))
    assert.is_nil(uv.fs_stat(d.state .. "/volumes/data"))
    local _, gerr = call(c, "volume.get", { name = "data" })
    assert.truthy(msg(gerr):find("no volume 'data'", 1, true), msg(gerr))
  end)

  it("is capped at its size: a fill fails with ENOSPC", function()
    assert(call(c, "volume.create", { name = "small", size = "16M" }))
    local sb = assert(call(c, "sandbox.create", { volumes = { ["/v"] = "small" } }))
    local out, code = sh(sb.id, "dd if=/dev/zero of=/v/fill bs=1M count=64 2>&1; echo rc=$?")
    assert.are.equal(0, code)
    assert.truthy(out:find("No space left on device", 1, true), out)
    assert.truthy(out:find("rc=1", 1, true), out)
    -- the box's own disk is untouched by it: the rest of the box still writes
    out, code = sh(sb.id, "echo ok > /tmp/ok && cat /tmp/ok")
    assert.are.equal("ok\n", out)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    -- the image never grew past its size
    assert.truthy(uv.fs_stat(image("small")).size <= 16 * 1024 * 1024)
    assert(call(c, "volume.destroy", { name = "small" }))
  end)

  it("refuses a mount point through a symlink of the image", function()
    assert(call(c, "volume.create", { name = "sym", size = "16M" }))
    -- a layer whose /escape points at the host's idea of / (and /etc): the
    -- mount is made before pivot_root, so following it would mount on the host
    local recipe = { name = "sym.lua", source = [[
      return recipe "sym" {
        setup = function(box) box:run("ln -s / /escape && ln -s /etc /etc2") end,
      }]] }
    for _, target in ipairs({ "/escape/tmp/x", "/etc2", "/etc2/x" }) do
      local sb, err = call(c, "sandbox.create", { recipe = recipe, volumes = { [target] = "sym" } })
      assert.is_nil(sb, target)
      assert.truthy(msg(err):find("bind volume", 1, true), target .. ": " .. msg(err))
    end
    assert.are.same({}, call(c, "sandbox.list", {}).sandboxes)
    assert.are.equal(0, host_mounts(d.state .. "/volumes"))
    assert.is_nil(uv.fs_stat("/tmp/x"))
    -- the loop device is released in the kernel's own time
    helper.sync(function() helper.poll(function() return #volumes.loops_of(image("sym")) == 0 end) end)
    assert.are.same({}, volumes.loops_of(image("sym")))
    assert(call(c, "volume.destroy", { name = "sym" }))
  end)
end)

describe("volumes across a daemon crash", function()
  local r = helper.restarts()
  local d

  setup(r.setup)
  after_each(r.after_each)
  teardown(r.teardown)

  it("keep the acknowledged writes and their records, and stay claimed by re-adopted boxes", function()
    local c
    d, c = r.start()
    assert(call(c, "volume.create", { name = "keep", size = "32M" }))
    local sb = assert(call(c, "sandbox.create", { volumes = { ["/mnt/keep"] = "keep" } }))
    -- acknowledged writes: the daemon answered them
    local blob = ("0123456789abcdef"):rep(16384) -- 256 KiB
    for i = 1, 4 do
      assert(call(c, "fs.write", { sandbox = sb.id, path = "/mnt/keep/f" .. i, data = blob, encoding = "utf8" }))
    end
    -- and a writer still going when the daemon dies
    assert(call(c, "process.start", { sandbox = sb.id,
      argv = { "sh", "-c", "i=0; while :; do echo $i >> /mnt/keep/log; i=$((i+1)); done" } }))
    helper.sync(function() require("tupper.util.async").sleep(100) end)
    d, c = r.restart(c)
    local list = call(c, "volume.list", {}).volumes
    assert.are.equal(1, #list)
    assert.are.equal("keep", list[1].name)
    -- the re-adopted box still mounts it
    assert.are.same({ { sandbox = sb.id, path = "/mnt/keep" } }, list[1].mounted_by)
    local _, derr = call(c, "volume.destroy", { name = "keep" })
    assert.truthy(msg(derr):find("mounted by sandbox " .. sb.id, 1, true), msg(derr))
    assert(call(c, "sandbox.kill", { id = sb.id }))
    local sb2 = assert(call(c, "sandbox.create", { volumes = { ["/k"] = "keep" } }))
    for i = 1, 4 do
      local r = assert(call(c, "fs.read", { sandbox = sb2.id, path = "/k/f" .. i, encoding = "utf8" }))
      assert.are.equal(#blob, #r.data, "file " .. i)
      assert.truthy(r.data == blob, "file " .. i)
    end
    -- the log is whole lines, counting up from 0
    local r = assert(helper.sync(helper.run, c, sb2.id, { "sh", "-c", "head -1 /k/log; wc -l < /k/log" }))
    assert.truthy(r.stdout:match("^0\n%s*%d+\n$"), r.stdout)
    assert(call(c, "sandbox.kill", { id = sb2.id }))
    assert(call(c, "volume.destroy", { name = "keep" }))
    c:close()
    assert.are.equal(0, d.stop())
    d = nil
  end)

  it("killed during volume.create: the volume is whole or absent, no leftover after restart", function()
    local async = require("tupper.util.async")
    for round, delay in ipairs({ 0, 40, 120, 1500 }) do
      d = r.track(helper.start_daemon(helper.tmpdir(), { pool = 0 }))
      local pipe = uv.new_pipe(false)
      helper.sync(function() async.wait(function(cb) pipe:connect(d.socket, cb) end) end)
      pipe:write('{"jsonrpc":"2.0","id":1,"method":"volume.create","params":{"name":"half","size":"2G"}}\n')
      helper.sync(function() async.sleep(delay) end)
      d.crash()
      pipe:close()
      local state = d.state
      d = r.track(helper.start_daemon(d.dir, { pool = 0 }))
      local c = assert(d.connect())
      local list = call(c, "volume.list", {}).volumes
      assert.truthy(#list == 0 or (#list == 1 and list[1].name == "half"), "round " .. round)
      -- nothing half-made is left in the state dir
      local h = uv.fs_scandir(state .. "/volumes")
      while h do
        local name = uv.fs_scandir_next(h)
        if not name then break end
        assert.are.equal("half", name, "round " .. round .. ": leftover " .. name)
      end
      if #list == 1 then
        -- a whole volume: it mounts and takes writes
        local sb = assert(call(c, "sandbox.create", { volumes = { ["/h"] = "half" } }))
        local r = assert(helper.sync(helper.run, c, sb.id, "echo ok > /h/x && cat /h/x"))
        assert.are.equal("ok\n", r.stdout)
        assert(call(c, "sandbox.kill", { id = sb.id }))
        assert(call(c, "volume.destroy", { name = "half" }))
      else
        -- the name is free again
        assert(call(c, "volume.create", { name = "half", size = "16M" }))
        assert(call(c, "volume.destroy", { name = "half" }))
      end
      c:close()
      assert.are.equal(0, d.stop())
      d = nil
    end
  end)
end)

describe("volumes from the Lua client (tupper.sdk)", function()
  local tupper = require("tupper.sdk")
  local d

  setup(function() d = helper.sdk_daemon(tupper) end)
  teardown(function()
    local code = helper.sdk_teardown(tupper, d, function()
      for _, v in ipairs(tupper.volumes.list()) do tupper.volumes.destroy(v.name) end
    end)
    if d then assert.are.equal(0, code) end
    helper.drain()
  end)

  it("creates, mounts, lists and destroys", function()
    local v = tupper.volumes.create("lua-vol", "16M")
    assert.are.equal("lua-vol", v.name)
    local box = tupper.create({ volumes = { ["/mnt/v"] = "lua-vol" } })
    box:run("echo from-lua > /mnt/v/f")
    local got = tupper.volumes.get("lua-vol")
    assert.are.equal(box.id, got.mounted_by[1].sandbox)
    local ok, err = pcall(tupper.volumes.destroy, "lua-vol")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("mounted by sandbox " .. box.id, 1, true), tostring(err))
    box:kill()
    local box2 = tupper.create({ volumes = { ["/v"] = "lua-vol" } })
    assert.are.equal("from-lua\n", box2:run("cat /v/f").stdout)
    box2:kill()
    assert.are.equal(1, #tupper.volumes.list())
    assert.is_true(tupper.volumes.destroy("lua-vol"))
    assert.are.same({}, tupper.volumes.list())
    local bok, berr = pcall(tupper.volumes.create, "a/b")
    assert.is_false(bok)
    assert.truthy(tostring(berr):find("'/'", 1, true), tostring(berr))
  end)
end)
