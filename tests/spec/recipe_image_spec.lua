-- Recipes on images from the image store: the image pulled on first use
-- from a real registry (Debian's docker-registry on 127.0.0.1), the setup
-- layer stacked above the image's layers, and a build's lock pinning the
-- image's digest in the store.
local helper = require("helper")
local json = require("tupper.util.json")
local R = require("registry_helper")

local q = R.q

describe("a recipe on a pulled image", function()
  local dir, reg, d, c

  setup(function()
    dir = helper.tmpdir()
    local layout = dir .. "/layout"
    R.must("mkdir -p " .. q(layout))
    R.busybox_root(dir .. "/root", { ["etc/hello"] = "hello from the image\n" })
    local l1 = R.layer(layout, dir .. "/root")
    local img = R.image(layout, { l1 }, { env = { "PATH=/bin", "FROM_IMAGE=yes" } })
    R.finish_layout(layout, { v1 = img })
    reg = R.start_registry(dir .. "/reg")
    R.push(layout, "v1", reg.host, "test/small")
    d = helper.start_daemon(dir .. "/d", { pool = 0 })
    c = d.connect()
  end)

  teardown(function()
    if c then c:close() end
    if d then d.stop() end
    if reg then reg.stop() end
    helper.rmrf(dir)
    helper.drain()
  end)

  local function sh(id, cmd)
    local r = assert(helper.sync(helper.run, c, id, cmd))
    return r.stdout, r.exit_code
  end

  it("pulls the image, stacks the setup layer on it, and locks its digest", function()
    local src = ([[
return recipe "small" {
  image = "%s/test/small:v1",
  env = { FROM_RECIPE = "yes" },
  setup = function(box)
    box:run("cat /etc/hello > /copied; echo layered > /layered; echo $FROM_IMAGE $FROM_RECIPE > /setup-env")
  end,
}]]):format(reg.host)
    local spec = { name = "small.lua", source = src }
    local sb = assert(helper.call(c, "sandbox.create", { recipe = spec }))
    assert.are.equal(reg.host .. "/test/small:v1", sb.image)
    assert.is_false(sb.recipe.cached)
    assert.are.equal("hello from the image\nlayered\nyes yes\nyes yes\n",
      (sh(sb.id, "cat /copied /layered /setup-env; echo $FROM_IMAGE $FROM_RECIPE")))
    helper.call(c, "sandbox.kill", { id = sb.id })
    -- build: the lock pins the image's digest
    local b = assert(helper.call(c, "recipe.build", { recipe = spec }))
    assert.is_true(b.cached)
    assert.matches("^sha256:%x+$", b.image_digest)
    assert.are.equal(b.image_digest, b.lock.image_digest)
    assert.are.equal(sb.recipe.layer, b.layer)
    -- and the store keeps the image for the lock: pinned by the build
    local pins = json.decode(helper.read_file(d.state .. "/images/pins.json"))
    assert.is_table(pins[b.image_digest])
    assert.is_true(pins[b.image_digest]["recipe-lock:" .. b.layer])
    -- a create from the lock serves the same layer on the pinned image
    spec.lock = json.encode(b.lock)
    sb = assert(helper.call(c, "sandbox.create", { recipe = spec }))
    assert.is_true(sb.recipe.cached)
    assert.are.equal(b.image_digest, sb.recipe.image_digest)
    assert.are.equal("layered\n", (sh(sb.id, "cat /layered")))
    helper.call(c, "sandbox.kill", { id = sb.id })
    -- a lock naming a digest the store lacks is refused, saying so
    local bad = json.decode(spec.lock)
    bad.image_digest = "sha256:" .. ("2"):rep(64)
    spec.lock = json.encode(bad)
    local _, err = helper.call(c, "sandbox.create", { recipe = spec })
    assert.matches("pinned by the lock (sha256:2222", err.message, nil, true)
  end)
end)

describe("shipped recipes", function()
  it("ship one per image the project builds or pulls, each valid", function()
    local recipe = require("tupper.recipe.file")
    local alpine = assert(recipe.load_embedded("alpine"))
    assert.are.equal("docker.io/library/alpine:3.20", alpine.image)
    local python = assert(recipe.load_embedded("python"))
    assert.are.equal("bookworm", python.image.debian)
    assert(recipe.load_embedded("default"))
  end)
end)
