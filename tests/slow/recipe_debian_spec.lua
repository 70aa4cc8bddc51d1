-- The shipped python recipe end to end (slow: builds a Debian image with
-- mmdebstrap from this host's apt mirror): `tupper build` writes a lock
-- with the image's digest and package versions, `tupper run --recipe` runs
-- python3 as the recipe's user, and a create honours the lock.
local uv = require("luv")
local helper = require("helper")
local json = require("tupper.util.json")

describe("recipes/python.lua", function()
  local d, dir, cache_dir

  setup(function()
    dir = helper.tmpdir()
    -- the microVM kernel: fetched into the spec's temp dir unless
    -- TUPPER_VM_CACHE names a cache to reuse
    if not os.getenv("TUPPER_VM_CACHE") then
      cache_dir = helper.tmpdir()
      uv.os_setenv("TUPPER_VM_CACHE", cache_dir)
    end
    d = helper.start_daemon(nil, { pool = 0 })
  end)
  teardown(function()
    if d then assert.are.equal(0, d.stop()) end
    helper.rmrf(dir)
    if cache_dir then helper.rmrf(cache_dir); uv.os_unsetenv("TUPPER_VM_CACHE") end
    helper.drain()
  end)

  local function cli(...)
    local args = { "--socket", d.socket }
    for _, a in ipairs({ ... }) do args[#args + 1] = a end
    local saved = helper.TIMEOUT_MS
    helper.TIMEOUT_MS = 3600 * 1000 -- the first build downloads and installs
    local code, out, err = helper.cli(args)
    helper.TIMEOUT_MS = saved
    return code, out, err
  end

  it("builds, locks, and runs python3 as user in /home/user", function()
    local path = dir .. "/python.lua"
    local text = helper.read_file(helper.ROOT .. "/recipes/python.lua")
    assert.is_string(text)
    local f = assert(io.open(path, "wb"))
    f:write(text)
    f:close()
    local code, out, err = cli("build", path)
    assert.are.equal(0, code, err)
    assert.are.equal(dir .. "/python.lock\n", out)
    local lock = json.decode(helper.read_file(dir .. "/python.lock"))
    assert.matches("^sha256:%x+$", lock.image_digest)
    assert.are.equal("bookworm", lock.debian.debian)
    local has_python = false
    for _, p in ipairs(lock.debian.packages) do has_python = has_python or p:match("^python3=") ~= nil end
    assert.is_true(has_python)
    code, out, err = cli("run", "--recipe", path, "--", "sh", "-c", "id -u; pwd; python3 -c 'print(6 * 7)'")
    assert.are.equal(0, code, err)
    assert.are.equal("1000\n/home/user\n42\n", out)
    -- the same recipe and image on a microVM: the Debian image becomes its
    -- root image, with the recipe's user, workdir and env
    code, out, err = cli("run", "--backend", "microvm", "--recipe", path, "--", "sh", "-c",
      "id -u; pwd; python3 -c 'print(6 * 7)'; echo $LANG; uname -r")
    assert.are.equal(0, code, err)
    local kernel = out:match("^1000\n/home/user\n42\nC%.UTF%-8\n(%S+)\n$")
    assert.is_not_nil(kernel, out)
    assert.are_not.equal(helper.read_file("/proc/sys/kernel/osrelease"):gsub("%s+$", ""), kernel)
    -- a lock naming an image the store does not have is refused, saying so
    lock.image_digest = "sha256:" .. ("1"):rep(64)
    f = assert(io.open(dir .. "/python.lock", "wb"))
    f:write(json.encode(lock))
    f:close()
    code, out, err = cli("run", "--recipe", path, "--", "true")
    assert.are.equal(125, code)
    assert.matches("pinned by the lock", err, nil, true)
  end)

  it("is the template 'base' (E2B's default), from the image built above", function()
    local c = d.connect()
    local saved = helper.TIMEOUT_MS
    helper.TIMEOUT_MS = 3600 * 1000 -- built above; alone, this builds it
    local sb, err = helper.call(c, "sandbox.create", { template = "base" })
    helper.TIMEOUT_MS = saved
    assert.is_table(sb, err and err.message)
    assert.are.equal("python", sb.recipe.name)
    local r = assert(helper.sync(helper.run, c, sb.id, { "sh", "-c", "id -un; python3 -c 'print(6 * 7)'" }))
    assert.are.equal("user\n42\n", r.stdout)
    helper.call(c, "sandbox.kill", { id = sb.id })
    c:close()
  end)
end)
