-- The Debian python image, for real: built with mmdebstrap from this host's
-- apt mirror through `tupper build`, imported into the image store, and
-- used by `tupper run --recipe`; then a rebuild from the lock alone, and a
-- lock naming a version the mirror lacks.
--
-- Slow: each build takes minutes (5 to 10 here, on 2 busy cores; see
-- docs/images.md).  The build cache is the test daemon's state dir under
-- $TMPDIR, so nothing outlives the run; each run builds twice.
local uv = require("luv")
local json = require("tupper.util.json")
local helper = require("helper")

local BUILD_MS = 40 * 60 * 1000 -- one build's bound: a hang fails, it cannot eat CI's time

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local function have_mmdebstrap()
  return uv.fs_access("/usr/bin/mmdebstrap", "X")
end

describe("the Debian python image", function()
  local dir, d, env, recipe_path, lock_path

  local function cli(args, ms)
    -- never a CLI call without the test's daemon: the client would start
    -- one of its own, outside the test's dir
    assert(d and not d.exit_code, "the test's daemon is gone")
    local saved = helper.TIMEOUT_MS
    helper.TIMEOUT_MS = ms or 120000
    local code, out, err = helper.cli(args, { env = env })
    helper.TIMEOUT_MS = saved
    return code, out, err
  end

  local function run(...)
    local args = { "run", "--recipe", recipe_path, "--" }
    for _, a in ipairs({ ... }) do args[#args + 1] = a end
    return cli(args)
  end

  setup(function()
    assert(have_mmdebstrap(), "mmdebstrap is missing: ./bootstrap.sh test installs it")
    dir = helper.tmpdir()
    d = helper.start_daemon(dir, { pool = 0 })
    env = { "TUPPER_SOCKET=" .. d.socket, "TUPPER_STATE_DIR=" .. d.state, "PATH=/usr/bin:/bin" }
    -- a copy, so that `tupper build` writes its lock here, not in the tree
    recipe_path = dir .. "/python.lua"
    lock_path = dir .. "/python.lock"
    write(recipe_path, read(helper.ROOT .. "/recipes/python.lua"))
  end)

  teardown(function()
    if d then d.stop() end
    helper.rmrf(dir)
    helper.drain()
  end)

  local lock

  it("builds once with `tupper build`, locking every package's version", function()
    local code, out, err = cli({ "build", recipe_path }, BUILD_MS)
    assert.are.equal(0, code, err)
    assert.are.equal(lock_path, out:match("[^\n]+"))
    lock = assert(json.decode(read(lock_path)))
    assert.is_table(lock.debian, read(lock_path))
    assert.are.equal("bookworm", lock.debian.debian)
    local names = {}
    for _, p in ipairs(lock.debian.packages) do
      local n, v = p:match("^([^=]+)=(.+)$")
      assert.is_truthy(n and v, p)
      names[n] = v
    end
    for _, p in ipairs({ "python3", "python3-pip", "git", "curl", "ca-certificates", "libc6", "dpkg" }) do
      assert.is_truthy(names[p], p .. " is not in the lock")
    end
    assert.is_nil(names.sudo)
    assert.is_truthy(#lock.debian.mirror >= 1)
    for _, m in ipairs(lock.debian.mirror) do assert.matches("^https?://", m.uri) end
    assert.matches("^localhost/tupper/debian%-bookworm:", lock.image)
    -- the build cache holds the record, and no leftover of the build
    local entries = {}
    local scan = uv.fs_scandir(d.state .. "/debian")
    while scan do
      local name = uv.fs_scandir_next(scan)
      if not name then break end
      entries[#entries + 1] = name
    end
    assert.are.equal(1, #entries, table.concat(entries, " "))
    assert.are.equal(64, #entries[1])
    assert.is_truthy(uv.fs_stat(d.state .. "/debian/" .. entries[1] .. "/image.json"))
    -- the store keeps the tar: the cache drops its copy
    assert.is_nil(uv.fs_stat(d.state .. "/debian/" .. entries[1] .. "/rootfs.tar"))
    -- built once: a second build finds it (in the normal CLI time bound)
    local before = read(lock_path)
    local code2, _, err2 = cli({ "build", recipe_path })
    assert.are.equal(0, code2, err2)
    assert.are.same(lock.debian, json.decode(read(lock_path)).debian)
    assert.are.equal(lock.image, json.decode(read(lock_path)).image)
    assert.is_truthy(before)
  end)

  it("runs python, pip and git as `user` with a UTF-8 locale", function()
    local code, out, err = run("python3", "-c", "import json; print(2**100)")
    assert.are.equal(0, code, err)
    assert.are.equal("1267650600228229401496703205376\n", out)
    code, out, err = run("pip", "--version")
    assert.are.equal(0, code, err)
    assert.matches("^pip %d+%.%d", out)
    code, out, err = run("git", "--version")
    assert.are.equal(0, code, err)
    assert.matches("^git version 2%.", out)
    code, out, err = run("id", "user")
    assert.are.equal(0, code, err)
    assert.are.equal("uid=1000(user) gid=1000(user) groups=1000(user)\n", out)
    code, out = run("sh", "-c", "getent passwd user; cat /etc/hostname; pwd; echo $LANG")
    assert.are.equal(0, code)
    assert.are.equal("user:x:1000:1000::/home/user:/bin/bash\ntupper\n/home/user\nC.UTF-8\n", out)
    code, out, err = run("python3", "-c",
      "import locale, sys; print(locale.getpreferredencoding(), sys.getfilesystemencoding(), 'h\\u00e9llo \\u2713')")
    assert.are.equal(0, code, err)
    assert.are.equal("UTF-8 utf-8 h\u{e9}llo \u{2713}\n", out)
    code, out = run("locale", "-a")
    assert.are.equal(0, code)
    assert.matches("C%.utf8", out)
    -- a git commit works in the user's home (identity, a writable $HOME)
    code, out, err = run("sh", "-c", "cd /home/user && git init -q r && cd r && " ..
      "git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x && git log --format=%s")
    assert.are.equal(0, code, err)
    assert.are.equal("x\n", out)
  end)

  it("has no way to raise privileges in the box (why the image has no sudo)", function()
    local code, out = run("sh", "-c", "grep -E '^(NoNewPrivs|CapEff)' /proc/self/status; command -v sudo || echo no sudo")
    assert.are.equal(0, code)
    assert.are.equal("CapEff:\t0000000000000000\nNoNewPrivs:\t1\nno sudo\n", out)
    code, out = run("id", "-un")
    assert.are.equal(0, code)
    assert.are.equal("user\n", out)
    local code2, _, err2 = run("python3", "-c", "import os; os.setgroups([])")
    assert.are_not.equal(0, code2)
    assert.matches("PermissionError", err2)
  end)

  it("rebuilds from the lock alone the same image, and refuses a version the mirror lacks", function()
    assert.is_table(lock, "the first build must have run")
    local function names()
      local out = {}
      local scan = uv.fs_scandir(d.state .. "/debian")
      while scan do
        local name = uv.fs_scandir_next(scan)
        if not name then break end
        out[#out + 1] = name
      end
      table.sort(out)
      return out
    end
    -- forget the build: the lock is all that is left of it
    local first = names()
    assert.are.equal(1, #first)
    assert(os.remove(d.state .. "/debian/" .. first[1] .. "/image.json"))
    -- `tupper build` of the unchanged recipe rebuilds the lock's versions
    local code, _, err = cli({ "build", recipe_path }, BUILD_MS)
    assert.are.equal(0, code, err)
    local relock = assert(json.decode(read(lock_path)))
    assert.are.same(lock.debian.packages, relock.debian.packages)
    assert.are_not.equal(lock.image, relock.image) -- the locked build's own name
    local out
    code, out, err = run("sh", "-c", "dpkg-query -W -f '${Package}=${Version}\\n' | sort")
    assert.are.equal(0, code, err)
    local installed = {}
    for l in out:gmatch("[^\n]+") do installed[#installed + 1] = l end
    assert.are.same(lock.debian.packages, installed)
    -- the same bytes: the store names a layer by its tar's digest
    local c = assert(d.connect())
    local a = assert(helper.call(c, "image.inspect", { ref = lock.image }))
    local b = assert(helper.call(c, "image.inspect", { ref = relock.image }))
    c:close()
    assert.are.equal(1, #a.layers)
    assert.are.equal(a.layers[1].diff_id, b.layers[1].diff_id)

    -- a version the mirror lacks is refused by the quick check, by name
    local bad = json.decode(read(lock_path))
    local found = false
    for i, p in ipairs(bad.debian.packages) do
      if p:match("^git=") then bad.debian.packages[i] = "git=1:0.0.1-tupper-nonexistent"; found = true end
    end
    assert.is_true(found)
    write(lock_path, json.encode(bad))
    local code3, _, err3 = cli({ "build", recipe_path }, BUILD_MS)
    assert.are_not.equal(0, code3)
    assert.matches("the mirror cannot give the lock's versions", err3)
    assert.matches("Version '1:0.0.1%-tupper%-nonexistent' for 'git' was not found", err3)
    -- and leaves no build dir behind
    for _, name in ipairs(names()) do assert.is_nil(name:match("^build%-"), name) end
  end)
end)
