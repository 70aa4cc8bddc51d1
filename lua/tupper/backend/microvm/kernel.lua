--- The microVM guest's kernel and initramfs (docs/microvm.md).
--
-- The kernel is Debian's: the `linux-image-*-cloud-amd64` package, fetched
-- with `apt-get download` on first use (never installed: nothing goes to the
-- host's /boot or /lib/modules) and unpacked with `dpkg-deb -x` into a cache
-- dir.  QEMU's microvm machine boots its bzImage as it is.  The few modules
-- the guest needs (virtio-mmio, virtio-blk, virtio-console, overlay and what
-- they depend on, read from each module's .modinfo section) are kept beside
-- it.  The initramfs is a newc cpio written here: the static agent as /init,
-- the modules as /modules/NN-name.ko in load order, and the empty dirs the
-- agent mounts on.  Call from a coroutine (tupper.async).
local uv = require("luv")
local async = require("tupper.util.async")
local paths = require("tupper.util.paths")

local M = {}

M.PACKAGE = "linux-image-cloud-amd64" -- a metapackage: depends on the current versioned one
M.MODULES = { "virtio_mmio", "virtio_blk", "virtio_console", "overlay" }
M.OUTPUT_MAX = 64 * 1024 -- bytes of a helper's output kept

--- The cache: $TUPPER_VM_CACHE, else /var/cache/tupper/microvm for root,
-- else $XDG_CACHE_HOME/tupper/microvm.  Shared by every daemon of the host.
function M.cache_dir()
  local env = os.getenv("TUPPER_VM_CACHE")
  if env and env ~= "" then return env end
  if uv.getuid() == 0 then return "/var/cache/tupper/microvm" end
  local c = os.getenv("XDG_CACHE_HOME")
  if not c or c == "" then c = (os.getenv("HOME") or "/tmp") .. "/.cache" end
  return c .. "/tupper/microvm"
end

local mkdirs = paths.mkdirs
M.mkdirs = mkdirs

--- Runs a program and waits for it: returns stdout, or nil, err (with the
-- end of its stderr).  opts: cwd.  Output beyond OUTPUT_MAX is dropped.
function M.run(file, args, opts)
  opts = opts or {}
  local out, errs = {}, {}
  local nout, nerr = 0, 0
  local stdout, stderr = uv.new_pipe(), uv.new_pipe()
  local code, sig, pending = nil, nil, 3
  return async.wait(function(cb)
    local function done()
      pending = pending - 1
      if pending > 0 then return end
      if code == 0 then return cb(table.concat(out)) end
      local e = table.concat(errs):gsub("%s+$", "")
      cb(nil, ("%s %s: exit %s%s%s"):format(file, table.concat(args, " "):sub(1, 200),
        tostring(code), sig ~= 0 and (" signal " .. sig) or "", e ~= "" and (": " .. e:sub(-800)) or ""))
    end
    local function reader(pipe, acc, which)
      pipe:read_start(function(err, data)
        if err or not data then
          pipe:close()
          return done()
        end
        if which == 1 and nout < M.OUTPUT_MAX then
          acc[#acc + 1] = data; nout = nout + #data
        elseif which == 2 and nerr < M.OUTPUT_MAX then
          acc[#acc + 1] = data; nerr = nerr + #data
        end
      end)
    end
    local handle, perr
    handle, perr = uv.spawn(file, { args = args, cwd = opts.cwd, stdio = { nil, stdout, stderr } },
      function(c, s)
        code, sig = c, s
        handle:close() -- a process handle lives until closed, even once exited
        done()
      end)
    if not handle then
      stdout:close(); stderr:close()
      return cb(nil, "run " .. file .. ": " .. tostring(perr))
    end
    reader(stdout, out, 1)
    reader(stderr, errs, 2)
  end)
end

--- The NUL-separated key=value strings of an ELF64 module's .modinfo
-- section, as { key = { values } }, or nil, err.
function M.modinfo(data)
  local ok, res = pcall(function()
    assert(data:sub(1, 4) == "\127ELF" and data:byte(5) == 2 and data:byte(6) == 1, "not an ELF64 LE file")
    local shoff = string.unpack("<I8", data, 0x28 + 1)
    local shentsize, shnum, shstrndx = string.unpack("<I2I2I2", data, 0x3A + 1)
    assert(shentsize >= 64 and shnum < 65536 and shstrndx < shnum, "bad section table")
    local function section(i)
      local base = shoff + i * shentsize + 1
      local name = string.unpack("<I4", data, base)
      local off, size = string.unpack("<I8I8", data, base + 24)
      assert(off + size <= #data, "section outside the file")
      return name, off, size
    end
    local _, stroff, strsize = section(shstrndx)
    for i = 0, shnum - 1 do
      local name, off, size = section(i)
      assert(name < strsize, "bad section name")
      if string.unpack("z", data, stroff + name + 1) == ".modinfo" then
        local info = {}
        for kv in data:sub(off + 1, off + size):gmatch("[^%z]+") do
          local k, v = kv:match("^([%w_]+)=(.*)$")
          if k then
            info[k] = info[k] or {}
            table.insert(info[k], v)
          end
        end
        return info
      end
    end
    error("no .modinfo section")
  end)
  if not ok then return nil, tostring(res) end
  return res
end

local read_file = paths.read_file

-- Writes data to path atomically (temp file, then rename).
local function write_file(path, data, mode)
  local tmp = path .. ".tmp-" .. uv.getpid()
  local fd, err = uv.fs_open(tmp, "w", mode or 420)
  if not fd then return nil, err end
  local n, werr = uv.fs_write(fd, data, 0)
  uv.fs_close(fd)
  if n ~= #data then
    uv.fs_unlink(tmp)
    return nil, "write " .. tmp .. ": " .. tostring(werr)
  end
  local ok, rerr = uv.fs_rename(tmp, path)
  if not ok then uv.fs_unlink(tmp); return nil, rerr end
  return true
end
M.write_file = write_file

-- Every *.ko under dir: { name (with '_' for '-') = path }.
local function index_modules(dir, acc)
  acc = acc or {}
  local req = uv.fs_scandir(dir)
  if not req then return acc end
  while true do
    local name, typ = uv.fs_scandir_next(req)
    if not name then break end
    local path = dir .. "/" .. name
    if typ == "directory" then
      index_modules(path, acc)
    elseif typ == "file" and name:sub(-3) == ".ko" then
      acc[name:sub(1, -4):gsub("-", "_")] = path
    end
  end
  return acc
end

--- The modules of `wanted` and their dependencies, dependencies first:
-- { { name=, path= } }, or nil, err.  index: name -> path.
function M.resolve_modules(index, wanted)
  local order, state = {}, {}
  local function visit(name, depth)
    if state[name] == "done" then return true end
    if state[name] == "visiting" or depth > 32 then return nil, "module dependency loop at " .. name end
    local path = index[name]
    if not path then return nil, "module " .. name .. " is not in the kernel package" end
    state[name] = "visiting"
    local data, err = read_file(path)
    if not data then return nil, err end
    local info, ierr = M.modinfo(data)
    if not info then return nil, name .. ": " .. ierr end
    for _, deps in ipairs(info.depends or {}) do
      for dep in deps:gmatch("[^,]+") do
        local ok, derr = visit(dep:gsub("-", "_"), depth + 1)
        if not ok then return nil, derr end
      end
    end
    state[name] = "done"
    order[#order + 1] = { name = name, path = path }
    return true
  end
  for _, name in ipairs(wanted) do
    local ok, err = visit(name, 0)
    if not ok then return nil, err end
  end
  return order
end

--- A newc ("070701") cpio archive of entries { name=, mode=, data= } (mode
-- with its file type bits), owned by root, ending with the trailer.
function M.cpio(entries)
  local parts = {}
  local function add(name, mode, data, ino, nlink)
    local hdr = ("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X"):format(
      ino, mode, 0, 0, nlink, 0, #data, 0, 0, 0, 0, #name + 1, 0)
    parts[#parts + 1] = hdr .. name .. "\0"
    parts[#parts + 1] = ("\0"):rep((4 - (#hdr + #name + 1) % 4) % 4)
    parts[#parts + 1] = data
    parts[#parts + 1] = ("\0"):rep((4 - #data % 4) % 4)
  end
  for i, e in ipairs(entries) do
    assert(not e.name:find("%z") and not e.name:find("^/") and not e.name:find("%.%."), "bad cpio name")
    add(e.name, e.mode, e.data or "", i, (e.mode & 0xF000) == 0x4000 and 2 or 1)
  end
  add("TRAILER!!!", 0, "", 0, 1)
  return table.concat(parts)
end

-- The versioned package the metapackage depends on.
local function versioned_package()
  local out, err = M.run("/usr/bin/apt-cache", { "depends", "--important", M.PACKAGE })
  if not out then return nil, err end
  local pkg = out:match("Depends:%s*(linux%-image%-[%w%.%-]+)")
  if not pkg then return nil, "apt-cache: " .. M.PACKAGE .. " names no kernel package" end
  return pkg
end

-- Fetches and unpacks the kernel package into dir/<version>; returns version.
local function fetch(cache)
  -- lazy: tupper.core exists only in the binary; the specs load this module under plain lua5.4
  local tmp = cache .. "/tmp-" .. uv.getpid() .. "-" .. require("tupper.core").random_hex(4)
  local ok, err = mkdirs(tmp, 448)
  if not ok then return nil, err end
  local function fail(e)
    require("tupper.core").rmtree(tmp) -- lazy: only in the binary, as above
    return nil, "fetch the guest kernel: " .. e
  end
  local deb = os.getenv("TUPPER_VM_KERNEL_DEB")
  if not deb or deb == "" then
    local pkg, perr = versioned_package()
    if not pkg then return fail(perr) end
    local _, derr = M.run("/usr/bin/apt-get", { "download", "-q", pkg }, { cwd = tmp })
    if derr then return fail(derr) end
    local req = uv.fs_scandir(tmp)
    while req do
      local name = uv.fs_scandir_next(req)
      if not name then break end
      if name:match("%.deb$") then deb = tmp .. "/" .. name end
    end
    if not deb then return fail("apt-get download left no .deb") end
  end
  local _, xerr = M.run("/usr/bin/dpkg-deb", { "-x", deb, tmp .. "/x" })
  if xerr then return fail(xerr) end
  local version
  local req = uv.fs_scandir(tmp .. "/x/boot")
  while req do
    local name = uv.fs_scandir_next(req)
    if not name then break end
    version = version or name:match("^vmlinuz%-(.+)$")
  end
  if not version or not version:match("^[%w%.%-+]+$") then return fail("no vmlinuz in the package") end
  local mods, merr = M.resolve_modules(index_modules(tmp .. "/x/lib/modules/" .. version .. "/kernel"), M.MODULES)
  if not mods then return fail(merr) end
  local out = tmp .. "/" .. version
  assert(mkdirs(out .. "/modules", 493))
  local list = {}
  for i, m in ipairs(mods) do
    local data, rerr = read_file(m.path)
    if not data then return fail(rerr) end
    local name = ("%02d-%s.ko"):format(i, m.name)
    local wok, werr = write_file(out .. "/modules/" .. name, data)
    if not wok then return fail(werr) end
    list[#list + 1] = name
  end
  local kernel, kerr = read_file(tmp .. "/x/boot/vmlinuz-" .. version)
  if not kernel then return fail(kerr) end
  assert(write_file(out .. "/modules.list", table.concat(list, "\n") .. "\n"))
  assert(write_file(out .. "/vmlinuz", kernel))
  local rok, rerr = uv.fs_rename(out, cache .. "/" .. version)
  if not rok and not tostring(rerr):find("ENOTEMPTY") and not tostring(rerr):find("EEXIST") then
    return fail(rerr)
  end
  require("tupper.core").rmtree(tmp) -- lazy: only in the binary, as above
  assert(write_file(cache .. "/current", version .. "\n"))
  return version
end

local inflight = {}

--- The guest kernel in the cache, fetched on first use: { version=,
-- vmlinuz=, modules = { path, ... } in load order } or nil, err.  Callers
-- racing in one daemon share one fetch; two daemons racing both fetch and
-- one rename wins.
function M.ensure_kernel(cache)
  cache = cache or M.cache_dir()
  local function load()
    local cur = read_file(cache .. "/current", 256)
    local version = cur and cur:match("^([%w%.%-+]+)\n")
    if not version then return nil end
    local dir = cache .. "/" .. version
    local list = read_file(dir .. "/modules.list", 65536)
    if not list or not uv.fs_stat(dir .. "/vmlinuz") then return nil end
    local mods = {}
    for name in list:gmatch("[^\n]+") do mods[#mods + 1] = dir .. "/modules/" .. name end
    return { version = version, vmlinuz = dir .. "/vmlinuz", modules = mods }
  end
  local k = load()
  if k then return k end
  if inflight[cache] then
    local waiters = inflight[cache]
    return async.wait(function(cb) waiters[#waiters + 1] = cb end)
  end
  local waiters = {}
  inflight[cache] = waiters
  local ok, err = mkdirs(cache, 493)
  local version
  if ok then version, err = fetch(cache) end
  local res, rerr
  if version then
    res = load()
    if not res then rerr = "the kernel cache at " .. cache .. " is incomplete" end
  else
    rerr = err
  end
  inflight[cache] = nil
  for _, cb in ipairs(waiters) do cb(res, rerr) end
  return res, rerr
end

--- Builds the initramfs for kernel k (from ensure_kernel) with the agent
-- binary as /init; writes it atomically to path.
function M.build_initramfs(k, agent, path)
  local entries = {}
  for _, d in ipairs({ "dev", "proc", "sys", "mnt", "newroot", "modules" }) do
    entries[#entries + 1] = { name = d, mode = 0x4000 | 493 }
  end
  entries[#entries + 1] = { name = "init", mode = 0x8000 | 493, data = agent }
  for _, m in ipairs(k.modules) do
    local data, err = read_file(m)
    if not data then return nil, err end
    entries[#entries + 1] = { name = "modules/" .. m:match("[^/]+$"), mode = 0x8000 | 420, data = data }
  end
  return write_file(path, M.cpio(entries), 420)
end

return M
