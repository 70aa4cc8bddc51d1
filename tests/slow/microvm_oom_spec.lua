-- OOM kills inside a microVM's guest (docs/limits.md, "OOM kills"): the
-- guest's kernel kills there, not the host's cgroup, and the guest's agent
-- tells (its /proc/vmstat oom_kill rose while a process died of SIGKILL):
-- the exit says oom_killed as on the linux backend, sandbox.metrics counts
-- the guest's kills, and a SIGKILL that is not the OOM killer's is not
-- reported as one.  One boot under TCG: slow.
local uv = require("luv")
local json = require("tupper.util.json")
local helper = require("helper")
local vm = require("microvm_helper")

describe("OOM kills in a microVM guest", function()
  local d, c, vm_undo, id

  setup(function()
    vm_undo = vm.vm_setup(300000) -- a cold boot under TCG emulation, on a loaded machine
    -- samples every 0.5 s: a microVM's reads its guest through its agent,
    -- from a coroutine (daemon/metrics.lua)
    uv.os_setenv("TUPPER_METRICS_INTERVAL", "0.5")
    d, c = helper.daemon_and_client(nil, { pool = 0 })
    uv.os_unsetenv("TUPPER_METRICS_INTERVAL")
  end)

  teardown(function()
    helper.stop_daemon_and_client(d, c) -- the box `id` goes with the others
    if vm_undo then vm_undo() end
    helper.drain()
  end)

  local function call(method, params) return helper.call(c, method, params) end

  -- Runs argv in the box: { stdout, exit = its process.exit notification }.
  local function run(argv) return helper.run_exit(c, id, argv) end

  it("reports a memory hog the guest kernel killed as OOM-killed, and counts it in sandbox.metrics", function()
    local sb, err = call("sandbox.create", { backend = "microvm", limits = { memory = "256M" } })
    assert(sb, err and err.message)
    id = sb.id
    local before = assert(call("sandbox.metrics", { id = id }))
    assert.are.equal(0, before.oom_kills)
    -- a SIGKILL that is not the OOM killer's says nothing of it
    local r = run({ "sh", "-c", "kill -9 $$" })
    assert.are.same({ 9 }, { r.exit.signal, r.exit.oom_killed }, json.encode(r.exit))
    -- busybox dd allocates its 210 MiB block and fills it from /dev/zero,
    -- in a guest of 256 MiB (about 180 MiB free): the guest kernel kills it
    r = run({ "dd", "if=/dev/zero", "of=/dev/null", "bs=210M", "count=1" })
    assert.are.same({ 9, true }, { r.exit.signal, r.exit.oom_killed }, "exit " .. json.encode(r.exit))
    local after = assert(call("sandbox.metrics", { id = id, series = true }))
    assert.is_true(after.oom_kills >= 1, json.encode(after))
    -- the timer's samples of the guest were taken (each waits for its agent)
    assert.is_true(#after.samples >= 1, json.encode(after))
    assert.is_nil(helper.read_file(d.log):find("task failed", 1, true), helper.read_file(d.log))
    -- the next SIGKILL is told from the count, which did not rise again
    r = run({ "sh", "-c", "kill -9 $$" })
    assert.are.same({ 9 }, { r.exit.signal, r.exit.oom_killed }, json.encode(r.exit))
    -- the box lives on: its agent was not the victim
    r = run({ "echo", "alive" })
    assert.are.equal("alive\n", r.stdout)
    assert.is_nil(r.exit.oom_killed)
  end)
end)
