-- The image store through a real daemon: imports of an OCI layout, a
-- docker-archive, rootfs tars and dirs (all made here, from busybox-static),
-- multi-layer images with whiteouts and an opaque dir, the image config
-- applied to processes, hostile archives refused with nothing left behind,
-- rmi/prune/pins, and two creates sharing one unpack.
local uv = require("luv")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local helper = require("helper")

local call, sync = helper.call, helper.sync

local oci = require("oci_build")
local tar, header, write, sh, sha256, gzip = oci.tar, oci.header, oci.write, oci.sh, oci.sha256, oci.gzip
local oci_layout = oci.oci_layout

local function ls(dir)
  local names = {}
  local h = uv.fs_scandir(dir)
  while h do
    local name = uv.fs_scandir_next(h)
    if not name then break end
    names[#names + 1] = name
  end
  table.sort(names)
  return table.concat(names, " ")
end

---------------------------------------------------------------- the test images

local base = oci.busybox_base()
local middle = {
  { name = "opt/keep/a", data = "a\n" },
  { name = "opt/gone", data = "gone\n" },
  { name = "data/old", data = "old\n" },
  { name = "etc/motd", data = "middle\n" },
}
local top = {
  { name = "opt/.wh.gone", data = "" },
  { name = "data/.wh..wh..opq", data = "" },
  { name = "data/new", data = "new\n" },
  { name = "etc/motd", data = "top\n" },
}

local CONFIG = {
  Env = { "PATH=/bin", "GREETING=hello" },
  Entrypoint = { "/bin/sh", "-c" },
  Cmd = { "echo $GREETING from $(pwd) as $(id -u):$(id -g) home $HOME" },
  WorkingDir = "/opt",
  User = "app",
}

-- A `docker save` tar: manifest.json, <hex>.json, <n>/layer.tar.
local function docker_archive(path, layers, config, tag, mutate)
  local diffs, files, names = {}, {}, {}
  for i, entries in ipairs(layers) do
    local t = tar(entries)
    local p = path .. ".l" .. i
    write(p, t)
    diffs[i] = sha256(p)
    os.remove(p)
    names[i] = ("%d/layer.tar"):format(i)
    files[#files + 1] = { name = ("%d/"):format(i), type = "5" }
    files[#files + 1] = { name = names[i], data = t }
  end
  local cfg = json.encode({ architecture = "amd64", os = "linux", config = config,
                            rootfs = { type = "layers", diff_ids = diffs } })
  write(path .. ".cfg", cfg)
  local chex = sha256(path .. ".cfg"):sub(8)
  os.remove(path .. ".cfg")
  local manifest = { { Config = chex .. ".json", RepoTags = tag and { tag } or nil, Layers = names } }
  if mutate then mutate(manifest) end
  files[#files + 1] = { name = chex .. ".json", data = cfg }
  files[#files + 1] = { name = "manifest.json", data = json.encode(manifest) }
  write(path, tar(files))
  return diffs
end

---------------------------------------------------------------- specs

describe("the image store", function()
  local d, c, dir, images

  local function run(id, script)
    return sync(function() return helper.run(c, id, { "/bin/sh", "-c", script }) end)
  end

  -- every blob and layer of the store, and what tmp/ holds
  local function snapshot()
    return ls(images .. "/blobs/sha256") .. " | " .. ls(images .. "/layers") .. " | " .. ls(images .. "/tmp")
  end

  setup(function()
    dir = helper.tmpdir()
    d = helper.start_daemon(dir .. "/d", { pool = 0, args = { "--max-layer", "16M" } })
    c = assert(d.connect())
    images = d.state .. "/images"
  end)
  teardown(function()
    if c then pcall(c.close, c) end
    -- release: a daemon the crash test killed and did not get to restart
    -- is restarted on its state, so the box it left goes too
    helper.release(d)
    helper.rmrf(dir)
    helper.drain()
  end)

  it("imports an OCI layout and runs its Entrypoint + Cmd as its User in its WorkingDir", function()
    local info = oci_layout(dir .. "/oci", { base, middle, top }, CONFIG)
    local code, out, err = helper.cli({ "--socket", d.socket, "import", dir .. "/oci", "myoci:1" })
    assert.are.equal(0, code, err)
    assert.truthy(out:find("docker.io/library/myoci:1 " .. info.manifest, 1, true), out)
    for _, diff in ipairs(info.diffs) do
      assert.truthy(uv.fs_stat(images .. "/layers/" .. diff:sub(8)), "layer " .. diff .. " unpacked")
    end
    code, out, err = helper.cli({ "--socket", d.socket, "run", "--image", "myoci:1" })
    assert.are.equal(0, code, err)
    assert.are.equal("hello from /opt as 1234:1235 home /home/app\n", out)
    -- an explicit command runs as given, with the image's env, user and dir
    code, out = helper.cli({ "--socket", d.socket, "run", "--image", "myoci:1", "-e", "GREETING=hi",
      "--", "sh", "-c", "echo $GREETING $(id -u) $(pwd)" })
    assert.are.equal(0, code)
    assert.are.equal("hi 1234 /opt\n", out)
  end)

  it("merges the layers: upper wins, whiteouts and opaque dirs hide what is below", function()
    local sb = assert(call(c, "sandbox.create", { image = "myoci:1" }))
    assert.are.equal("docker.io/library/myoci:1", sb.image)
    local r = run(sb.id, "cat /etc/motd; ls /opt; ls /data; [ -e /opt/gone ] && echo gone-seen; " ..
      "cat /opt/keep/a")
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal("top\nkeep\nnew\na\n", r.stdout)
    -- writes go to the box's upper dir; the shared layers stay as they were
    r = run(sb.id, "echo mine > /tmp/x && cat /tmp/x && echo changed > /etc/motd 2>&1; cat /etc/motd")
    assert.are.equal("mine\n", r.stdout:sub(1, 5))
    local sb2 = assert(call(c, "sandbox.create", { image = "myoci:1" }))
    assert.are.equal("top\n", run(sb2.id, "cat /etc/motd").stdout)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    assert(call(c, "sandbox.kill", { id = sb2.id }))
  end)

  it("imports a docker-archive under its own tag, numeric User, explicit Cmd", function()
    local path = dir .. "/docker.tar"
    docker_archive(path, { base, middle }, { Env = { "PATH=/bin", "GREETING=dock" },
      Cmd = { "/bin/sh", "-c", "echo $GREETING $(id -u):$(id -g) $(pwd)" }, WorkingDir = "/data",
      User = "1234" }, "example.org/team/dock:2")
    local r = assert(call(c, "image.import", { path = path }))
    assert.are.equal("example.org/team/dock:2", r.ref)
    local code, out, err = helper.cli({ "--socket", d.socket, "run", "--image", "example.org/team/dock:2" })
    assert.are.equal(0, code, err)
    assert.are.equal("dock 1234:1235 /data\n", out)
    -- the base layer is shared with the OCI image: one dir for both
    local info = assert(call(c, "image.inspect", { ref = "example.org/team/dock:2" }))
    local oci = assert(call(c, "image.inspect", { ref = "myoci:1" }))
    assert.are.equal(oci.layers[1].diff_id, info.layers[1].diff_id)
    assert.are.equal("1234", info.config.user)
    assert.are.same({ "PATH=/bin", "GREETING=dock" }, info.config.env)
    local list = assert(call(c, "image.list", {})).images
    local refs = {}
    for _, i in ipairs(list) do refs[#refs + 1] = i.ref end
    assert.are.same({ "docker.io/library/myoci:1", "example.org/team/dock:2" }, refs)
  end)

  it("resolves User:group by name and refuses users the image does not know", function()
    local path = dir .. "/ghost.tar"
    docker_archive(path, { base }, { Env = { "PATH=/bin" }, User = "app:staff" }, "ghost:staff")
    assert(call(c, "image.import", { path = path }))
    local sb = assert(call(c, "sandbox.create", { image = "ghost:staff" }))
    assert.are.equal("1234:50\n", run(sb.id, "echo $(id -u):$(id -g)").stdout)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    docker_archive(path, { base }, { Env = { "PATH=/bin" }, User = "ghost" }, "ghost:1")
    assert(call(c, "image.import", { path = path }))
    sb = assert(call(c, "sandbox.create", { image = "ghost:1" }))
    local res, e = sync(function() return helper.run(c, sb.id, { "id" }) end)
    assert.is_nil(res)
    assert.truthy(e.message:find("user 'ghost' is not in the image's /etc/passwd", 1, true), e.message)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    docker_archive(path, { base }, { User = "70000" }, "ghost:big")
    assert(call(c, "image.import", { path = path }))
    sb = assert(call(c, "sandbox.create", { image = "ghost:big" }))
    res, e = sync(function() return helper.run(c, sb.id, { "id" }) end)
    assert.is_nil(res)
    assert.truthy(e.message:find("outside the sandbox's ids", 1, true), e.message)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    for _, ref in ipairs({ "ghost:staff", "ghost:1", "ghost:big" }) do assert(call(c, "image.remove", { ref = ref })) end
  end)

  it("imports a plain rootfs tar (gzip'ed) and a rootfs directory", function()
    local path = dir .. "/rootfs.tar"
    write(path, tar(base))
    local gz = gzip(path)
    local r = assert(call(c, "image.import", { path = gz, ref = "plain" }))
    assert.are.equal("docker.io/library/plain:latest", r.ref)
    local sb = assert(call(c, "sandbox.create", { image = "plain" }))
    assert.are.equal("root:x:0:0:root:/root:/bin/sh\n", run(sb.id, "read l < /etc/passwd; echo $l").stdout)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    -- a directory: the default image's own rootfs
    r = assert(call(c, "image.import", { path = d.state .. "/images/default/rootfs", ref = "fromdir" }))
    sb = assert(call(c, "sandbox.create", { image = "fromdir" }))
    assert.are.equal("ok\n", run(sb.id, "echo ok").stdout)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    local _, e = call(c, "image.import", { path = gz })
    assert.truthy(e.message:find("give a name", 1, true), e.message)
    -- a unix socket in a directory (a server's, left behind) is no file of
    -- an image: it is left out, the rest comes in
    assert(os.execute("mkdir -p " .. dir .. "/withsock && echo hi > " .. dir .. "/withsock/hello"))
    local srv = uv.new_pipe(false)
    assert(srv:bind(dir .. "/withsock/s.sock"))
    r, e = call(c, "image.import", { path = dir .. "/withsock", ref = "withsock" })
    srv:close()
    assert(r, e and e.message)
    local info = assert(call(c, "image.inspect", { ref = "withsock" }))
    local layer = images .. "/layers/" .. info.layers[1].diff_id:sub(8)
    assert.are.equal("hello", ls(layer))
    assert(call(c, "image.remove", { ref = "withsock" }))
  end)

  it("refuses an unknown image with a clear error", function()
    -- not in the store, and its registry (nothing listens there) fails the pull
    local _, e = call(c, "sandbox.create", { image = "localhost:1/nosuch:9" })
    assert.truthy(e.message:find("no image 'localhost:1/nosuch:9' in the store", 1, true), e.message)
    assert.truthy(e.message:find("pulling it failed", 1, true), e.message)
    _, e = call(c, "sandbox.create", { image = "Bad Ref!" })
    assert.truthy(e.message:find("not an image reference", 1, true), e.message)
  end)

  it("runs an image by its manifest digest, and refuses a digest the store lacks without pulling", function()
    local info = oci_layout(dir .. "/bydigest", { base, middle, top }, CONFIG)
    local code, _, err = helper.cli({ "--socket", d.socket, "import", dir .. "/bydigest", "bydigest:1" })
    assert.are.equal(0, code, err)
    local sb = assert(call(c, "sandbox.create", { image = info.manifest }))
    assert.are.equal("hi\n", run(sb.id, "echo hi").stdout)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    local unknown = "sha256:" .. string.rep("ab", 32)
    local _, e = call(c, "sandbox.create", { image = unknown })
    assert.truthy(e.message:find("image " .. unknown .. " is not in the store; images are pulled by name", 1, true),
      e.message)
    assert.is_nil(e.message:find("pulling", 1, true), e.message)
    _, e = call(c, "image.pull", { ref = unknown })
    assert.truthy(e.message:find("is a digest, which names no repository", 1, true), e.message)
    _, e = call(c, "sandbox.create", { image = "sha256:" .. string.rep("AB", 32) })
    assert.truthy(e.message:find("is not a digest", 1, true), e.message)
    local log = helper.read_file(d.log)
    assert.is_nil(log:find("library/sha256", 1, true), "no pull of a repository named sha256")
    -- the store as the next tests expect it: without this image
    assert(call(c, "image.remove", { ref = "bydigest:1" }))
  end)

  describe("hostile archives", function()
    local outside

    setup(function()
      outside = dir .. "/outside"
      uv.fs_mkdir(outside, tonumber("755", 8))
    end)

    local function refused(name, data, want, compress)
      local path = dir .. "/" .. name .. ".tar"
      write(path, data)
      if compress then path = gzip(path) end
      local before = snapshot()
      local r, e = call(c, "image.import", { path = path, ref = "evil/" .. name })
      assert.is_nil(r, name .. " was imported")
      assert.truthy(e.message:find(want, 1, true), name .. ": " .. e.message)
      assert.are.equal(before, snapshot(), name .. " left something in the store")
      assert.is_nil((call(c, "image.inspect", { ref = "evil/" .. name })))
    end

    it("are refused with a clear error and leave nothing behind", function()
      refused("dotdot", tar({ { name = "a/../../../evil", data = "x" } }), "leads out of the layer")
      refused("absolute", tar({ { name = "/etc/evil", data = "x" } }), "is absolute")
      refused("through", tar({ { name = "link", type = "2", link = outside },
        { name = "link/pwned", data = "x" } }), "goes through a symlink")
      assert.is_nil(uv.fs_stat(outside .. "/pwned"), "a file was written through the symlink")
      refused("hardlink", tar({ { name = "passwd", type = "1", link = "../../../../etc/passwd" } }),
        "leads out of the layer")
      refused("hardlink-abs", tar({ { name = "shadow", type = "1", link = "/etc/shadow" } }), "is absolute")
      refused("device", tar({ { name = "dev/mem", type = "3", major = 1, minor = 1 } }), "device node")
      refused("uid", tar({ { name = "f", data = "x", uid = 1000000 } }), "outside the sandbox's ids")
      -- a 64 MiB file of zeros, a few KiB gzip'ed; the daemon takes 16 MiB
      local path = dir .. "/bomb.tar"
      write(path, header({ name = "zeros", size = 64 * 1048576 }))
      assert(os.execute("head -c " .. 64 * 1048576 .. " /dev/zero >> '" .. path .. "' && " ..
        "head -c 1024 /dev/zero >> '" .. path .. "' && gzip -n -f '" .. path .. "'"))
      local before = snapshot()
      local r, e = call(c, "image.import", { path = path .. ".gz", ref = "evil/bomb" })
      assert.is_nil(r)
      assert.truthy(e.message:find("more than 16777216 bytes", 1, true), e.message)
      assert.are.equal(before, snapshot())
      -- truncated gzip
      write(dir .. "/t.tar", tar(base))
      local gz = gzip(dir .. "/t.tar")
      local size = uv.fs_stat(gz).size
      assert(os.execute("truncate -s " .. size // 2 .. " '" .. gz .. "'"))
      r, e = call(c, "image.import", { path = gz, ref = "evil/truncated" })
      assert.is_nil(r)
      assert.truthy(e.message:find("truncated", 1, true), e.message)
      assert.are.equal(before, snapshot())
      -- a docker-archive naming a layer outside itself
      docker_archive(dir .. "/escape.tar", { base }, {}, "evil/escape:1", function(m)
        m[1].Layers = { "../../../../etc/passwd" }
      end)
      r, e = call(c, "image.import", { path = dir .. "/escape.tar" })
      assert.is_nil(r)
      assert.truthy(e.message:find("not a file of the archive", 1, true), e.message)
      assert.are.equal(before, snapshot())
    end)

    it("with a blob that does not match its digest are refused", function()
      local info = oci_layout(dir .. "/liar", { base, { { name = "etc/liar", data = "unique\n" } } }, CONFIG)
      -- swap the top layer's content for another tar's
      local victim = dir .. "/liar/blobs/sha256/" .. info.layers[2].digest:sub(8)
      write(dir .. "/other.tar", tar({ { name = "etc/motd", data = "evil\n" } }))
      local other = gzip(dir .. "/other.tar")
      assert(os.rename(other, victim))
      os.execute("truncate -s " .. info.layers[2].size .. " '" .. victim .. "'")
      local before = snapshot()
      local r, e = call(c, "image.import", { path = dir .. "/liar", ref = "evil/liar" })
      assert.is_nil(r)
      assert.truthy(e.message:find("digest mismatch", 1, true) or e.message:find("size", 1, true), e.message)
      assert.are.equal(before, snapshot())
    end)
  end)

  it("refuses rmi while a sandbox uses the image, then removes what only it used", function()
    local oci = assert(call(c, "image.inspect", { ref = "myoci:1" }))
    local sb = assert(call(c, "sandbox.create", { image = "myoci:1" }))
    local _, e = call(c, "image.remove", { ref = "myoci:1" })
    assert.truthy(e.message:find("in use by a sandbox", 1, true), e.message)
    local code, _, err = helper.cli({ "--socket", d.socket, "rmi", "myoci:1" })
    assert.are_not.equal(0, code)
    assert.truthy(err:find("in use", 1, true), err)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    code = helper.cli({ "--socket", d.socket, "rmi", "myoci:1" })
    assert.are.equal(0, code)
    -- its own top layer is gone; the base, shared with the docker image, stays
    assert.is_nil(uv.fs_stat(images .. "/layers/" .. oci.layers[3].diff_id:sub(8)))
    assert.truthy(uv.fs_stat(images .. "/layers/" .. oci.layers[1].diff_id:sub(8)))
    assert.is_nil(uv.fs_stat(images .. "/blobs/sha256/" .. oci.digest:sub(8)))
    _, e = call(c, "image.inspect", { ref = "myoci:1" })
    assert.truthy(e.message:find("no image", 1, true))
    _, e = call(c, "image.remove", { ref = "default" })
    assert.truthy(e.message:find("cannot be removed", 1, true))
  end)

  it("writes a box's /etc/resolv.conf inside it, never through an image's link to the host", function()
    -- the host side the links point at
    local host = dir .. "/rhost"
    assert(uv.fs_mkdir(host, 493))
    write(host .. "/host-file", "host\n")
    local shadow = { name = "etc/shadow", data = "root:secret:1::::::\n", mode = 384 }
    local cases = {
      { "shadow", { shadow, { name = "etc/resolv.conf", type = "2", link = "/etc/shadow" } } },
      { "hostfile", { { name = "etc/resolv.conf", type = "2", link = host .. "/host-file" } } },
      { "dangling", { { name = "etc/resolv.conf", type = "2", link = host .. "/made-by-box" } } },
      { "etclink", { { name = "etc", type = "2", link = host } } },
      { "etcfile", { { name = "etc", data = "not a dir\n" } } },
    }
    for _, case in ipairs(cases) do
      local name, layer = case[1], case[2]
      local top_layer = name:find("^etc") and { { name = ".wh.etc", data = "" }, layer[1] } or layer
      oci_layout(dir .. "/r-" .. name, { base, top_layer }, { Env = { "PATH=/bin" } })
      assert(call(c, "image.import", { path = dir .. "/r-" .. name, ref = "resolv-" .. name .. ":1" }))
      local sb = assert(call(c, "sandbox.create", { image = "resolv-" .. name .. ":1" }))
      local r = run(sb.id, "cat /etc/resolv.conf 2>/dev/null; echo; cat /etc/shadow 2>/dev/null; exit 0")
      assert.are.equal(0, r.exit_code, name .. ": " .. tostring(r.stderr))
      if name == "shadow" then
        -- the agent, root of the box, wrote through the link: inside the box only
        assert.are.equal("nameserver 127.0.0.1\n\nnameserver 127.0.0.1\n", r.stdout)
      end
      assert(call(c, "sandbox.kill", { id = sb.id }))
      assert.are.equal("host\n", sh("cat '" .. host .. "/host-file'"), name)
      assert.are.equal("host-file", ls(host), name)
      assert(call(c, "image.remove", { ref = "resolv-" .. name .. ":1" }))
    end
    helper.rmrf(host)
  end)

  it("unpacks a layer once for two creates at the same time", function()
    local info = assert(call(c, "image.inspect", { ref = "example.org/team/dock:2" }))
    for _, l in ipairs(info.layers) do helper.rmrf(images .. "/layers/" .. l.diff_id:sub(8)) end
    local ids = sync(function()
      local got, n = {}, 0
      async.wait(function(done)
        for i = 1, 2 do
          async.spawn(function()
            got[i] = assert(c:call("sandbox.create", { image = "example.org/team/dock:2" })).id
            n = n + 1
            if n == 2 then done() end
          end)
        end
      end)
      return got
    end)
    for _, id in ipairs(ids) do
      assert.are.equal("dock 1234:1235 /data\n", run(id, "echo $GREETING $(id -u):$(id -g) $(pwd)").stdout)
      assert(call(c, "sandbox.kill", { id = id }))
    end
    local log = helper.read_file(d.log)
    for _, l in ipairs(info.layers) do
      local _, n = log:gsub("unpacking image layer " .. l.diff_id, "")
      -- once at the OCI image's import (which shares these two), once now
      assert.are.equal(2, n, l.diff_id .. " unpacked " .. n .. " times")
      assert.truthy(uv.fs_stat(images .. "/layers/" .. l.diff_id:sub(8)))
    end
    assert.are.equal("", ls(images .. "/tmp"))
  end)

  it("prunes what nothing reaches, and with --all what no sandbox uses and no pin holds", function()
    local stray = images .. "/blobs/sha256/" .. ("ab"):rep(32)
    write(stray, "stray")
    os.execute("touch -d '2 hours ago' '" .. stray .. "'")
    local fresh = images .. "/blobs/sha256/" .. ("cd"):rep(32)
    write(fresh, "a pull in progress")
    local r = assert(call(c, "image.prune", {}))
    assert.is_nil(uv.fs_stat(stray))
    assert.truthy(uv.fs_stat(fresh), "prune removed a fresh blob")
    os.remove(fresh)
    assert.are.equal(0, #r.refs)
    -- a pin (what a lockfile holds) keeps an image from prune --all
    local info = assert(call(c, "image.inspect", { ref = "example.org/team/dock:2" }))
    write(images .. "/pins.json", json.encode({ [info.digest] = { ["/tmp/x/tupper.lock"] = true } }))
    assert(call(c, "image.import", { path = d.state .. "/images/default/rootfs", ref = "unpinned" }))
    local sb = assert(call(c, "sandbox.create", { image = "unpinned" }))
    r = assert(call(c, "image.prune", { all = true }))
    assert.are.same({ "docker.io/library/fromdir:latest", "docker.io/library/plain:latest" }, r.refs)
    assert.truthy(call(c, "image.inspect", { ref = "example.org/team/dock:2" }))
    assert.truthy(call(c, "image.inspect", { ref = "unpinned" }), "an image in use was pruned")
    assert(call(c, "sandbox.kill", { id = sb.id }))
    local code, out = helper.cli({ "--socket", d.socket, "image", "prune", "--all" })
    assert.are.equal(0, code)
    assert.truthy(out:find("removed docker.io/library/unpinned:latest", 1, true), out)
    os.remove(images .. "/pins.json")
    code, out = helper.cli({ "--socket", d.socket, "images", "--json" })
    assert.are.equal(0, code)
    assert.are.equal(1, #json.decode(out))
  end)

  it("keeps an image in use across a daemon crash", function()
    local sb = assert(call(c, "sandbox.create", { image = "example.org/team/dock:2" }))
    c:close()
    d.crash()
    d = helper.start_daemon(dir .. "/d", { pool = 0, args = { "--max-layer", "16M" } })
    c = assert(d.connect())
    local _, e = call(c, "image.remove", { ref = "example.org/team/dock:2" })
    assert.truthy(e and e.message:find("in use", 1, true), "a re-adopted box's image was removable")
    assert.are.equal("dock\n", run(sb.id, "echo $GREETING").stdout)
    assert(call(c, "sandbox.kill", { id = sb.id }))
    assert(call(c, "image.remove", { ref = "example.org/team/dock:2" }))
    assert.are.equal("", ls(images .. "/layers"))
  end)
end)
