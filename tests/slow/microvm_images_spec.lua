-- The microvm backend with images of the store (docs/microvm.md).  Boots
-- microVMs and builds root images (TCG here): slow.  The guest kernel is
-- fetched into the spec's temp dir unless TUPPER_VM_CACHE names a cache to
-- reuse.
local uv = require("luv")
local async = require("tupper.util.async")
local helper = require("helper")
local vm = require("microvm_helper")

local sync = helper.sync

-- Images of the store on microVMs (docs/microvm.md, root images): layers
-- with whiteouts and an opaque dir, the image config, recipes with setup
-- layers, two images side by side, hostile layers, and the network relay
-- from inside a guest.

-- The snapshot name's tail of a VM's shape (memory MiB, vCPUs, disk MiB),
-- as sandbox.get reports the limits in force (the daemon's defaults are the
-- host's: docs/limits.md)
local function shape_of(call, id)
  local l = assert(call("sandbox.get", { id = id })).limits
  return ("%%-%d%%-%s%%-%d%%-r%%x+$"):format(l.memory // 1048576, ("%g"):format(l.cpus), l.disk // 1048576)
end

describe("the microvm backend with images of the store", function()
  local oci = require("oci_build")
  local json = require("tupper.util.json")
  local d, c, dir, vm_undo, servers, hp
  local APPLETS = { "sh", "cat", "ls", "id", "echo", "pwd", "env", "test", "stat", "find", "wc", "mkdir",
                    "rm", "wget", "head", "tr", "mv" }
  local base = oci.busybox_base(APPLETS)
  local middle = {
    { name = "opt/keep/a", data = "a\n" },
    { name = "opt/gone", data = "gone\n" },
    { name = "data/old", data = "old\n" },
    { name = "data/sub/deep", data = "deep\n" },
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

  local function call(method, params) return helper.call(c, method, params) end
  local function run(id, script, opts)
    return sync(function() return helper.run(c, id, { "/bin/sh", "-c", script }, opts) end)
  end
  local function create(params)
    params.backend = "microvm"
    local sb, err = call("sandbox.create", params)
    assert(sb, err and err.message)
    assert.are.equal("microvm", sb.backend)
    return sb.id
  end
  local function import(name, layers, config, daemon)
    local path = dir .. "/" .. name:gsub("[^%w]", "_")
    oci.oci_layout(path, layers, config or { Env = { "PATH=/bin" } })
    local code, out, err = helper.cli({ "--socket", (daemon or d).socket, "import", path, name })
    assert.are.equal(0, code, err)
    return out
  end
  local function names(pattern, state)
    local out = {}
    local req = uv.fs_scandir((state or d.state) .. "/microvm")
    while req do
      local n = uv.fs_scandir_next(req)
      if not n then break end
      if n:match(pattern) then out[#out + 1] = n end
    end
    table.sort(out)
    return out
  end

  setup(function()
    vm_undo = vm.vm_setup(600000) -- root image builds and cold boots under TCG, on a loaded machine
    dir = helper.tmpdir()
    -- an HTTP server on the host's loopback, named allowed.test and denied.test
    local t = uv.new_tcp()
    assert(t:bind("127.0.0.1", 0))
    hp = t:getsockname().port
    t:close()
    assert(os.execute("mkdir -p " .. dir .. "/www && echo hello-vm-net > " .. dir .. "/www/index.html"))
    local hd, pid = uv.spawn("/bin/busybox", { args = { "httpd", "-f", "-p", "127.0.0.1:" .. hp, "-h", dir .. "/www" },
                                                stdio = { nil, nil, nil } }, function() end)
    assert(hd, pid)
    servers = { hd }
    oci.write(dir .. "/hosts", "127.0.0.1 allowed.test denied.test\n")
    local env = {}
    local pe = io.popen("env")
    for line in pe:lines() do if line:find("=", 1, true) then env[#env + 1] = line end end
    pe:close()
    env[#env + 1] = "TUPPER_NET_HOSTS=" .. dir .. "/hosts"
    env[#env + 1] = "TUPPER_VM_IMAGE_MAX=160M"
    d = helper.start_daemon(dir .. "/d", { pool = 0, env = env })
    c = assert(d.connect())
    import("vmimg:1", { base, middle, top }, CONFIG)
  end)

  teardown(function()
    if c then
      for _, s in ipairs((call("sandbox.list", {}) or { sandboxes = {} }).sandboxes) do
        call("sandbox.kill", { id = s.id })
      end
      c:close()
    end
    if d then assert.are.equal(0, d.stop()) end
    for _, hd in ipairs(servers or {}) do
      uv.process_kill(hd, "sigterm")
      hd:close()
    end
    if vm_undo then vm_undo() end
    helper.rmrf(dir)
    helper.drain()
  end)

  it("runs an imported image: whiteouts and opaque dirs applied, owners and the image config as on linux", function()
    local id = create({ image = "vmimg:1" })
    local r = run(id, "cat /etc/motd; ls /opt; ls /data; [ -e /opt/gone ] && echo gone-seen; " ..
      "[ -e /data/sub ] && echo sub-seen; cat /opt/keep/a")
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal("top\nkeep\nnew\na\n", r.stdout)
    -- Env, WorkingDir and User of the image; owners are the guest's own ids
    r = run(id, "echo $GREETING $(id -u):$(id -g) $(pwd) $HOME; stat -c '%u:%g %a' /home/app /tmp /bin/busybox")
    assert.are.equal("hello 1234:1235 /opt /home/app\n1234:1235 755\n0:0 1777\n0:0 755\n", r.stdout)
    -- Entrypoint + Cmd, through the CLI
    local code, out, err = helper.cli({ "--socket", d.socket, "run", "--backend", "microvm", "--image", "vmimg:1" })
    assert.are.equal(0, code, err)
    assert.are.equal("hello from /opt as 1234:1235 home /home/app\n", out)
    -- one root image for the image, shared by its VMs; writes stay in each VM
    assert.are.equal(1, #names("^root%-%x+%.ext4$"))
    assert(call("fs.write", { sandbox = id, path = "/opt/keep/a", data = "mine\n", encoding = "utf8" }))
    r = run(id, "cat /opt/keep/a")
    assert.are.equal("mine\n", r.stdout)
    local id2 = create({ image = "vmimg:1" })
    assert.are.equal("a\n", run(id2, "cat /opt/keep/a").stdout)
    assert.are.equal(1, #names("^root%-%x+%.ext4$"))
    assert.truthy(call("sandbox.kill", { id = id }).killed)
    assert.truthy(call("sandbox.kill", { id = id2 }).killed)
  end)

  it("runs two images' VMs side by side, each on its own files and its own snapshot", function()
    import("vmimg:2", { base, { { name = "etc/motd", data = "two\n" }, { name = "only-two", data = "2\n" } } })
    local a = create({ image = "vmimg:1" })
    local b = create({ image = "vmimg:2" })
    local ra = run(a, "cat /etc/motd; ls /; [ -e /only-two ] && echo two-seen")
    local rb = run(b, "cat /etc/motd; cat /only-two; [ -e /opt ] && echo opt-seen")
    assert.matches("^top\n", ra.stdout)
    assert.is_nil(ra.stdout:find("two-seen", 1, true))
    assert.are.equal("two\n2\n", rb.stdout)
    -- a snapshot per root image, never shared between images
    local roots = names("^root%-%x+%.ext4$")
    assert.are.equal(2, #roots)
    local snaps = names("^snap%-.*" .. shape_of(call, a))
    local ids = {}
    for _, s in ipairs(snaps) do ids[s:match("%-r(%x+)$")] = true end
    local n = 0
    for _ in pairs(ids) do n = n + 1 end
    assert.is_true(n >= 2, table.concat(snaps, " "))
    -- a later VM of each image starts from its own snapshot, on its own files
    local b2 = create({ image = "vmimg:2" })
    assert.are.equal("two\n", run(b2, "cat /etc/motd").stdout)
    local a2 = create({ image = "vmimg:1" })
    assert.are.equal("top\n", run(a2, "cat /etc/motd").stdout)
    for _, id in ipairs({ a, b, a2, b2 }) do assert.truthy(call("sandbox.kill", { id = id }).killed) end
    -- removing an image removes its root image and its snapshots
    local code, _, err = helper.cli({ "--socket", d.socket, "rmi", "vmimg:2" })
    assert.are.equal(0, code, err)
    local left = names("^root%-%x+%.ext4$")
    assert.are.equal(1, #left)
    assert.is_true(left[1] == roots[1] or left[1] == roots[2])
  end)

  it("builds one root image for creates of one new image at the same time", function()
    import("vmimg:3", { base, { { name = "three", data = "3\n" } } })
    local before = #names("^root%-%x+%.ext4$")
    local mark = #(helper.read_file(d.log) or "")
    local results = {}
    sync(function()
      local left = 2
      local done
      for i = 1, 2 do
        async.spawn(function()
          results[i] = { c:call("sandbox.create", { backend = "microvm", image = "vmimg:3" }) }
          left = left - 1
          if left == 0 and done then done() end
        end)
      end
      if left > 0 then async.wait(function(cb) done = cb end) end
    end)
    for i = 1, 2 do
      assert(results[i][1], results[i][2] and results[i][2].message)
      assert.are.equal("3\n", run(results[i][1].id, "cat /three").stdout)
    end
    assert.are.equal(before + 1, #names("^root%-%x+%.ext4$"))
    local n = 0
    for _ in helper.read_file(d.log):sub(mark + 1):gmatch("building the microVM image root%-") do n = n + 1 end
    assert.are.equal(1, n)
    for i = 1, 2 do assert.truthy(call("sandbox.kill", { id = results[i][1].id }).killed) end
  end)

  it("runs a recipe with setup on microVMs, its setup layer on top of the image", function()
    local src = [[
return recipe "vmsetup" {
  image = "vmimg:1",
  backend = "microvm",
  env = { FROM_RECIPE = "yes" },
  files = { ["/opt/placed"] = "placed\n" },
  setup = function(box)
    box:run("echo made-by-setup > /opt/made && rm /opt/keep/a && mkdir -p /data/x && echo x > /data/x/y")
  end,
}]]
    local sb, err = call("sandbox.create", { recipe = { name = "vmsetup.lua", source = src } })
    assert(sb, err and err.message)
    assert.are.equal("microvm", sb.backend)
    local want = "placed\nmade-by-setup\nno-a\nnew\nx\nyes\n"
    local probe = "cat /opt/placed /opt/made; [ -e /opt/keep/a ] || echo no-a; ls /data; echo $FROM_RECIPE"
    local r = run(sb.id, probe)
    assert.are.equal(want, r.stdout)
    -- a second create: the cached layer, the same root image
    local before = names("^root%-%x+%.ext4$")
    local sb2 = assert(call("sandbox.create", { recipe = { name = "vmsetup.lua", source = src } }))
    assert.are.equal(want, run(sb2.id, probe).stdout)
    assert.are.same(before, names("^root%-%x+%.ext4$"))
    assert.truthy(call("sandbox.kill", { id = sb.id }).killed)
    assert.truthy(call("sandbox.kill", { id = sb2.id }).killed)
  end)

  it("handles odd names and deep trees, and refuses what cannot fit with clear errors", function()
    -- odd names and a deep tree, laid out on the host and tarred by GNU tar
    local tree = dir .. "/odd"
    local odd = { "sp ace", "new\nline", "quote'\"", "-dash", "ünïcødé", "star*?[", ".hidden", ("n"):rep(255) }
    assert(os.execute("mkdir -p '" .. tree .. "/odd'"))
    for _, n in ipairs(odd) do oci.write(tree .. "/odd/" .. n, n) end
    local deep = tree .. "/deep"
    for _ = 1, 200 do deep = deep .. "/d" end
    assert(os.execute("mkdir -p '" .. deep .. "'"))
    oci.write(deep .. "/bottom", "bottom\n")
    assert(os.execute("tar -C '" .. tree .. "' --owner=0 --group=0 -cf '" .. dir .. "/odd.tar' odd deep"))
    local t = assert(io.open(dir .. "/odd.tar", "rb"))
    local oddtar = t:read("a")
    t:close()
    import("vmodd:1", { base, oddtar })
    local id = create({ image = "vmodd:1" })
    local r = run(id, "set -- /odd/* /odd/.[!.]*; echo $#; cat /odd/'sp ace' /odd/'quote'\\''\"' /odd/ünïcødé; echo; " ..
      "cat /deep" .. ("/d"):rep(200) .. "/bottom; find /deep | wc -l")
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal(#odd .. "\nsp acequote'\"ünïcødé\nbottom\n202\n", r.stdout:gsub("[ \t]+(%d)", "%1"))
    assert.truthy(call("sandbox.kill", { id = id }).killed)

    -- files larger than the root image limit (TUPPER_VM_IMAGE_MAX=160M here)
    local big = dir .. "/big"
    assert(os.execute("mkdir -p " .. big .. "/blobs/sha256"))
    local ltar = big .. "/layer.tar"
    oci.write(ltar, oci.header({ name = "zeros", size = 200 * 1048576 }))
    assert(os.execute(("head -c %d /dev/zero >> %s && head -c 1024 /dev/zero >> %s"):format(200 * 1048576, ltar, ltar)))
    local diff = oci.sha256(ltar)
    local gz = oci.gzip(ltar)
    local gd = oci.sha256(gz)
    assert(os.rename(gz, big .. "/blobs/sha256/" .. gd:sub(8)))
    local cfg = json.encode({ architecture = "amd64", os = "linux", config = { Env = { "PATH=/bin" } },
                              rootfs = { type = "layers", diff_ids = { diff } } })
    oci.write(big .. "/c", cfg)
    local cd = oci.sha256(big .. "/c")
    assert(os.rename(big .. "/c", big .. "/blobs/sha256/" .. cd:sub(8)))
    local m = json.encode({ schemaVersion = 2, mediaType = "application/vnd.oci.image.manifest.v1+json",
      config = { mediaType = "application/vnd.oci.image.config.v1+json", digest = cd, size = #cfg },
      layers = { { mediaType = "application/vnd.oci.image.layer.v1.tar+gzip", digest = gd,
                   size = uv.fs_stat(big .. "/blobs/sha256/" .. gd:sub(8)).size } } })
    oci.write(big .. "/m", m)
    local md = oci.sha256(big .. "/m")
    assert(os.rename(big .. "/m", big .. "/blobs/sha256/" .. md:sub(8)))
    oci.write(big .. "/index.json", json.encode({ schemaVersion = 2, manifests = { {
      mediaType = "application/vnd.oci.image.manifest.v1+json", digest = md, size = #m } } }))
    oci.write(big .. "/oci-layout", '{"imageLayoutVersion":"1.0.0"}')
    local code, _, ierr = helper.cli({ "--socket", d.socket, "import", big, "vmbig:1" })
    assert.are.equal(0, code, ierr)
    local _, err = call("sandbox.create", { backend = "microvm", image = "vmbig:1" })
    assert.is_not_nil(err)
    assert.matches("more than the microVM image limit of 160 MiB", err.message)
    -- nothing half-made is left, and the image works on the linux backend
    assert.are.same({}, names("^tmp%-"))
    -- (the daemon's btrfs disk pool is its one mount under its state dir)
    for line in io.lines("/proc/self/mountinfo") do
      local mp = line:match("^%S+ %S+ %S+ %S+ (%S+)")
      if mp and mp:find(d.state, 1, true) == 1 then assert.are.equal(d.state .. "/pool", mp) end
    end

    -- a recipe layer with a path longer than the kernel's PATH_MAX cannot
    -- be copied into a root image: a clear error, nothing left behind
    local src = [[
return recipe "vmdeep" {
  image = "vmimg:1",
  backend = "microvm",
  setup = function(box)
    -- built bottom up by renames: no step names a long path
    box:run("mkdir c; i=0; while [ $i -lt 1100 ]; do mkdir n && mv c n/dddd && mv n c || exit 1; i=$((i+1)); done",
            { cwd = "/tmp" })
  end,
}]]
    local _, rerr = call("sandbox.create", { recipe = { name = "vmdeep.lua", source = src } })
    assert.is_not_nil(rerr)
    assert.matches("a path is longer than 4096 bytes", rerr.message)
    assert.are.same({}, names("^tmp%-"))
  end)

  it("leaves nothing a later daemon trusts when it dies in the middle of a root image build", function()
    local dir2 = helper.tmpdir()
    local function mounts()
      local out = {}
      for line in io.lines("/proc/self/mountinfo") do
        local mp = line:match("^%S+ %S+ %S+ %S+ (%S+)")
        -- a live daemon's btrfs disk pool (d3 mounts the one d2 left) is not a build's
        if mp and mp:find(dir2, 1, true) == 1 and not mp:match("/state/pool$") then out[#out + 1] = mp end
      end
      return out
    end
    local d2, d3
    local ok, err = pcall(function()
      d2 = helper.start_daemon(dir2 .. "/d", { pool = 0 })
      -- 60 MB of random bytes: a build that takes seconds
      assert(os.execute("mkdir -p " .. dir2 .. "/big && head -c 60000000 /dev/urandom > " .. dir2 ..
        "/big/blob && tar -C " .. dir2 .. "/big --owner=0 --group=0 -cf " .. dir2 .. "/big.tar blob"))
      local t = assert(io.open(dir2 .. "/big.tar", "rb"))
      local bigtar = t:read("a")
      t:close()
      import("vmcrash:1", { base, bigtar }, nil, d2)
      bigtar = nil
      local c2 = assert(d2.connect())
      async.spawn(function() c2:call("sandbox.create", { backend = "microvm", image = "vmcrash:1" }) end)
      sync(function()
        for _ = 1, 30000 do
          if (helper.read_file(d2.log) or ""):find("building the microVM image", 1, true) then break end
          async.sleep(10)
        end
        async.sleep(300)
      end)
      d2.crash()
      c2:close()
      -- the dead daemon's half-made build: a temp dir, no root image
      assert.are.equal(1, #names("^tmp%-root%-", d2.state))
      assert.are.same({}, names("^root%-", d2.state))
      -- the next daemon's first microVM start removes it (unmounting what
      -- the build had mounted) and builds the root image afresh
      d3 = helper.start_daemon(dir2 .. "/d", { pool = 0 })
      local c3 = assert(d3.connect())
      local sb, cerr = helper.call(c3, "sandbox.create", { backend = "microvm", image = "vmcrash:1" })
      assert(sb, cerr and cerr.message)
      local r = sync(function() return helper.run(c3, sb.id, { "/bin/sh", "-c", "stat -c %s /blob" }) end)
      assert.are.equal("60000000\n", r.stdout)
      assert.are.same({}, names("^tmp%-", d3.state))
      assert.are.equal(1, #names("^root%-%x+%.ext4$", d3.state))
      assert.are.same({}, mounts())
      assert.truthy(helper.call(c3, "sandbox.kill", { id = sb.id }).killed)
      -- image prune --all takes the image, and its root image and snapshot with it
      local pr = assert(helper.call(c3, "image.prune", { all = true }))
      assert.are.same({ "docker.io/library/vmcrash:1" }, pr.refs)
      assert.are.same({}, names("^root%-", d3.state))
      assert.are.same({}, names("^snap%-.*%-r%x+$", d3.state))
      c3:close()
      assert.are.equal(0, d3.stop())
    end)
    -- whatever happened, no daemon and nothing mounted of this test stays:
    -- release stops d3, or restarts d2's state if it died with a VM there
    for _, mp in ipairs(mounts()) do os.execute("umount -l '" .. mp .. "'") end
    helper.release(d2, d3)
    helper.rmrf(dir2)
    assert(ok, err)
  end)

  it("relays the network from inside a guest: an allowed flow works, a refused one is refused", function()
    local id = create({ network = { allow = { "allowed.test", "127.0.0.1/32:" .. hp } } })
    local r = run(id, "cat /etc/resolv.conf; wget -q -O- http://allowed.test:" .. hp .. "/index.html")
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal("nameserver 127.0.0.1\nhello-vm-net\n", r.stdout)
    r = run(id, "wget -q -O- http://denied.test:" .. hp .. "/index.html")
    assert.are_not.equal(0, r.exit_code)
    assert.matches("403 Forbidden", r.stderr)
    r = run(id, "nslookup denied.test 127.0.0.1")
    assert.matches("NXDOMAIN", r.stdout)
    local log = assert(call("sandbox.network_log", { id = id })).entries
    local seen = {}
    for _, e in ipairs(log) do seen[e.action .. " " .. tostring(e.host)] = true end
    assert.is_true(seen["allow allowed.test"], json.encode(log))
    assert.is_true(seen["deny denied.test"], json.encode(log))
    assert.truthy(call("sandbox.kill", { id = id }).killed)
  end)
end)
