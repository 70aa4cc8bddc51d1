-- microVM memory snapshots, fork and pause to disk (docs/snapshots.md,
-- "microVM memory snapshots and fork"): a fork resumes every process of
-- its parent, with the parent's files at that instant and its own writes
-- and identity; after a daemon crash the re-adopted fork can still be
-- saved; paused to disk it survives a "reboot" (its daemon SIGKILLed, its
-- QEMU gone) with its memory and processes.  Boots one VM
-- (a cold boot for the template of its shape, then a start from it) and
-- starts two from memory snapshots: slow.
local uv = require("luv")
local async = require("tupper.util.async")
local helper = require("helper")
local vm = require("microvm_helper")

local sync, call = helper.sync, helper.call
local run, read, write, entries = helper.run_sync, helper.read_text, helper.write_text, helper.entries

-- the counter's value in box id, once it moved past n (nil if it did not)
local function counts_past(c, id, n, ms)
  return sync(function()
    for _ = 1, ms // 100 do
      local v = tonumber(read(c, id, "/count") or "")
      if v and v > n then return v end
      async.sleep(100)
    end
  end)
end

describe("microVM memory snapshots", function()
  local vm_undo, dir, d

  setup(function()
    vm_undo = vm.vm_setup(600000)
    dir = helper.tmpdir()
  end)
  teardown(function()
    helper.release(d)
    if dir then helper.rmrf(dir) end
    if vm_undo then vm_undo() end
    helper.drain()
  end)

  it("fork resumes the parent's processes; pause to disk survives a reboot with memory and processes", function()
    -- a failure shows what the daemon said
    finally(function() if d then io.stderr:write(helper.read_file(d.log) or "") end end)
    d = helper.start_daemon(dir, { pool = 0 })
    local c = assert(d.connect())
    local sb, err = call(c, "sandbox.create", { backend = "microvm", limits = { memory = 256 * 1048576 } })
    assert(sb, err and err.message)
    local id = sb.id
    write(c, id, "/data.txt", "parent")
    local bg = assert(call(c, "process.start", { sandbox = id,
      argv = { "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /count.new; mv /count.new /count; sleep 0.2; done" } }))
    assert(counts_past(c, id, 0, 30000), "the parent's counter did not start")

    local r, ferr = call(c, "sandbox.fork", { id = id, count = 1 })
    assert(r, ferr and ferr.message)
    local child = r.sandboxes[1].id
    assert.are_not.equal(id, child)
    -- the parent's process runs on in the fork, which knows it
    local procs = assert(call(c, "process.list", { sandbox = child })).processes
    local found = false
    for _, p in ipairs(procs) do found = found or p.pid == bg.pid end
    assert.is_true(found, "the fork does not list the parent's process")
    local n = assert(tonumber(read(c, child, "/count")))
    assert(counts_past(c, child, n, 30000), "the counter does not run in the fork")
    -- the parent's files at that instant, its own identity, its own writes
    assert.are.equal("parent", read(c, child, "/data.txt"))
    assert.are.equal(child .. "\n", run(c, child, "hostname").stdout)
    assert.are.equal(id .. "\n", run(c, id, "hostname").stdout)
    local now = os.time()
    local guest_now = tonumber(run(c, child, "date +%s").stdout)
    assert.truthy(guest_now and math.abs(guest_now - now) < 60, "the fork's clock is not the host's")
    write(c, child, "/data.txt", "child")
    write(c, id, "/parent-only.txt", "p")
    assert.are.equal("parent", read(c, id, "/data.txt"))
    assert.is_nil(read(c, child, "/parent-only.txt"))

    -- a daemon crash: both VMs re-adopted, their monitors reached again
    -- through the socket QEMU listens on, so the fork can still be saved
    c:close()
    d.crash()
    d = helper.start_daemon(dir, { pool = 0 })
    c = assert(d.connect())
    assert.are.equal("running", assert(call(c, "sandbox.get", { id = child })).state)
    assert(call(c, "sandbox.kill", { id = id }))
    assert(call(c, "snapshot.delete", { id = r.snapshot }))

    -- pause to disk: the VM goes, its memory is on disk
    local qemu_pid = math.tointeger(vm.record(d, child).pid)
    local p = assert(call(c, "sandbox.pause", { id = child, keep_memory = true }))
    assert.are.same({ state = "paused", persisted = true, box = false }, p)
    assert.is_true(sync(function()
      for _ = 1, 100 do
        if vm.dead(qemu_pid) then return true end
        async.sleep(100)
      end
      return false
    end), "QEMU still runs after a pause to disk")
    -- a "reboot": the daemon SIGKILLed (the VM is gone already)
    c:close()
    d.crash()
    d = helper.start_daemon(dir, { pool = 0 })
    c = assert(d.connect())
    local info = assert(call(c, "sandbox.get", { id = child }))
    assert.are.equal("paused", info.state)
    assert.is_true(info.persisted)
    r = assert(call(c, "sandbox.resume", { id = child }))
    assert.is_true(r.restarted)
    -- from its memory: the counter runs on, the files are the fork's
    assert.are.equal("child", read(c, child, "/data.txt"))
    n = assert(tonumber(read(c, child, "/count")))
    assert(counts_past(c, child, n, 30000), "the counter does not run after the resume")
    assert(call(c, "sandbox.kill", { id = child }))
    assert.are.same({}, entries(d.state .. "/snapshots"))
    c:close()
    assert.are.equal(0, d.stop())
    d = nil
  end)
end)
