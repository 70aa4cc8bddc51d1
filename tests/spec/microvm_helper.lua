-- What the slow microvm specs (tests/slow/microvm*_spec.lua) share: the
-- set-up every describe block of them needs around cold boots under TCG
-- (a long timeout, the guest kernel fetched into a temp dir of its own
-- unless TUPPER_VM_CACHE names a cache to reuse), whether a pid is a QEMU,
-- and a sandbox's record in a daemon's state dir.
local uv = require("luv")
local helper = require("helper")

local M = {}

function M.qemu_alive(pid)
  local s = helper.read_file("/proc/" .. pid .. "/cmdline") or ""
  return s:find("qemu%-system") ~= nil
end

-- pid has finished exiting, every thread of it: gone, or a zombie that is
-- alone in its thread group.  A process that is still exiting has an empty
-- cmdline (its memory goes first) while its files, QEMU's agent socket
-- among them, are still open; and QEMU's main thread is a zombie while its
-- other threads still exit.  Until the last one is gone, a daemon can
-- still connect to the socket (and then see it reset).
function M.dead(pid)
  local s = helper.read_file("/proc/" .. pid .. "/stat")
  if s == nil then return true end
  if s:match("^%d+ %b() (%a)") ~= "Z" then return false end
  local n, req = 0, uv.fs_scandir("/proc/" .. pid .. "/task")
  while req and uv.fs_scandir_next(req) do n = n + 1 end
  return n <= 1
end

-- daemon d's record of sandbox id (boxes/<id>.json in its state dir)
function M.record(d, id)
  local text = assert(helper.read_file(d.state .. "/boxes/" .. id .. ".json"))
  return require("cjson").decode(text)
end

-- For a block's setup: helper.TIMEOUT_MS becomes timeout_ms and, unless
-- TUPPER_VM_CACHE is set, the guest kernel's cache is a new temp dir.
-- Returns what undoes both, for the block's teardown.
function M.vm_setup(timeout_ms)
  local saved_timeout, cache_dir = helper.TIMEOUT_MS, nil
  helper.TIMEOUT_MS = timeout_ms
  if not os.getenv("TUPPER_VM_CACHE") then
    cache_dir = helper.tmpdir()
    uv.os_setenv("TUPPER_VM_CACHE", cache_dir)
  end
  return function()
    if cache_dir then helper.rmrf(cache_dir); uv.os_unsetenv("TUPPER_VM_CACHE") end
    helper.TIMEOUT_MS = saved_timeout
  end
end

return M
