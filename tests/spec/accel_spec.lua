-- The microVM accelerator choice (lua/tupper/backend/microvm/accel.lua):
-- a /dev/kvm that QEMU's uid cannot open, or on which no guest kernel runs
-- (a nested PVM device here), means TCG with the reason said; a trial's
-- answer is kept per boot. QEMU is played by shell scripts: the real
-- device and kernel are the slow microVM specs'.
local uv = require("luv")
local helper = require("helper")

local NAME = "tupper.backend.microvm.accel"

-- A fresh copy of the module (its decision is made once per daemon), as
-- if TUPPER_VM_ACCEL were unset.
local warnings = {}
local function fresh()
  package.loaded[NAME] = nil
  local a = require(NAME)
  a.getenv = function() return nil end
  a.warn = function(msg) warnings[#warnings + 1] = msg end
  return a
end

local function write(path, text, mode)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  assert(uv.fs_chmod(path, mode))
end

describe("the microVM accelerator", function()
  local dir
  before_each(function()
    dir = helper.tmpdir()
    write(dir .. "/vmlinuz", "not a kernel", 420)
  end)
  after_each(function()
    helper.rmrf(dir)
    package.loaded[NAME] = nil
  end)

  local function without_env(fn) return fn() end

  it("takes TUPPER_VM_ACCEL as it is", function()
    local a = fresh()
    a.getenv = function(k) return k == "TUPPER_VM_ACCEL" and "tcg" or nil end
    a.DEVICE = dir .. "/kvm"
    write(a.DEVICE, "", 438)
    assert.are.same({ "tcg", "TUPPER_VM_ACCEL=tcg" }, { a.current() })
    a.getenv = function(k) return k == "TUPPER_VM_ACCEL" and "kvm" or nil end
    a.DEVICE = dir .. "/none"
    assert.are.same({ "kvm", "TUPPER_VM_ACCEL=kvm" }, { a.current() })
  end)

  it("is TCG, saying why, when there is no device or QEMU's uid cannot open it", function()
    without_env(function()
      local a = fresh()
      a.DEVICE = dir .. "/none"
      local accel, why = a.current()
      assert.are.equal("tcg", accel)
      assert.matches("has no .*/none", why)
      a.DEVICE = dir .. "/kvm"
      write(a.DEVICE, "", 384) -- 0600, as this machine's /dev/kvm
      accel, why = a.current()
      assert.are.equal("tcg", accel)
      assert.matches("mode 0600: QEMU's unprivileged uid cannot open it", why)
      -- decide keeps it, and tries nothing (no QEMU is run)
      local calls = 0
      a.trial = function() calls = calls + 1; return true end
      assert.are.equal("tcg", helper.sync(a.decide, { state_dir = dir, vmlinuz = dir .. "/vmlinuz",
        qemu = "/nonexistent" }))
      assert.are.equal(0, calls)
    end)
  end)

  it("tries KVM once with the guest kernel and keeps the answer for this boot", function()
    without_env(function()
      local a = fresh()
      a.DEVICE = dir .. "/kvm"
      write(a.DEVICE, "", 438) -- 0666: open to QEMU's uid
      assert.are.equal("kvm", (a.current()))
      -- a QEMU on which the kernel hangs after real mode, as on this host's PVM device
      write(dir .. "/qemu", "#!/bin/sh\necho 'Probing EDD (edd=off to disable)... ok'\nexec sleep 30\n", 493)
      a.TRIAL_MS = 300
      local opts = { state_dir = dir, vmlinuz = dir .. "/vmlinuz", qemu = dir .. "/qemu" }
      assert.are.equal("tcg", helper.sync(a.decide, opts))
      local accel, why = a.current()
      assert.are.equal("tcg", accel)
      assert.matches("KVM cannot run a guest here: the guest kernel printed nothing", why)
      assert.matches("Probing EDD", why)
      assert.matches("^tupper: warning: microVMs run under TCG emulation.*KVM cannot run a guest here",
        warnings[#warnings])
      -- the next daemon of this boot reads the answer: no trial
      local b = fresh()
      b.DEVICE = a.DEVICE
      local calls = 0
      b.trial = function() calls = calls + 1; return true end
      assert.are.equal("tcg", helper.sync(b.decide, opts))
      assert.are.equal(0, calls)
      -- another QEMU binary is another question
      write(dir .. "/qemu2", "#!/bin/sh\necho 'Linux version 6.1 (a kernel that runs)'\nexec sleep 30\n", 493)
      local c = fresh()
      c.DEVICE = a.DEVICE
      opts.qemu = dir .. "/qemu2"
      assert.are.equal("kvm", helper.sync(c.decide, opts))
      assert.is_nil(select(2, c.current()))
    end)
  end)

  it("reports a QEMU that exits, and refuses a cache file that is not its own line", function()
    without_env(function()
      write(dir .. "/qemu", "#!/bin/sh\necho 'failed to initialize kvm: Permission denied' >&2\nexit 1\n", 493)
      local a = fresh()
      local ok, why = helper.sync(a.trial, dir .. "/qemu", dir .. "/vmlinuz", nil)
      assert.is_false(ok)
      assert.matches("QEMU exited %(code 1", why)
      assert.matches("Permission denied", why)
      -- a hostile or torn cache file is not believed: the trial runs
      assert(uv.fs_mkdir(dir .. "/microvm", 448))
      write(dir .. "/microvm/accel", "garbage\tkvm\t\nmore\n", 384)
      a.DEVICE = dir .. "/kvm"
      write(a.DEVICE, "", 438)
      a.TRIAL_MS = 300
      assert.are.equal("tcg", helper.sync(a.decide, { state_dir = dir, vmlinuz = dir .. "/vmlinuz",
        qemu = dir .. "/qemu" }))
    end)
  end)

  it("answers every start that waits while one trial runs", function()
    without_env(function()
      local a = fresh()
      a.DEVICE = dir .. "/kvm"
      write(a.DEVICE, "", 438)
      write(dir .. "/qemu", "#!/bin/sh\nsleep 0.2\necho 'Linux version 6.1'\nexec sleep 30\n", 493)
      local opts = { state_dir = dir, vmlinuz = dir .. "/vmlinuz", qemu = dir .. "/qemu" }
      local got = helper.sync(function()
        local async = require("tupper.util.async")
        local other
        async.spawn(function() other = a.decide(opts) end)
        local mine = a.decide(opts)
        while not other do async.wait(function(cb) local t = uv.new_timer(); t:start(10, 0, function() t:close(); cb() end) end) end
        return mine .. "," .. other
      end)
      assert.are.equal("kvm,kvm", got)
    end)
  end)
  it("takes the daemon's --accel and a create's accel without a trial", function()
    local a = fresh()
    a.DEVICE = dir .. "/kvm"
    write(a.DEVICE, "", 438)
    -- a trial would run this and fail: it must not run
    write(dir .. "/qemu", "#!/bin/sh\ntouch " .. dir .. "/tried\nexit 1\n", 493)
    local opts = { state_dir = dir, vmlinuz = dir .. "/vmlinuz", qemu = dir .. "/qemu" }
    assert.is_nil((a.set_default("bogus")))
    assert(a.set_default("kvm"))
    assert.are.equal("kvm", helper.sync(a.decide, opts))
    assert.are.same({ "kvm", "tupper daemon --accel kvm" }, { a.current() })
    assert(a.set_default("tcg"))
    assert.are.same({ "tcg", "tupper daemon --accel tcg" }, { a.current() })
    assert.are.same({ "kvm", "asked for by the create" }, { helper.sync(a.choose, "kvm", opts) })
    assert.are.equal("tcg", (helper.sync(a.choose, "auto", opts)))
    assert.is_nil(uv.fs_stat(dir .. "/tried"))
    assert(a.set_default("auto"))
    assert.are.equal("tcg", (helper.sync(a.decide, opts))) -- auto: the trial ran, and failed
    assert.truthy(uv.fs_stat(dir .. "/tried"))
  end)
end)
