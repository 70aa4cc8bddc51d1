-- Filesystem snapshots and fork on the linux backend (docs/snapshots.md).
local uv = require("luv")
local helper = require("helper")

local sync, call = helper.sync, helper.call
local run, read, write, fails, entries = helper.run_sync, helper.read_text, helper.write_text, helper.fails, helper.entries

describe("snapshots", function()
  local d, c

  setup(function()
    d = helper.start_daemon(nil, { pool = 0 })
    c = assert(d.connect())
  end)
  teardown(function()
    if c then helper.kill_sandboxes(c); c:close() end
    if d then d.stop() end
    helper.drain()
  end)

  it("captures a running box's files at that instant; the box keeps running and writing", function()
    local id = assert(call(c, "sandbox.create", { env = { FOO = "bar" } })).id
    write(c, id, "/data.txt", "before")
    -- a process holding a file open for writing across the snapshot
    local bg = assert(call(c, "process.start", { sandbox = id,
      argv = { "sh", "-c", "exec 3>>/log.txt; i=0; while [ $i -lt 100000 ]; do echo $i >&3; i=$((i+1)); sleep 0.05; done" } }))
    local snap = assert(call(c, "sandbox.snapshot", { id = id, name = "first" }))
    assert.truthy(snap.id:match("^s%x+$"))
    assert.are.same({ "first" }, snap.names)
    assert.are.equal(id, snap.sandbox)
    -- what the box wrote over its image (a pool snapshot), or its whole root (a copy)
    assert.truthy(type(snap.size) == "number" and snap.size > 0, tostring(snap.size))
    write(c, id, "/data.txt", "after")
    -- the writer is still alive and its file still grows on the parent
    local n1 = #read(c, id, "/log.txt")
    assert.is_true(sync(function()
      return helper.poll(function()
        local r = c:call("fs.read", { sandbox = id, path = "/log.txt", encoding = "utf8" })
        return r and #r.data > n1
      end, nil, 50)
    end), "the writer's file grows on")
    assert.are.equal("after", read(c, id, "/data.txt"))
    assert(call(c, "process.signal", { sandbox = id, pid = bg.pid, signal = "KILL" }))

    -- a create from it (by name) sees the files as they were, and the env
    local child = assert(call(c, "sandbox.create", { snapshot = "first" })).id
    assert.are.equal("before", read(c, child, "/data.txt"))
    assert.are.equal("bar\n", run(c, child, { "sh", "-c", "echo $FOO" }).stdout)
    write(c, child, "/data.txt", "child")
    assert.are.equal("after", read(c, id, "/data.txt"))

    local list = assert(call(c, "snapshot.list", {})).snapshots
    assert.are.equal(1, #list)
    assert.are.same({ child }, list[1].sandboxes)
    -- refused while used, by name or id
    assert.truthy(fails(c, "snapshot.delete", { id = "first" }):find("in use by sandbox " .. child, 1, true))
    assert.truthy(call(c, "sandbox.kill", { id = child }).killed)
    assert.truthy(call(c, "sandbox.kill", { id = id }).killed)
    assert.is_true(assert(call(c, "snapshot.delete", { id = snap.id })).deleted)
    assert.are.equal(0, #assert(call(c, "snapshot.list", {})).snapshots)
    -- its layer went with it
    for _, name in ipairs(entries(d.state .. "/layers")) do
      local info = helper.read_file(d.state .. "/layers/" .. name .. "/layer.json") or ""
      assert.is_nil(info:find('"snapshot"', 1, true), "snapshot layer left: " .. name)
    end
  end)

  it("forks: each fork sees the parent's files, writes on its own, keeps env, limits and network rules", function()
    local net = { allow = { "example.com:443" } }
    local id = assert(call(c, "sandbox.create", { env = { WHO = "parent" }, network = net,
      limits = { memory = 256 * 1048576, pids = 200 } })).id
    write(c, id, "/shared.txt", "from parent")
    local r = assert(call(c, "sandbox.fork", { id = id, count = 3 }))
    assert.are.equal(3, #r.sandboxes)
    local ids = {}
    for i, sb in ipairs(r.sandboxes) do
      ids[i] = sb.id
      assert.are.equal(256 * 1048576, sb.limits.memory)
      assert.are.equal(200, sb.limits.pids)
      assert.are.same({ "example.com:443" }, sb.network.allow)
      assert.are.equal("from parent", read(c, sb.id, "/shared.txt"))
      assert.are.equal("parent\n", run(c, sb.id, { "sh", "-c", "echo $WHO" }).stdout)
      write(c, sb.id, "/own.txt", "fork " .. i)
    end
    for i, fid in ipairs(ids) do assert.are.equal("fork " .. i, read(c, fid, "/own.txt")) end
    assert.is_nil(read(c, id, "/own.txt"))
    -- the snapshot is kept while a fork uses it
    assert.truthy(fails(c, "snapshot.delete", { id = r.snapshot }):find("in use", 1, true))
    for _, fid in ipairs(ids) do call(c, "sandbox.kill", { id = fid }) end
    call(c, "sandbox.kill", { id = id })
    assert(call(c, "snapshot.delete", { id = r.snapshot }))
  end)

  it("refuses bad names, bad counts, unknown ids, and a pause mid-snapshot is not possible", function()
    local id = assert(call(c, "sandbox.create", {})).id
    for _, bad in ipairs({ "..", "a/b", "x..y", "nul\0x", "tab\tx", "del\127", "." }) do
      local msg = fails(c, "sandbox.snapshot", { id = id, name = bad })
      assert.truthy(msg:find("snapshot name", 1, true) or msg:find("NUL", 1, true), bad .. ": " .. msg)
    end
    assert.truthy(fails(c, "sandbox.fork", { id = id, count = 0 }):find("count", 1, true))
    assert.truthy(fails(c, "sandbox.fork", { id = id, count = 1000000 }):find("count", 1, true))
    assert.truthy(fails(c, "sandbox.snapshot", { id = "nosuchbox" }):find("no sandbox", 1, true))
    assert.truthy(fails(c, "sandbox.create", { snapshot = "nosuch" }):find("no snapshot", 1, true))
    assert.truthy(fails(c, "snapshot.delete", { id = "nosuch" }):find("no snapshot", 1, true))
    -- one name, one snapshot
    local s1 = assert(call(c, "sandbox.snapshot", { id = id, name = "dup" }))
    assert.truthy(fails(c, "sandbox.snapshot", { id = id, name = "dup" }):find("already named", 1, true))
    -- a paused box: the snapshot is taken, and the box stays paused
    write(c, id, "/p.txt", "paused")
    assert(call(c, "sandbox.pause", { id = id }))
    local s2 = assert(call(c, "sandbox.snapshot", { id = id }))
    assert.are.equal("paused", assert(call(c, "sandbox.get", { id = id })).state)
    assert(call(c, "sandbox.resume", { id = id }))
    local child = assert(call(c, "sandbox.create", { snapshot = s2.id })).id
    assert.are.equal("paused", read(c, child, "/p.txt"))
    call(c, "sandbox.kill", { id = child })
    call(c, "sandbox.kill", { id = id })
    assert(call(c, "snapshot.delete", { id = s1.id }))
    assert(call(c, "snapshot.delete", { id = s2.id }))
  end)

  it("refuses a pause or resume mid-snapshot, and a kill mid-snapshot kills the box and leaves no snapshot", function()
    local id = assert(call(c, "sandbox.create", {})).id
    assert.are.equal(0, run(c, id, { "dd", "if=/dev/zero", "of=/big", "bs=1M", "count=300" }).exit_code)
    local before = #assert(call(c, "snapshot.list", {})).snapshots
    -- the snapshot's handler freezes before it yields to the copy: the
    -- pause sent right after it finds it snapshotting
    local done
    c.conn:send({ jsonrpc = "2.0", id = 990001, method = "sandbox.snapshot", params = { id = id } })
    local msg = fails(c, "sandbox.pause", { id = id })
    assert.truthy(msg:find("being snapshotted", 1, true), msg)
    msg = fails(c, "sandbox.snapshot", { id = id })
    assert.truthy(msg:find("being snapshotted", 1, true), msg)
    assert.truthy(assert(call(c, "sandbox.kill", { id = id })).killed)
    assert.are.equal(0, helper.box_pids(id))
    -- the copy of a box that went is not kept
    sync(function()
      done = helper.poll(function()
        for _, name in ipairs(entries(d.state .. "/layers")) do
          if name:match("^tmp%-") then return false end
        end
        return true
      end)
    end)
    assert.is_true(done)
    assert.are.equal(before, #assert(call(c, "snapshot.list", {})).snapshots)
  end)

  it("refuses to snapshot or fork a sandbox bound by a policy with hooks (fail closed)", function()
    local pol = { source = "return policy { on_file = function(op, path) return true end }", name = "/p/tupper.lua" }
    local id = assert(call(c, "sandbox.create", { policy = pol })).id
    local before = #assert(call(c, "snapshot.list", {})).snapshots
    assert.truthy(fails(c, "sandbox.snapshot", { id = id }):find("polic", 1, true))
    assert.truthy(fails(c, "sandbox.fork", { id = id, count = 1 }):find("polic", 1, true))
    assert.are.equal(before, #assert(call(c, "snapshot.list", {})).snapshots)
    call(c, "sandbox.kill", { id = id })
  end)

  it("works from the CLI: snapshot, snapshot ls, create --snapshot, fork, snapshot rm", function()
    local env = { "TUPPER_SOCKET=" .. d.socket, "PATH=" .. os.getenv("PATH") }
    local id = assert(call(c, "sandbox.create", {})).id
    write(c, id, "/cli.txt", "cli")
    local code, out, err = helper.cli({ "snapshot", id, "clisnap" }, { env = env })
    assert.are.equal(0, code, err)
    local sid = out:match("^(s%x+)\n$")
    assert.truthy(sid, out)
    code, out = helper.cli({ "snapshot", "ls" }, { env = env })
    assert.are.equal(0, code)
    assert.truthy(out:find("clisnap", 1, true))
    code, out, err = helper.cli({ "create", "--snapshot", "clisnap" }, { env = env })
    assert.are.equal(0, code, err)
    local child = out:match("^(%S+)\n$")
    assert.are.equal("cli", read(c, child, "/cli.txt"))
    code, out, err = helper.cli({ "fork", "-n", "2", id }, { env = env })
    assert.are.equal(0, code, err)
    local forks = {}
    for line in out:gmatch("[^\n]+") do forks[#forks + 1] = line end
    assert.are.equal(2, #forks)
    code, _, err = helper.cli({ "fork", "-n", "0", id }, { env = env })
    assert.are_not.equal(0, code)
    code, _, err = helper.cli({ "snapshot", "rm", "clisnap" }, { env = env })
    assert.are_not.equal(0, code)
    assert.truthy(err:find("in use", 1, true))
    for _, f in ipairs(forks) do call(c, "sandbox.kill", { id = f }) end
    call(c, "sandbox.kill", { id = child })
    code, _, err = helper.cli({ "snapshot", "rm", "clisnap" }, { env = env })
    assert.are.equal(0, code, err)
    call(c, "sandbox.kill", { id = id })
    for _, s in ipairs(assert(call(c, "snapshot.list", {})).snapshots) do call(c, "snapshot.delete", { id = s.id }) end
  end)
end)

describe("snapshots from the Lua SDK (and so the REPL)", function()
  local d
  local tupper = require("tupper.sdk")

  setup(function() d = helper.sdk_daemon(tupper) end)
  teardown(function()
    helper.sdk_teardown(tupper, d, function()
      for _, s in ipairs(tupper.snapshots()) do tupper.delete_snapshot(s.id) end
    end)
    helper.drain()
  end)

  it("box:snapshot, tupper.create{snapshot}, box:fork, tupper.snapshots, tupper.delete_snapshot", function()
    local box = tupper.create()
    box:run("echo lua > /tmp/l.txt")
    local snap = box:snapshot("lua-snap")
    assert.are.same({ "lua-snap" }, snap.names)
    local child = tupper.create({ snapshot = "lua-snap" })
    assert.are.equal("lua\n", child:run("cat /tmp/l.txt").stdout)
    local forks, sid = box:fork(2)
    assert.are.equal(2, #forks)
    assert.truthy(sid:match("^s%x+$"))
    for _, f in ipairs(forks) do assert.are.equal("lua\n", f:run("cat /tmp/l.txt").stdout) end
    assert.are.equal(2, #tupper.snapshots())
    assert.has_error(function() tupper.delete_snapshot("lua-snap") end)
    child:kill()
    assert.is_true(tupper.delete_snapshot("lua-snap"))
    for _, f in ipairs(forks) do f:kill() end
    assert.is_true(tupper.delete_snapshot(sid))
    box:kill()
  end)
end)

describe("a daemon killed during a snapshot or a fork", function()
  local r = helper.restarts()
  local d

  setup(r.setup)
  after_each(r.after_each)
  teardown(r.teardown)

  it("leaves no half snapshot visible and nothing of it on disk after the restart (a copy)", function()
    local c
    d, c = r.start()
    -- no disk cap: the upper dir is not on the btrfs pool, the snapshot copies
    local id = assert(call(c, "sandbox.create", { limits = { disk = 0 } })).id
    local kept = assert(call(c, "sandbox.snapshot", { id = id, name = "kept" }))
    -- enough files that the copy takes a while, then SIGKILL mid-copy
    assert(run(c, id, { "sh", "-c", "mkdir /many && cd /many && i=0; while [ $i -lt 3000 ]; do echo $i > f$i; i=$((i+1)); done" }).exit_code == 0)
    c.conn:send({ jsonrpc = "2.0", id = 99, method = "sandbox.snapshot", params = { id = id, name = "half" } })
    -- the copy has begun when a tmp-* dir shows in the layer store
    sync(function()
      for _ = 1, 2000 do
        for _, name in ipairs(entries(d.state .. "/layers")) do
          if name:match("^tmp%-") then return end
        end
        require("tupper.util.async").sleep(1)
      end
    end)
    d, c = r.restart(c)
    local list = assert(call(c, "snapshot.list", {})).snapshots
    assert.are.equal(1, #list)
    assert.are.equal(kept.id, list[1].id)
    -- frozen when the daemon died, and recorded as paused: re-adopted as
    -- paused, and resume thaws it
    local info = call(c, "sandbox.get", { id = id })
    assert(info, "not re-adopted: " .. tostring(helper.read_file(d.log)))
    assert.are.equal("paused", info.state)
    assert(call(c, "sandbox.resume", { id = id }))
    assert.are.equal("alive\n", run(c, id, { "echo", "alive" }).stdout)
    -- on disk: the kept snapshot's layer and record, no tmp dir, no other
    local snaps, tmps = 0, 0
    for _, name in ipairs(entries(d.state .. "/layers")) do
      if name:match("^tmp%-") then tmps = tmps + 1 end
      local info2 = helper.read_file(d.state .. "/layers/" .. name .. "/layer.json") or ""
      if info2:find('"snapshot"', 1, true) then snaps = snaps + 1 end
    end
    assert.are.equal(0, tmps)
    assert.are.equal(1, snaps)
    assert.are.same({ kept.id .. ".json" }, entries(d.state .. "/snapshots"))
    call(c, "sandbox.kill", { id = id })
    assert(call(c, "snapshot.delete", { id = kept.id }))
    c:close()
    d.stop()
  end)

  it("mid-fork leaves a whole snapshot and whole forks, re-adopted, and nothing else", function()
    local c
    d, c = r.start()
    local id = assert(call(c, "sandbox.create", {})).id
    c.conn:send({ jsonrpc = "2.0", id = 99, method = "sandbox.fork", params = { id = id, count = 8 } })
    -- killed once the first fork has its record
    local function records()
      local n = 0
      for _, name in ipairs(entries(d.state .. "/boxes")) do
        if name:match("%.json$") then n = n + 1 end
      end
      return n
    end
    sync(function()
      for _ = 1, 3000 do
        if records() >= 2 then return end
        require("tupper.util.async").sleep(2)
      end
    end)
    d, c = r.restart(c)
    local snaps = assert(call(c, "snapshot.list", {})).snapshots
    assert.are.equal(1, #snaps)
    local forks = {}
    for _, sb in ipairs(assert(call(c, "sandbox.list", {})).sandboxes) do
      if sb.id ~= id then forks[#forks + 1] = sb.id end
    end
    assert.truthy(#forks >= 1 and #forks < 8, #forks .. " forks")
    for _, f in ipairs(forks) do
      assert.are.equal("ok\n", run(c, f, { "echo", "ok" }).stdout)
    end
    assert.truthy(fails(c, "snapshot.delete", { id = snaps[1].id }):find("in use", 1, true))
    for _, f in ipairs(forks) do call(c, "sandbox.kill", { id = f }) end
    call(c, "sandbox.kill", { id = id })
    assert(call(c, "snapshot.delete", { id = snaps[1].id }))
    for _, name in ipairs(entries(d.state .. "/layers")) do
      assert.is_nil(name:match("^tmp%-"), name)
    end
    c:close()
    d.stop()
  end)
end)

-- The btrfs pool (docs/limits.md "Where a box's writes go"): skipped, with
-- the reason, where the daemon runs without one (no btrfs, no mkfs.btrfs).
local function pool_of(d)
  local log = helper.read_file(d.log) or ""
  if log:find("disk pool: btrfs at", 1, true) then return d.state .. "/pool" end
  return nil, log:match("disk pool: none %(([^\n]*)%)") or "no disk pool line in the log"
end

local function record(d, sid)
  return require("tupper.util.json").decode(assert(helper.read_file(d.state .. "/snapshots/" .. sid .. ".json")))
end

-- bytes used on the filesystem at path, after a sync of it
local function used(path)
  os.execute("sync -f '" .. path .. "'")
  local st = assert(uv.fs_statfs(path))
  return (st.blocks - st.bfree) * st.bsize
end

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return ok, out
end

describe("snapshots on the btrfs pool", function()
  local d, c, pool, why

  setup(function()
    d = helper.start_daemon(nil, { pool = 0 })
    c = assert(d.connect())
    pool, why = pool_of(d)
  end)
  teardown(function()
    if c then helper.kill_sandboxes(c); c:close() end
    if d then d.stop() end
    helper.drain()
  end)

  it("a snapshot of a box that wrote 256 MiB is a read-only subvolume: nothing is copied", function()
    if not pool then return pending("no btrfs pool: " .. why) end
    -- an image of the store (the default one is not), to see it pinned
    assert(call(c, "image.import", { path = d.state .. "/images/default/rootfs", ref = "pinned-base" }))
    local id = assert(call(c, "sandbox.create", { image = "pinned-base" })).id
    -- the box's upper dir is its own subvolume, bound in its mount namespace
    local sv = pool .. "/boxes/" .. id
    assert.are.equal(256, assert(uv.fs_stat(sv)).ino)
    assert.are.equal(0, run(c, id, { "dd", "if=/dev/zero", "of=/big", "bs=1M", "count=256" }).exit_code)
    write(c, id, "/mark.txt", "v1")
    local pool_before, layers_before = used(pool), #entries(d.state .. "/layers")
    local snap = assert(call(c, "sandbox.snapshot", { id = id, name = "big" }))
    local rec = record(d, snap.id)
    assert.is_string(rec.pool_snap)
    assert.is_nil(rec.layer)
    local sdir = pool .. "/snaps/" .. rec.pool_snap
    -- the image it stacks on is kept from prune while it lives
    local function pinned()
      return (helper.read_file(d.state .. "/images/pins.json") or ""):find("snapshot " .. snap.id, 1, true) ~= nil
    end
    assert.is_string(rec.image_digest)
    assert.is_true(pinned(), "the image is not pinned")
    -- a subvolume root (inode 256) that refuses writes: read-only
    assert.are.equal(256, assert(uv.fs_stat(sdir)).ino)
    local wok = uv.fs_open(sdir .. "/upper/new", "w", 420)
    assert.is_nil(wok, "a write into the snapshot succeeded")
    assert.are.equal(256 * 1048576, assert(uv.fs_stat(sdir .. "/upper/big")).size)
    -- neither the pool nor the layer store took the 256 MiB again
    assert.truthy(used(pool) - pool_before < 32 * 1048576, ("pool grew by %d"):format(used(pool) - pool_before))
    assert.are.equal(layers_before, #entries(d.state .. "/layers"))
    -- a sandbox from it: the snapshot's upper over the box's own lower dirs
    local child = assert(call(c, "sandbox.create", { snapshot = "big" })).id
    assert.are.equal("v1", read(c, child, "/mark.txt"))
    assert.are.equal(tostring(256 * 1048576) .. "\n", run(c, child, { "stat", "-c", "%s", "/big" }).stdout)
    -- and each writes on its own afterwards
    write(c, id, "/mark.txt", "parent")
    write(c, child, "/mark.txt", "child")
    assert.are.equal("parent", read(c, id, "/mark.txt"))
    assert.are.equal("child", read(c, child, "/mark.txt"))
    assert.are.equal("v1", helper.read_file(sdir .. "/upper/mark.txt"))
    -- a snapshot of the child stacks on the first: that one is kept while it lives
    local snap2 = assert(call(c, "sandbox.snapshot", { id = child }))
    local grand = assert(call(c, "sandbox.create", { snapshot = snap2.id })).id
    assert.are.equal("child", read(c, grand, "/mark.txt"))
    call(c, "sandbox.kill", { id = grand })
    call(c, "sandbox.kill", { id = child })
    -- a killed box's subvolume goes with it
    call(c, "sandbox.kill", { id = id })
    assert.is_true(helper.path_gone(sv), sv)
    -- the image it stacks on outlives image remove and prune (the pin)
    assert(call(c, "image.remove", { ref = "pinned-base" }))
    assert(call(c, "image.prune", { all = true }))
    child = assert(call(c, "sandbox.create", { snapshot = snap.id })).id
    assert.are.equal("v1", read(c, child, "/mark.txt"))
    assert.are.equal(0, run(c, child, { "test", "-x", "/bin/sh" }).exit_code)
    call(c, "sandbox.kill", { id = child })
    assert.truthy(fails(c, "snapshot.delete", { id = snap.id }):find("in use", 1, true))
    assert(call(c, "snapshot.delete", { id = snap2.id }))
    assert(call(c, "snapshot.delete", { id = snap.id }))
    assert.is_false(pinned())
    -- its subvolume went with it
    assert.is_nil(uv.fs_stat(sdir))
    assert.are.same({}, entries(pool .. "/snaps"))
  end)

  it("holds a box to its disk cap with a qgroup limit (EDQUOT)", function()
    if not pool then return pending("no btrfs pool: " .. why) end
    local id = assert(call(c, "sandbox.create", { limits = { disk = 16 * 1048576 } })).id
    local r = run(c, id, { "sh", "-c", "dd if=/dev/zero of=/fill bs=1M count=64 2>&1; sync; stat -c %s /fill" })
    assert.truthy(r.stdout:find("Disk quota exceeded", 1, true), r.stdout)
    local size = tonumber(r.stdout:match("(%d+)\n$"))
    assert.truthy(size and size <= 20 * 1048576, r.stdout)
    call(c, "sandbox.kill", { id = id })
  end)
end)

describe("the btrfs pool after a daemon killed during a snapshot", function()
  local daemons, d = helper.restarts(), nil

  setup(daemons.setup)
  after_each(daemons.after_each)
  teardown(daemons.teardown)

  it("is re-adopted; what a snapshot cut short left is removed, the box re-adopted", function()
    d = daemons.daemon()
    local pool, why = pool_of(d)
    if not pool then d.stop(); return pending("no btrfs pool: " .. why) end
    local c = assert(d.connect())
    local id = assert(call(c, "sandbox.create", {})).id
    write(c, id, "/a.txt", "a")
    local kept = assert(call(c, "sandbox.snapshot", { id = id, name = "kept" }))
    -- what a kill leaves at each point: a temp subvolume (before the rename),
    -- a snapshot no record names (before the record), a box subvolume that
    -- no live box owns (a start cut short)
    local stray = ("%064x"):format(7)
    for _, cmd in ipairs({
      ("btrfs -q subvolume snapshot -r '%s/boxes/%s' '%s/snaps/.tmp-%s'"):format(pool, id, pool, stray),
      ("btrfs -q subvolume snapshot -r '%s/boxes/%s' '%s/snaps/%s'"):format(pool, id, pool, stray),
      ("btrfs -q subvolume create '%s/boxes/deadbeef0001'"):format(pool) }) do
      local ok, out = sh(cmd)
      assert(ok, cmd .. ": " .. out)
    end
    -- and a real snapshot under way when the SIGKILL comes
    c.conn:send({ jsonrpc = "2.0", id = 99, method = "sandbox.snapshot", params = { id = id, name = "half" } })
    c:close()
    d.crash()
    -- the pool stays mounted (the box holds it too) and is adopted
    d = daemons.daemon()
    assert.truthy((helper.read_file(d.log) or ""):find("re-adopted)", 1, true), helper.read_file(d.log))
    c = assert(d.connect())
    local info = call(c, "sandbox.get", { id = id })
    assert(info, "not re-adopted: " .. tostring(helper.read_file(d.log)))
    if info.state == "paused" then assert(call(c, "sandbox.resume", { id = id })) end
    assert.are.equal("a", read(c, id, "/a.txt"))
    -- every snapshot listed has its subvolume, and every subvolume a record
    local names = {}
    for _, s in ipairs(assert(call(c, "snapshot.list", {})).snapshots) do
      names[record(d, s.id).pool_snap] = true
    end
    local n = 0
    for _, name in ipairs(entries(pool .. "/snaps")) do
      assert.is_true(names[name], "a pool snapshot no record names: " .. name)
      n = n + 1
    end
    assert.truthy(n >= 1 and n <= 2, n)
    assert.is_nil(uv.fs_stat(pool .. "/boxes/deadbeef0001"))
    local child = assert(call(c, "sandbox.create", { snapshot = kept.id })).id
    assert.are.equal("a", read(c, child, "/a.txt"))
    helper.kill_sandboxes(c)
    for _, s in ipairs(assert(call(c, "snapshot.list", {})).snapshots) do call(c, "snapshot.delete", { id = s.id }) end
    c:close()
    d.stop()
    -- the stop unmounted it
    assert.is_nil((helper.read_file("/proc/self/mountinfo") or ""):find(daemons.dir, 1, true))
  end)
end)

describe("a state dir with the btrfs pool turned off", function()
  it("gives boxes ext4 disks and snapshots that copy", function()
    local dir = helper.tmpdir()
    assert(uv.fs_mkdir(dir .. "/state", tonumber("711", 8)))
    local f = assert(io.open(dir .. "/state/no-btrfs-pool", "w"))
    f:close()
    local d = helper.start_daemon(dir, { pool = 0 })
    local c = assert(d.connect())
    local ok, err = pcall(function()
      assert.truthy((helper.read_file(d.log) or ""):find("disk pool: none (turned off", 1, true), helper.read_file(d.log))
      local id = assert(call(c, "sandbox.create", { limits = { disk = 64 * 1048576 } })).id
      -- the cap is an ext4 image of that size: df in the box says so
      local kb = tonumber(run(c, id, { "df", "-k", "/" }).stdout:match("\n%S+%s+(%d+)"))
      assert.truthy(kb and kb * 1024 <= 64 * 1048576 and kb * 1024 > 64 * 1048576 * 0.9, tostring(kb))
      write(c, id, "/x.txt", "x")
      local snap = assert(call(c, "sandbox.snapshot", { id = id }))
      local rec = record(d, snap.id)
      assert.is_string(rec.layer)
      assert.is_nil(rec.pool_snap)
      assert.is_nil(uv.fs_stat(d.state .. "/pool"))
      local child = assert(call(c, "sandbox.create", { snapshot = snap.id })).id
      assert.are.equal("x", read(c, child, "/x.txt"))
    end)
    helper.kill_sandboxes(c)
    for _, s in ipairs(call(c, "snapshot.list", {}).snapshots) do call(c, "snapshot.delete", { id = s.id }) end
    c:close()
    d.stop()
    assert(ok, err)
  end)
end)
