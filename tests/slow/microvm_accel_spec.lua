-- The microVM accelerator a create or the daemon asks for (docs/microvm.md,
-- "Acceleration"): `accel = "kvm"` skips the trial, and a start that fails
-- says why in QEMU's own words (its stderr shares the console pipe) along
-- with the console's last lines.  Needs a host whose /dev/kvm QEMU's
-- unprivileged uid cannot use (mode 0600, or none); elsewhere it is pending.
-- Starts QEMU, which fails at once: no boot, but the kernel and the images
-- are prepared, so it lives with the slow specs.
local helper = require("helper")
local vm = require("microvm_helper")

-- whether QEMU's uid could open /dev/kvm here (as accel.lua judges it)
local function kvm_usable()
  local st = require("luv").fs_stat("/dev/kvm")
  return st ~= nil and (st.mode & 6) == 6
end

describe("a microVM start on an accelerator that cannot run", function()
  local vm_undo, d, d2, c

  setup(function()
    vm_undo = vm.vm_setup(300000)
  end)
  teardown(function()
    if c then c:close() end
    if d then assert.are.equal(0, d.stop()) end
    if d2 then assert.are.equal(0, d2.stop()) end
    if vm_undo then vm_undo() end
    helper.drain()
  end)

  it("fails a create's accel = kvm with QEMU's stderr in the error", function()
    if kvm_usable() then return pending("this host's /dev/kvm is open to QEMU's uid") end
    d = helper.start_daemon(nil, { pool = 0 })
    c = assert(d.connect())
    local sb, err = helper.call(c, "sandbox.create", { backend = "microvm", accel = "kvm" })
    assert.is_nil(sb)
    assert.matches("QEMU %(accel kvm%) failed", err.message)
    -- QEMU's own words, not only "its monitor closed"
    assert.matches("qemu%-system%-x86_64: [^|)]*kvm", err.message)
    assert.is_nil(err.message:find("printed nothing", 1, true), err.message)
    -- nothing is left of it
    assert.are.equal(0, #assert(helper.call(c, "sandbox.list", {})).sandboxes)
    -- and accel is for microVMs only
    _, err = helper.call(c, "sandbox.create", { accel = "tcg" })
    assert.matches("'accel' is for microVMs", err.message, 1, true)
  end)

  it("fails every start of a daemon run with --accel kvm the same way", function()
    if kvm_usable() then return pending("this host's /dev/kvm is open to QEMU's uid") end
    d2 = helper.start_daemon(nil, { pool = 0, args = { "--accel", "kvm" } })
    local c2 = assert(d2.connect())
    local sb, err = helper.call(c2, "sandbox.create", { backend = "microvm" })
    c2:close()
    assert.is_nil(sb)
    assert.matches("qemu%-system%-x86_64: [^|)]*kvm", err.message)
    -- the daemon did not try KVM first, nor fall back: it was told
    assert.is_nil(helper.read_file(d2.log):find("warning: microVMs run under TCG", 1, true))
  end)
end)
