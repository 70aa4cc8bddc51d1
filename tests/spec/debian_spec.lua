-- Debian images without building one (tests/slow/debian_spec.lua builds):
-- the recipe field's strict validation with file:line, the host's apt
-- sources and the mirror chosen from them, dpkg status, locks, cache keys.
local uv = require("luv")
local debian = require("tupper.image.debian")
local apt = require("tupper.image.debian_apt")
local locks = require("tupper.image.debian_lock")
local recipe = require("tupper.recipe.file")
local digest = require("tupper.util.digest")
local helper = require("helper")

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

-- The pid a stand-in wrote to path ("<pid>\n"), or nil while there is none.
local function read_pid(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return tonumber(s:match("^(%d+)\n"))
end

-- Whether pid runs: there, and not a zombie (one that has exited and
-- waits for its new parent to reap it).
local function alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return false end
  local s = f:read("a")
  f:close()
  return s:match("^%d+ %(.*%) (%a)") ~= "Z"
end

local DEB822 = [[
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
]]

describe("debian image spec", function()
  it("accepts a suite and package names, sorted", function()
    local err, s = debian.check_spec({ debian = "bookworm", packages = { "python3", "git", "libc6-dev", "g++" } })
    assert.is_nil(err)
    assert.are.same({ debian = "bookworm", packages = { "g++", "git", "libc6-dev", "python3" } }, s)
    err, s = debian.check_spec({ debian = "trixie" })
    assert.is_nil(err)
    assert.are.same({}, s.packages)
  end)

  it("refuses hostile values, naming the field", function()
    local bad = {
      { "nope", "must be { debian" },
      { { debian = "bookworm", extra = 1 }, "unknown field 'extra'" },
      { { debian = "bookworm", [1] = "x" }, "unknown field '1'" },
      { { packages = {} }, "'image.debian' must be" },
      { { debian = "Bookworm" }, "'image.debian' must be" },
      { { debian = "../../etc" }, "'image.debian' must be" },
      { { debian = "bookworm --mode=root" }, "'image.debian' must be" },
      { { debian = 12 }, "'image.debian' must be" },
      { { debian = ("a"):rep(33) }, "'image.debian' must be" },
      { { debian = "bookworm", packages = "python3" }, "'image.packages' must be a list" },
      { { debian = "bookworm", packages = { x = "python3" } }, "'image.packages' must be a list" },
      { { debian = "bookworm", packages = { "git", "git" } }, "names \"git\" twice" },
    }
    local hostile_names = { "-x", "--mode=root", "python3-", "a", "Python3", "python3=3.11",
      "python3/bookworm", "?essential", "~prequired", "./x.deb", "/tmp/x.deb", "a b", "a,b",
      "python3:amd64", "py\0thon", "", ("a"):rep(129), 7, true, {} }
    for _, n in ipairs(hostile_names) do
      bad[#bad + 1] = { { debian = "bookworm", packages = { "git", n } }, "'image.packages[2]' must be a Debian package name" }
    end
    local many = {}
    for i = 1, locks.MAX_PACKAGES + 1 do many[i] = "p" .. i end
    bad[#bad + 1] = { { debian = "bookworm", packages = many }, "more than" }
    for _, case in ipairs(bad) do
      local err, val, path = debian.check_spec(case[1], "image")
      assert.is_nil(val)
      assert.is_truthy(err and err:find(case[2], 1, true), ("%s: got %s"):format(case[2], tostring(err)))
      assert.are.equal("image", path[1])
    end
  end)

  it("is the recipe's image field, with file:line errors", function()
    local r = assert(recipe.load_string([[
return recipe "py" {
  image = { debian = "bookworm", packages = { "python3", "git" } },
}]], "py.lua"))
    assert.are.same({ debian = "bookworm", packages = { "git", "python3" } }, r.image)
    local cases = {
      { 'image = { debian = "bookworm", pakages = { "git" } },', "py.lua:3: 'image' has an unknown field 'pakages'" },
      { 'image = { debian = "bookworm",\n    packages = { "git", "--allow-unauthenticated" } },',
        "py.lua:4: 'image.packages[2]' must be a Debian package name" },
      { 'image = { debian = "sid; rm -rf /" },', "py.lua:3: 'image.debian' must be" },
      { "image = 42,", "py.lua:3: 'image' must be an image name or { debian" },
      { 'image = { debian = "bookworm", packages = { "git", "git" } },', "py.lua:3: 'image.packages' names" },
    }
    for _, c in ipairs(cases) do
      local text = 'return recipe "py" {\n  workdir = "/",\n  ' .. c[1] .. "\n}"
      local r2, err = recipe.load_string(text, "py.lua")
      assert.is_nil(r2)
      assert.is_truthy(err:find(c[2], 1, true), ("%s: got %s"):format(c[2], err))
    end
  end)

  it("ships recipes/python.lua", function()
    local r = assert(recipe.load_embedded("python"))
    assert.are.equal("bookworm", r.image.debian)
    for _, p in ipairs({ "python3", "python3-pip", "git", "curl", "ca-certificates" }) do
      local found = false
      for _, q in ipairs(r.image.packages) do found = found or q == p end
      assert.is_true(found, p)
    end
    assert.are.equal("user", r.user)
    assert.are.equal("/home/user", r.workdir)
    assert.are.equal("C.UTF-8", r.env.LANG)
  end)
end)

describe("apt sources", function()
  it("parses deb822, comments inside paragraphs included", function()
    local e = apt.parse_deb822(DEB822, "debian.sources")
    assert.are.equal(2, #e)
    assert.are.same({ "deb" }, e[1].types)
    assert.are.same({ "http://deb.debian.org/debian" }, e[1].uris)
    assert.are.same({ "bookworm", "bookworm-updates" }, e[1].suites)
    assert.are.same({ "main" }, e[1].components)
    assert.are.equal("/usr/share/keyrings/debian-archive-keyring.gpg", e[1].signed_by)
    assert.are.equal(1, e[1].line)
    assert.are.equal(8, e[2].line)
  end)

  it("reads Enabled, case-insensitive fields, and inline keys as no path", function()
    local e = apt.parse_deb822([[
types: deb deb-src
uris: https://a.example/debian https://b.example/debian
suites: bookworm
components: main contrib
enabled: no

Types: deb
URIs: http://c.example/debian
Suites: bookworm
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBF...
 -----END PGP PUBLIC KEY BLOCK-----
]], "x.sources")
    assert.are.equal(2, #e)
    assert.is_false(e[1].enabled)
    assert.are.same({ "deb", "deb-src" }, e[1].types)
    assert.are.equal(2, #e[1].uris)
    assert.is_true(e[2].enabled)
    assert.is_nil(e[2].signed_by)
  end)

  it("parses one-line sources with options and comments", function()
    local e = apt.parse_list([[
# a comment
deb [arch=amd64 signed-by=/etc/apt/keyrings/d.gpg] http://ftp.example/debian bookworm main contrib # trailing
deb-src http://ftp.example/debian bookworm main
deb http://ftp.example/debian-security bookworm-security main
debx http://nope bookworm main
deb
deb [signed-by=relative.gpg] http://ftp.example/debian bookworm-updates main
]], "sources.list")
    assert.are.equal(4, #e)
    assert.are.same({ "http://ftp.example/debian" }, e[1].uris)
    assert.are.same({ "main", "contrib" }, e[1].components)
    assert.are.equal("/etc/apt/keyrings/d.gpg", e[1].signed_by)
    assert.are.equal(2, e[1].line)
    assert.are.same({ "deb-src" }, e[2].types)
    assert.is_nil(e[4].signed_by) -- not an absolute path: not passed on
  end)

  it("picks the suite with its -updates and -security, nothing else", function()
    local entries = apt.parse_list([[
deb http://m.example/debian bookworm main
deb http://m.example/debian bookworm-updates main
deb http://m.example/debian bookworm-backports main
deb http://m.example/debian bookworm-proposed-updates main
deb http://s.example/debian-security bookworm-security main
deb-src http://m.example/debian bookworm main
deb http://m.example/debian trixie main
deb file:///srv/mirror bookworm main
deb cdrom:[Debian]/ bookworm main
deb http://m.example/debian bookworm main$(touch /tmp/x)
]], "sources.list")
    local m = assert(apt.select_mirror(entries, "bookworm"))
    local lines = {}
    for _, x in ipairs(m) do
      for _, l in ipairs(apt.source_lines(x)) do lines[#lines + 1] = l end
    end
    assert.are.same({
      "deb http://m.example/debian bookworm main",
      "deb http://m.example/debian bookworm-updates main",
      "deb http://s.example/debian-security bookworm-security main",
    }, lines)
    local none, err = apt.select_mirror(entries, "sid")
    assert.is_nil(none)
    assert.is_truthy(err:find('no http(s) entry for suite "sid"', 1, true))
    -- only -security for the suite is not enough: the suite itself must be there
    none = apt.select_mirror(apt.parse_list("deb http://s/ bookworm-security main\n", "x"), "bookworm")
    assert.is_nil(none)
  end)

  it("writes one line per suite, with the keyring", function()
    local m = assert(apt.select_mirror(apt.parse_deb822(DEB822, "d.sources"), "bookworm"))
    assert.are.same({
      "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main",
      "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main",
    }, apt.source_lines(m[1]))
    assert.are.equal(2, #m)
  end)

  it("reads a host's apt dir as apt does", function()
    local dir = helper.tmpdir()
    finally(function() helper.rmrf(dir) end)
    assert(uv.fs_mkdir(dir .. "/sources.list.d", 493))
    write(dir .. "/sources.list", "deb http://one.example/debian bookworm main\n")
    write(dir .. "/sources.list.d/b.sources", DEB822)
    write(dir .. "/sources.list.d/a.list", "deb http://two.example/debian bookworm-updates main\n")
    write(dir .. "/sources.list.d/c.list.disabled", "deb http://never.example/debian bookworm main\n")
    write(dir .. "/sources.list.d/d.sources.save", "deb http://never.example/debian bookworm main\n")
    local e = apt.host_sources(dir)
    local uris = {}
    for i, x in ipairs(e) do uris[i] = x.uris[1] end
    assert.are.same({ "http://one.example/debian", "http://two.example/debian",
                      "http://deb.debian.org/debian", "http://deb.debian.org/debian-security" }, uris)
    -- a sources file too large to be one is not read
    write(dir .. "/sources.list", ("#"):rep(apt.MAX_SOURCE_FILE + 1))
    assert.are.equal(3, #apt.host_sources(dir))
    debian.rmtree(dir)
    assert.are.same({}, apt.host_sources(dir))
  end)
end)

describe("debian locks", function()
  teardown(function() helper.drain() end)
  local STATUS = [[
Package: base-files
Status: install ok installed
Priority: required
Version: 12.4+deb12u10
Description: x
 continued

Package: removed-one
Status: deinstall ok config-files
Version: 1.0

Package: git
Status: install ok installed
Version: 1:2.39.5-0+deb12u2
]]
  it("reads installed packages from dpkg's status", function()
    assert.are.same({ "base-files=12.4+deb12u10", "git=1:2.39.5-0+deb12u2" }, locks.parse_status(STATUS))
  end)

  it("checks a lock and refuses hostile ones", function()
    local good = { debian = "bookworm", epoch = debian.EPOCH, include = { "git" },
                   packages = { "git=1:2.39.5-0+deb12u2", "base-files=12.4+deb12u10" },
                   mirror = { { uri = "http://deb.debian.org/debian", suites = { "bookworm" }, components = { "main" } } } }
    local l = assert(locks.check_lock(good))
    assert.are.same({ "base-files=12.4+deb12u10", "git=1:2.39.5-0+deb12u2" }, l.packages)
    local function bad(patch, want)
      local t = {}
      for k, v in pairs(good) do t[k] = v end
      for k, v in pairs(patch) do t[k] = v end
      if patch.drop then t[patch.drop] = nil; t.drop = nil end
      local ok, err = locks.check_lock(t)
      assert.is_nil(ok)
      assert.is_truthy(err:find(want, 1, true), want .. ": got " .. tostring(err))
    end
    bad({ extra = 1 }, "unknown field 'extra'")
    bad({ debian = "x y" }, "'debian'")
    bad({ epoch = "now" }, "'epoch'")
    bad({ packages = {} }, "'packages'")
    bad({ packages = { "git" } }, "'packages[1]'")
    bad({ packages = { "git=1.0 --force" } }, "'packages[1]'")
    bad({ packages = { "git=1.0", "-o=APT::x" } }, "'packages[2]'")
    bad({ packages = { "git=1.0", "git=2.0" } }, "names package \"git\" twice")
    bad({ packages = { "base-files=1" } }, "'include' names \"git\"")
    bad({ include = { "--yes" } }, "include")
    bad({ mirror = { { uri = "file:///etc", suites = {}, components = {} } } }, "'mirror[1]'")
    bad({ mirror = { { uri = "http://x/ bookworm main\ndeb http://evil", suites = {}, components = {} } } }, "'mirror[1]'")
    bad({ mirror = "http://x" }, "'mirror'")
    assert.is_nil((locks.check_lock("x")))
  end)

  it("keys the cache by suite, mirror and package set", function()
    local m = { { uri = "http://a/debian", suites = { "bookworm" }, components = { "main" } } }
    local m2 = { { uri = "http://b/debian", suites = { "bookworm" }, components = { "main" } } }
    local k = debian.key_of("bookworm", m, { "git" })
    assert.are.equal(64, #k)
    assert.are.equal(k, debian.key_of("bookworm", m, { "git" }))
    assert.are_not.equal(k, debian.key_of("bookworm", m, { "curl" }))
    assert.are_not.equal(k, debian.key_of("bookworm", m2, { "git" }))
    assert.are_not.equal(k, debian.key_of("trixie", m, { "git" }))
    assert.are_not.equal(k, debian.key_of("bookworm", m, { "git" }, { "git=1" }))
  end)

  it("fails clearly where mmdebstrap is missing or the cache is no absolute path", function()
    local saved = debian.MMDEBSTRAP
    debian.MMDEBSTRAP = "/nonexistent/mmdebstrap"
    local mirror = { { uri = "http://127.0.0.1:9/debian", suites = { "bookworm" }, components = { "main" } } }
    local dir = helper.tmpdir()
    finally(function()
      debian.MMDEBSTRAP = saved
      helper.rmrf(dir)
    end)
    local img, err = helper.sync(debian.build, { debian = "bookworm" }, { cache = dir .. "/c", mirror = mirror })
    debian.MMDEBSTRAP = saved
    assert.is_nil(img)
    assert.is_truthy(err:find("needs mmdebstrap", 1, true))
    img, err = helper.sync(debian.build, { debian = "bookworm" }, { cache = "rel/dir", mirror = mirror })
    assert.is_nil(img)
    assert.is_truthy(err:find("absolute", 1, true))
    img, err = helper.sync(debian.build, { debian = "bookworm", packages = { "-x" } }, { cache = dir, mirror = mirror })
    assert.is_nil(img)
    assert.is_truthy(err:find("Debian package name", 1, true))
  end)
end)

describe("debian builds' child process", function()
  teardown(function() helper.drain() end)
  local mirror = { { uri = "http://127.0.0.1:9/debian", suites = { "bookworm" }, components = { "main" } } }

  -- a stand-in for mmdebstrap: a real child that logs, fails or hangs
  local function fake(dir, body)
    local path = dir .. "/mmdebstrap"
    write(path, "#!/bin/sh\nfor a; do case $a in --logfile=*) log=${a#--logfile=};; esac; done\n" .. body)
    assert(uv.fs_chmod(path, 493))
    return path
  end

  local function with(path, fn)
    local saved = debian.MMDEBSTRAP
    debian.MMDEBSTRAP = path
    local ok, a, b = pcall(fn)
    debian.MMDEBSTRAP = saved
    assert(ok, a)
    return a, b
  end

  local function leftovers(cache)
    local out = {}
    local dir = uv.fs_scandir(cache)
    while dir do
      local name = uv.fs_scandir_next(dir)
      if not name then break end
      out[#out + 1] = name
    end
    return out
  end

  it("reports apt's error lines from the log, and leaves nothing behind", function()
    local dir = helper.tmpdir()
    finally(function() helper.rmrf(dir) end)
    local bin = fake(dir, 'echo "I: downloading" > "$log"\necho "E: Unable to locate package nope" >> "$log"\nexit 1\n')
    local img, err = with(bin, function()
      return helper.sync(debian.build, { debian = "bookworm", packages = { "nope" } },
        { cache = dir .. "/cache", mirror = mirror, aptopts = {} })
    end)
    assert.is_nil(img)
    assert.matches("mmdebstrap failed %(exit 1%):\nE: Unable to locate package nope", err)
    assert.are.same({}, leftovers(dir .. "/cache"))
  end)

  it("kills the whole process group at the time bound, and on cancel_all", function()
    local dir = helper.tmpdir()
    finally(function()
      -- the stand-in's background sleeps, if the build's kill missed them
      for _, f in ipairs({ "/child.pid", "/deaf.pid" }) do
        local child = tonumber((helper.read_file(dir .. f) or ""):match("%d+"))
        if child and (helper.read_file("/proc/" .. child .. "/cmdline") or ""):match("^sleep") then
          uv.kill(child, "sigkill")
        end
      end
      helper.rmrf(dir)
    end)
    -- two children in the build's group: one holding stdout, and one deaf
    -- to SIGTERM with its stdout elsewhere (the build's EOF does not wait
    -- for it)
    local bin = fake(dir, "sleep 300 &\necho $! > " .. dir .. "/child.pid\n" ..
      "(trap '' TERM; exec sleep 300 >/dev/null 2>&1) &\necho $! > " .. dir .. "/deaf.pid\nsleep 300\n")
    local function children()
      local a, b = read_pid(dir .. "/child.pid"), read_pid(dir .. "/deaf.pid")
      return a and b and { a, b } or nil
    end
    local function assert_gone(pids)
      for _, pid in ipairs(pids) do
        assert.is_false(alive(pid), ("the build's background child %d survived"):format(pid))
      end
    end
    local img, err = with(bin, function()
      return helper.sync(debian.build, { debian = "bookworm" },
        { cache = dir .. "/cache", mirror = mirror, aptopts = {}, timeout = 0.3 })
    end)
    assert.is_nil(img)
    assert.matches("took longer than 0.3 s and was killed", err)
    assert_gone(assert(children(), "the stand-in wrote no pids"))
    assert.are.same({}, leftovers(dir .. "/cache"))
    -- a daemon shutting down stops its builds: once both children are there
    os.remove(dir .. "/child.pid")
    os.remove(dir .. "/deaf.pid")
    local t, waited = uv.new_timer(), 0
    t:start(10, 10, function()
      waited = waited + 10
      if children() or waited > 30000 then
        t:close()
        debian.cancel_all()
      end
    end)
    img, err = with(bin, function()
      return helper.sync(debian.build, { debian = "bookworm", packages = { "git" } },
        { cache = dir .. "/cache", mirror = mirror, aptopts = {} })
    end)
    assert.is_nil(img)
    assert.matches("stopped", err)
    assert_gone(assert(children(), "the stand-in wrote no pids"))
    assert.are.same({}, leftovers(dir .. "/cache"))
  end)
end)

-- The cache keys' hash: tupper.util.digest, libcrypto's SHA-256 (the spec
-- loads build/lua/tupper/util/digest.so, the binary its preloaded copy).
describe("digest.sha256", function()
  it("matches FIPS 180-4's vectors", function()
    assert.are.equal("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", digest.sha256(""))
    assert.are.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", digest.sha256("abc"))
    assert.are.equal("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
      digest.sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))
    assert.are.equal("cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
      digest.sha256(("a"):rep(1000000)))
  end)

  it("hashes its arguments as one message", function()
    assert.are.equal(digest.sha256("abc"), digest.sha256("a", "", "bc"))
    assert.are.equal("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
      digest.sha256("abcdbcdecdefdefgefghfghighijhijk", "ijkljklmklmnlmnomnopnopq"))
    assert.are.equal("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", digest.sha256())
  end)

  it("refuses what is not a string", function()
    assert.has_error(function() digest.sha256("a", {}) end)
  end)
end)
