-- tupper pull against a real registry (Debian's docker-registry on
-- 127.0.0.1, images pushed with skopeo from OCI layouts this spec builds),
-- and against a scripted hostile one (fake_registry.lua).
local uv = require("luv")
local helper = require("helper")
local R = require("registry_helper")

local q = R.q

describe("tupper pull", function()
  local dir, reg, authreg, fake, d, env

  local function pull(ref, extra_env)
    return helper.cli({ "--socket", d.socket, "pull", ref }, { env = extra_env })
  end

  local function blobs()
    local out = {}
    local h = uv.fs_scandir(d.state .. "/images/blobs/sha256")
    while h do
      local name = uv.fs_scandir_next(h)
      if not name then break end
      out[name] = true
    end
    return out
  end

  local function count(t) local n = 0 for _ in pairs(t) do n = n + 1 end return n end

  setup(function()
    dir = helper.tmpdir()
    local layout = dir .. "/layout"
    R.must("mkdir -p " .. q(layout))
    -- busybox: one layer
    R.busybox_root(dir .. "/root1", { ["etc/hello"] = "hello from layer one\n" })
    local l1 = R.layer(layout, dir .. "/root1")
    local bb = R.image(layout, { l1 }, { cmd = { "/bin/sh" } })
    -- multi-layer with whiteouts: layer 2 deletes etc/hello and adds a file
    R.must(("mkdir -p %s/root2/etc %s/root2/data && touch %s/root2/etc/.wh.hello && echo two > %s/root2/data/two")
      :format(q(dir), q(dir), q(dir), q(dir)))
    local l2 = R.layer(layout, dir .. "/root2")
    R.must(("mkdir -p %s/root3/data && echo three > %s/root3/data/three && touch %s/root3/data/.wh..wh..opq")
      :format(q(dir), q(dir), q(dir)))
    local l3 = R.layer(layout, dir .. "/root3")
    local multi = R.image(layout, { l1, l2, l3 })
    -- multi-arch: amd64 (busybox) + arm64 (a different layer)
    R.must(("mkdir -p %s/rootarm && echo arm > %s/rootarm/arch"):format(q(dir), q(dir)))
    local la = R.layer(layout, dir .. "/rootarm")
    local arm = R.image(layout, { la }, { arch = "arm64" })
    local ix = R.index(layout, { bb, arm })
    local armonly = R.index(layout, { arm })
    R.finish_layout(layout, { busybox = bb, multi = multi, multiarch = ix, armonly = armonly })
    reg = R.start_registry(dir .. "/reg")
    R.push(layout, "busybox", reg.host, "test/busybox")
    R.push(layout, "multi", reg.host, "test/multi")
    R.push(layout, "multiarch", reg.host, "test/multiarch", { all = true })
    R.push(layout, "armonly", reg.host, "test/armonly", { all = true })
    R.push(layout, "busybox", reg.host, "test/firstuse")
    authreg = R.start_registry(dir .. "/authreg", { htpasswd = { alice = "s3cret" } })
    R.push(layout, "busybox", authreg.host, "private/busybox", { creds = "alice:s3cret" })
    fake = R.start_fake(dir, helper.ROOT)
    R.write(dir .. "/auth.json", ('{"auths": {"%s": {"auth": "%s"}, "http://%s/": {"auth": "%s"}}}'):format(
      authreg.host, helper.b64encode("alice:s3cret"), fake.host, helper.b64encode("bob:pw")))
    env = R.env({ "TUPPER_AUTH_FILE=" .. dir .. "/auth.json", "XDG_CONFIG_HOME=" .. dir .. "/xdg" })
    d = helper.start_daemon(dir .. "/d", { env = env })
    R.layout_dir = layout
    R.arm_layer, R.amd_manifest = la.digest, bb.digest
  end)

  teardown(function()
    if d then d.stop() end
    if reg then reg.stop() end
    if authreg then authreg.stop() end
    if fake then fake.stop() end
    helper.rmrf(dir)
    helper.drain()
  end)

  it("pulls a one-layer image and prints ref@digest", function()
    local code, out, err = pull(reg.host .. "/test/busybox:busybox")
    assert.are.equal(0, code, err)
    assert.truthy(out:match("^" .. reg.host:gsub("%p", "%%%0") .. "/test/busybox:busybox@sha256:%x+\n$"), out)
    local b = blobs()
    assert.are.equal(3, count(b)) -- layer, config, manifest
    for hex in pairs(b) do
      assert.are.equal(hex, R.sha256_file(d.state .. "/images/blobs/sha256/" .. hex))
    end
    local index = require("tupper.util.json").decode(helper.read_file(d.state .. "/images/index.json"))
    local m = index.manifests[1]
    assert.are.equal(reg.host .. "/test/busybox:busybox", m.annotations["org.opencontainers.image.ref.name"])
    assert.are.equal(out:match("@(sha256:%x+)"), m.digest)
  end)

  -- the names in partial/ (downloads kept for resuming)
  local function partials()
    local out = {}
    local h = uv.fs_scandir(d.state .. "/images/partial")
    while h do
      local name = uv.fs_scandir_next(h)
      if not name then break end
      out[name] = true
    end
    return out
  end
  local function no_partials() return next(partials()) == nil end

  it("pulls a multi-layer image: every layer verified into blobs/", function()
    local before = count(blobs())
    local code, out, err = pull(reg.host .. "/test/multi:multi")
    assert.are.equal(0, code, err)
    -- two new layers (layer one is shared with busybox), a config, a manifest
    assert.are.equal(before + 4, count(blobs()))
    assert.is_true(no_partials())
  end)

  local function run(image, cmd)
    return helper.cli({ "--socket", d.socket, "run", "--image", image, "--", "sh", "-c", cmd })
  end

  it("runs what it pulled: the layers stack, whiteouts and opaque dirs hide what they hide", function()
    local code, out, err = run(reg.host .. "/test/busybox:busybox", "cat /etc/hello")
    assert.are.equal(0, code, err)
    assert.are.equal("hello from layer one\n", out)
    code, out, err = run(reg.host .. "/test/multi:multi",
      "test ! -e /etc/hello && test ! -e /data/two && cat /data/three && test -x /bin/busybox && echo ok")
    assert.are.equal(0, code, err)
    assert.are.equal("three\nok\n", out)
  end)

  it("pulls on first use: sandbox.create of an image the store lacks", function()
    local ref = reg.host .. "/test/firstuse:busybox"
    assert.is_nil(require("registry_helper").sh("grep -q firstuse " .. q(d.state .. "/images/index.json")) or nil)
    local code, out, err = run(ref, "cat /etc/hello")
    assert.are.equal(0, code, err)
    assert.are.equal("hello from layer one\n", out)
    assert.truthy(helper.read_file(d.state .. "/images/index.json"):find("firstuse:busybox", 1, true))
    -- and a pull that fails says why in the create's error
    code, _, err = run(reg.host .. "/test/firstuse:nope", "true")
    assert.are_not.equal(0, code)
    assert.truthy(err:find("no such image or tag nope", 1, true), err)
  end)

  it("image.pull answers its documented fields and reports progress", function()
    local schema = require("tupper.wire.schema")
    local c = d.connect()
    local progress = {}
    c:on("image.progress", function(p) progress[#progress + 1] = p end)
    local ref = reg.host .. "/test/multi:multi"
    local res, err = helper.call(c, "image.pull", { ref = ref, progress = true })
    assert.truthy(res, err and err.message)
    for _, field in ipairs(schema.methods["image.pull"].result) do
      assert.is_not_nil(res[field], "image.pull lacks " .. field)
    end
    assert.are.equal(3, #res.layers)
    local sum = 0
    for _, l in ipairs(res.layers) do sum = sum + l.size end
    assert.is_true(res.size > sum) -- and the config
    local last = progress[#progress]
    assert.truthy(last, "no image.progress notification")
    assert.are.equal(ref, last.ref)
    assert.are.equal(res.size, last.total)
    assert.are.equal(last.total, last.done)
    -- an error carries its kind
    local bad, e = helper.call(c, "image.pull", { ref = reg.host .. "/test/nothing:here" })
    assert.is_nil(bad)
    assert.are.equal(-32006, e.code)
    assert.are.equal("not_found", e.data.kind)
    c:close()
  end)

  it("resolves an index to linux/amd64 and leaves the arm64 layers alone", function()
    local code, out, err = pull(reg.host .. "/test/multiarch:multiarch")
    assert.are.equal(0, code, err)
    local b = blobs()
    -- the index and the amd64 manifest are there; the arm64 layer is not
    local digest = out:match("@sha256:(%x+)")
    assert.truthy(digest, out)
    assert.is_true(b[digest], "the index itself is kept")
    assert.is_true(b[R.amd_manifest:sub(8)], "the amd64 manifest is kept")
    assert.is_nil(b[R.arm_layer:sub(8)], "the arm64 layer was not fetched")
  end)

  it("refuses an index with no linux/amd64 image, naming what it has", function()
    local code, _, err = pull(reg.host .. "/test/armonly:armonly")
    assert.are_not.equal(0, code)
    assert.truthy(err:find("no linux/amd64 image in the index (it has: linux/arm64)", 1, true), err)
  end)

  it("runs what it pulled (the image store): layers merged, an index resolved, pull on first use", function()
    local c = assert(d.connect())
    local function sh(id, script)
      return helper.sync(function() return helper.run(c, id, { "/bin/sh", "-c", script }) end)
    end
    -- layer 2 whites out etc/hello, layer 3 makes /data opaque over layer 2's
    local sb = assert(helper.call(c, "sandbox.create", { image = reg.host .. "/test/multi:multi" }))
    local r = sh(sb.id, "ls /data; [ -e /etc/hello ] && echo hello-seen; echo ok")
    assert.are.equal("three\nok\n", r.stdout, r.stderr)
    assert(helper.call(c, "sandbox.kill", { id = sb.id }))
    -- pulled as an index: the amd64 image runs, with the config's Cmd known
    sb = assert(helper.call(c, "sandbox.create", { image = reg.host .. "/test/multiarch:multiarch" }))
    assert.are.equal("hello from layer one\n", sh(sb.id, "cat /etc/hello").stdout)
    assert(helper.call(c, "sandbox.kill", { id = sb.id }))
    local info = assert(helper.call(c, "image.inspect", { ref = reg.host .. "/test/busybox:busybox" }))
    assert.are.same({ "/bin/sh" }, info.config.cmd)
    -- never pulled before: the create pulls it (credentials from auth.json)
    sb = assert(helper.call(c, "sandbox.create", { image = authreg.host .. "/private/busybox:busybox" }))
    assert.are.equal("hello from layer one\n", sh(sb.id, "cat /etc/hello").stdout)
    assert(helper.call(c, "sandbox.kill", { id = sb.id }))
    c:close()
  end)

  it("pulls by pinned digest, and refuses a digest the registry does not have", function()
    local _, out = pull(reg.host .. "/test/busybox:busybox")
    local digest = out:match("@(sha256:%x+)")
    local code, out2, err = pull(reg.host .. "/test/busybox@" .. digest)
    assert.are.equal(0, code, err)
    assert.truthy(out2:find(digest, 1, true))
    local wrong = "sha256:" .. ("0"):rep(64)
    code, _, err = pull(reg.host .. "/test/busybox@" .. wrong)
    assert.are_not.equal(0, code)
    assert.truthy(err:find("no such image or tag", 1, true), err)
  end)

  it("says so for an unknown tag or repository", function()
    local code, _, err = pull(reg.host .. "/test/busybox:nope")
    assert.are_not.equal(0, code)
    assert.truthy(err:find("no such image or tag nope", 1, true), err)
    code, _, err = pull(reg.host .. "/test/missing")
    assert.are_not.equal(0, code)
    assert.truthy(err:find("no such image or tag latest", 1, true), err)
  end)

  it("refuses a malformed reference before any request", function()
    for _, ref in ipairs({ "UPPER/case", "a@sha256:123", "a:b:c:d", "x@md5:" .. ("0"):rep(32), "a b" }) do
      local code, _, err = pull(ref)
      assert.are_not.equal(0, code)
      assert.truthy(err:find("invalid", 1, true), ref .. ": " .. err)
    end
  end)

  it("uses basic auth from auth.json, and reports refused credentials", function()
    local code, _, err = pull(authreg.host .. "/private/busybox:busybox")
    assert.are.equal(0, code, err)
    local good = helper.read_file(dir .. "/auth.json")
    R.write(dir .. "/auth.json", ('{"auths": {"%s": {"auth": "%s"}}}'):format(authreg.host,
      helper.b64encode("alice:wrong")))
    code, _, err = pull(authreg.host .. "/private/busybox:busybox")
    assert.are_not.equal(0, code)
    assert.truthy(err:find("refused the credentials", 1, true), err)
    R.write(dir .. "/auth.json", "{}")
    code, _, err = pull(authreg.host .. "/private/busybox:busybox")
    assert.are_not.equal(0, code)
    assert.truthy(err:find("wants a user name and password", 1, true), err)
    R.write(dir .. "/auth.json", good)
    -- the password never reaches the daemon's log
    assert.is_nil(helper.read_file(d.log):find("s3cret", 1, true))
  end)

  it("says the network is down when nothing listens", function()
    local port = R.free_port()
    local code, _, err = pull("127.0.0.1:" .. port .. "/x/y")
    assert.are_not.equal(0, code)
    assert.truthy(err:find("127.0.0.1:" .. port .. ": Failed to connect", 1, true), err)
  end)

  it("gets a bearer token through the WWW-Authenticate challenge", function()
    local code, _, err = pull(fake.host .. "/bearer:latest")
    assert.are.equal(0, code, err)
    local log = helper.read_file(dir .. "/fake-state/requests.log")
    assert.truthy(log:find("GET /token?service=fake&scope=repository%3Abearer%3Apull", 1, true), log)
  end)

  it("says what an anonymous pull of a private repository lacks", function()
    local good = helper.read_file(dir .. "/auth.json")
    R.write(dir .. "/auth.json", "{}")
    -- an anonymous token that does not open the repository
    local code, _, err = pull(fake.host .. "/private:latest")
    assert.are_not.equal(0, code)
    assert.truthy(err:find("refused access to private: it does not exist, or it needs credentials "
      .. "(none for " .. fake.host .. " in the auth file)", 1, true), err)
    -- a token service that wants credentials
    code, _, err = pull(fake.host .. "/bearer:latest")
    assert.are_not.equal(0, code)
    assert.truthy(err:find("gives no anonymous access to bearer", 1, true), err)
    R.write(dir .. "/auth.json", good)
  end)

  it("gets a new token when the one it had expires during the pull", function()
    local code, _, err = pull(fake.host .. "/expire:latest")
    assert.are.equal(0, code, err)
    local log = helper.read_file(dir .. "/fake-state/requests.log")
    local _, n = log:gsub("GET /token%?service=fake&scope=repository%%3Aexpire", "")
    assert.are.equal(2, n)
  end)

  describe("with stall_seconds = 1", function()
    before_each(function()
      R.must("mkdir -p " .. q(dir .. "/xdg/tupper"))
      R.write(dir .. "/xdg/tupper/registries.json", '{"stall_seconds": 1}')
    end)
    after_each(function() os.remove(dir .. "/xdg/tupper/registries.json") end)

    it("ends a stalled transfer and resumes it with a Range request", function()
      local code, _, err = pull(fake.host .. "/stall:again")
      assert.are.equal(0, code, err)
      local log = helper.read_file(dir .. "/fake-state/requests.log")
      assert.truthy(log:find("/v2/stall/blobs/sha256:%x+ bytes=%d+%-"), log)
    end)

    it("gives up on a registry that drips for ever, retries bounded", function()
      local code, _, err = pull(fake.host .. "/drip:latest")
      assert.are_not.equal(0, code)
      assert.truthy(err:find("too slow", 1, true), err)
      local log = helper.read_file(dir .. "/fake-state/requests.log")
      local _, n = log:gsub("GET /v2/drip/blobs/", "")
      assert.are.equal(4, n) -- the config, then the layer: one try and two retries
      -- a network failure keeps what arrived, for the next pull to resume
      assert.is_false(no_partials())
    end)
  end)

  it("resumes a pull killed mid-blob with a Range request", function()
    local d2, d3 = helper.start_daemon(dir .. "/d2", { env = env }), nil
    local exited
    local h = uv.spawn(helper.BIN, { args = { "--socket", d2.socket, "pull", fake.host .. "/stall:latest" } },
      function(c) exited = c end)
    -- the pull's client and the daemons go whatever the assertions say
    finally(function()
      if exited == nil then uv.process_kill(h, "sigkill") end
      if not h:is_closing() then h:close() end
      helper.release(d2, d3)
    end)
    local half
    helper.sync(function()
      -- until the registry sent half the layer and tupper wrote all of it
      while true do
        local log = helper.read_file(dir .. "/fake-state/requests.log") or ""
        half = tonumber(log:match("stalled (%d+)"))
        local h2 = half and uv.fs_scandir(d2.state .. "/images/partial")
        local name = h2 and uv.fs_scandir_next(h2)
        local st = name and uv.fs_stat(d2.state .. "/images/partial/" .. name)
        if st and st.size == half then return end
        require("tupper.util.async").sleep(20)
      end
    end)
    d2.crash()
    helper.sync(function() while not exited do require("tupper.util.async").sleep(5) end end)
    h:close()
    assert.are_not.equal(0, exited)
    d3 = helper.start_daemon(dir .. "/d2", { env = env })
    local code, _, err = helper.cli({ "--socket", d3.socket, "pull", fake.host .. "/stall:latest" })
    d3.stop()
    assert.are.equal(0, code, err)
    local log = helper.read_file(dir .. "/fake-state/requests.log")
    assert.truthy(log:find("/v2/stall/blobs/sha256:%x+ bytes=" .. half .. "%-"), log)
  end)

  it("shares one download between two pulls of one reference at once", function()
    local async = require("tupper.util.async")
    local c = d.connect()
    local results = {}
    helper.sync(function()
      local n = 0
      local done
      for i = 1, 2 do
        async.spawn(function()
          results[i] = table.pack(c:call("image.pull", { ref = fake.host .. "/slow:latest" }))
          n = n + 1
          if n == 2 and done then done() end
        end)
      end
      if n < 2 then async.wait(function(cb) done = cb end) end
    end)
    c:close()
    assert.truthy(results[1][1], results[1][2] and results[1][2].message)
    assert.truthy(results[2][1], results[2][2] and results[2][2].message)
    assert.are.equal(results[1][1].digest, results[2][1].digest)
    local log = helper.read_file(dir .. "/fake-state/requests.log")
    local _, manifests = log:gsub("GET /v2/slow/manifests/latest", "")
    local _, blobs_got = log:gsub("GET /v2/slow/blobs/", "")
    assert.are.equal(1, manifests)
    assert.are.equal(2, blobs_got) -- the config and the layer, once each
  end)

  it("draws a progress bar on a terminal, and none on a pipe", function()
    -- on a pipe (helper.cli): the result line alone
    local code, out, err = pull(fake.host .. "/slow-pipe:latest")
    assert.are.equal(0, code, err)
    assert.are.equal("", err)
    -- on a pty: a private tmux server in the temp dir
    local tdir = dir .. "/pty"
    R.must("mkdir -p " .. q(tdir))
    local tmux = "env -u TMUX TERM=xterm tmux -S " .. q(tdir .. "/tmux.sock") .. " -f /dev/null"
    local cmd = ("%s --socket %s pull %s/slow-bar:latest; echo exit=$?; sleep 60"):format(
      q(helper.BIN), q(d.socket), fake.host)
    finally(function() R.sh(tmux .. " kill-server") end)
    R.must(tmux .. " new-session -d -s pull -x 150 -y 20 " .. q(cmd))
    local text
    local deadline = uv.now() + 20000
    repeat
      uv.sleep(50)
      uv.update_time()
      text = select(2, R.sh(tmux .. " capture-pane -p -t pull"))
    until text:find("exit=%d") or uv.now() > deadline
    R.sh(tmux .. " kill-server")
    assert.truthy(text:find("exit=0", 1, true), text)
    assert.truthy(text:find("slow-bar:latest [", 1, true), text)
    assert.truthy(text:find("] [%d.]+ [KM]?i?B / [%d.]+ [KM]?i?B 100%%"), text)
    assert.truthy(text:find("/slow%-bar:latest@sha256:%x+"), text)
  end)

  describe("over https", function()
    -- 127.0.0.2 is loopback, but not among the plain-http registries
    local certs, tlsreg, redirect
    setup(function()
      certs = R.make_certs(dir .. "/certs", "127.0.0.2")
      tlsreg = R.start_registry(dir .. "/tlsreg", { host = "127.0.0.2", tls = certs })
      R.push(R.layout_dir, "busybox", tlsreg.host, "tls/busybox")
      redirect = R.start_tls_redirect(dir, helper.ROOT, "127.0.0.2", certs, "http://" .. fake.host)
    end)
    teardown(function()
      if tlsreg then tlsreg.stop() end
      if redirect then redirect.stop() end
      os.remove(dir .. "/xdg/tupper/registries.json")
    end)

    it("refuses a certificate the system store does not trust", function()
      local code, _, err = pull(tlsreg.host .. "/tls/busybox:busybox")
      assert.are_not.equal(0, code)
      assert.truthy(err:find("certificate", 1, true), err)
    end)

    it("trusts the CA file registries.json names", function()
      R.must("mkdir -p " .. q(dir .. "/xdg/tupper"))
      R.write(dir .. "/xdg/tupper/registries.json", ('{"ca_file": "%s"}'):format(certs.ca))
      local code, out, err = pull(tlsreg.host .. "/tls/busybox:busybox")
      assert.are.equal(0, code, err)
      assert.truthy(out:find("@sha256:", 1, true))
    end)

    it("refuses a redirect from https down to http", function()
      R.must("mkdir -p " .. q(dir .. "/xdg/tupper"))
      R.write(dir .. "/xdg/tupper/registries.json", ('{"ca_file": "%s"}'):format(certs.ca))
      local code, _, err = pull(redirect.host .. "/ok:latest")
      assert.are_not.equal(0, code)
      assert.truthy(err:find("https never goes down to http", 1, true), err)
    end)
  end)

  describe("against a hostile registry", function()
    local cases = {
      { "huge", "exceeds" },
      { "hugeheaders", "headers exceed" },
      { "loop", "redirects" },
      { "schema1", "schema 1" },
      { "weird", "unsupported manifest media type" },
      { "liar", "more than the 1000 bytes" },
      { "short", "were declared" },
      { "forever", "more than the" },
      { "wrongdigest", "digest mismatch" },
    }
    for _, c in ipairs(cases) do
      it(c[1] .. ": refused, nothing half-written in the store", function()
        local before, before_partial = blobs(), partials()
        local code, _, err = pull(fake.host .. "/" .. c[1] .. ":latest")
        assert.are_not.equal(0, code)
        assert.truthy(err:find(c[2], 1, true), c[1] .. ": " .. err)
        local after = blobs()
        -- the config may be in (it was good); the layer never is
        for hex in pairs(after) do
          assert.is_true(before[hex] or hex ~= "" and R.sha256_file(d.state .. "/images/blobs/sha256/" .. hex) == hex)
        end
        for name in pairs(partials()) do
          assert.is_true(before_partial[name], "a liar's partial file was kept: " .. name)
        end
      end)
    end

    it("a pinned digest the registry's manifest does not match", function()
      local code, _, err = pull(fake.host .. "/ok@sha256:" .. ("1"):rep(64))
      assert.are_not.equal(0, code)
      assert.truthy(err:find("manifest digest mismatch", 1, true), err)
    end)

    it("follows a redirect for a blob (as registries do to their CDN)", function()
      local code, _, err = pull(fake.host .. "/redirect-blob:latest")
      assert.are.equal(0, code, err)
    end)
  end)
end)
