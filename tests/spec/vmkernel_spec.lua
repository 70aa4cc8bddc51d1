-- The microVM initramfs builder's pure parts: the newc cpio writer (read
-- back by busybox cpio), the module .modinfo reader against good and
-- hostile ELF files, and dependency ordering.
local vmkernel = require("tupper.backend.microvm.kernel")
local helper = require("helper")

-- A minimal ELF64 LE file whose sections are { name, bytes }, plus the
-- section-name table.
local function elf(sections)
  local shstr, names = "\0", {}
  for i, s in ipairs(sections) do
    names[i] = #shstr
    shstr = shstr .. s[1] .. "\0"
  end
  local shstr_name = #shstr
  shstr = shstr .. ".shstrtab\0"
  local body, offs = "", {}
  for i, s in ipairs(sections) do
    offs[i] = 64 + #body
    body = body .. s[2]
  end
  local shstr_off = 64 + #body
  body = body .. shstr
  local shoff = 64 + #body
  local n = #sections + 2 -- the null section, ours, the name table
  local function sh(name, typ, off, size) return string.pack("<I4I4I8I8I8I8I4I4I8I8", name, typ, 0, 0, off, size, 0, 0, 1, 0) end
  local hdr = "\127ELF" .. string.char(2, 1, 1) .. ("\0"):rep(9)
    .. string.pack("<I2I2I4I8I8I8I4I2I2I2I2I2I2", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, n, n - 1)
  local tab = ("\0"):rep(64)
  for i = 1, #sections do tab = tab .. sh(names[i], 1, offs[i], #sections[i][2]) end
  tab = tab .. sh(shstr_name, 3, shstr_off, #shstr)
  return hdr .. body .. tab
end

local function module(deps)
  return elf({ { ".text", "\195" }, { ".modinfo", "license=GPL\0depends=" .. deps .. "\0name=x\0" } })
end

describe("vmkernel", function()
  it("writes a newc cpio that busybox cpio reads back", function()
    local dir = helper.tmpdir()
    finally(function() helper.rmrf(dir) end)
    local data = vmkernel.cpio({
      { name = "dev", mode = 0x4000 | 493 },
      { name = "init", mode = 0x8000 | 493, data = "#!/bin/sh\necho hi\n" },
      { name = "modules", mode = 0x4000 | 493 },
      { name = "modules/01-a.ko", mode = 0x8000 | 420, data = ("x"):rep(1001) },
    })
    assert.are.equal(0, #data % 4)
    local f = assert(io.open(dir .. "/a.cpio", "wb"))
    f:write(data)
    f:close()
    local p = io.popen("cd " .. dir .. " && busybox cpio -i -d < a.cpio 2>&1 && ls -l init modules/01-a.ko && cat init")
    local out = p:read("a")
    p:close()
    assert.matches("%-rwxr%-xr%-x .- 18 .-init", out)
    assert.matches("%-rw%-r%-%-r%-%- .- 1001 .-modules/01%-a%.ko", out)
    assert.matches("echo hi", out)
    assert.has_error(function() vmkernel.cpio({ { name = "../x", mode = 0x8000 } }) end)
    assert.has_error(function() vmkernel.cpio({ { name = "/x", mode = 0x8000 } }) end)
  end)

  it("reads depends= from a module's .modinfo and refuses hostile files", function()
    local info = assert(vmkernel.modinfo(module("virtio,virtio_ring")))
    assert.are.same({ "virtio,virtio_ring" }, info.depends)
    assert.are.same({ "GPL" }, info.license)
    for _, bad in ipairs({ "", "\127ELF", ("\0"):rep(100), module("a"):sub(1, 80),
                           (elf({ { ".text", "x" } })) }) do
      local r, err = vmkernel.modinfo(bad)
      assert.is_nil(r)
      assert.is_string(err)
    end
    -- a section table pointing past the end of the file
    local m = module("")
    local broken = m:sub(1, 0x28) .. string.pack("<I8", #m + 4096) .. m:sub(0x31)
    assert.is_nil(vmkernel.modinfo(broken))
  end)

  it("orders modules after their dependencies and names what is missing", function()
    local dir = helper.tmpdir()
    finally(function() helper.rmrf(dir) end)
    local function put(name, deps)
      local f = assert(io.open(dir .. "/" .. name .. ".ko", "wb"))
      f:write(module(deps))
      f:close()
      return dir .. "/" .. name .. ".ko"
    end
    local index = { virtio_ring = put("virtio_ring", ""), virtio = put("virtio", "virtio_ring"),
                    virtio_blk = put("virtio_blk", "virtio,virtio_ring"), overlay = put("overlay", ""),
                    loop_a = put("loop_a", "loop_b"), loop_b = put("loop_b", "loop_a") }
    local order = assert(vmkernel.resolve_modules(index, { "virtio_blk", "overlay" }))
    local names = {}
    for _, m in ipairs(order) do names[#names + 1] = m.name end
    assert.are.same({ "virtio_ring", "virtio", "virtio_blk", "overlay" }, names)
    local r, err = vmkernel.resolve_modules(index, { "nope" })
    assert.is_nil(r)
    assert.matches("nope is not in the kernel package", err)
    r, err = vmkernel.resolve_modules(index, { "loop_a" })
    assert.is_nil(r)
    assert.matches("loop", err)
  end)
end)
