--- The luv handles the daemon's Lua code makes, so that its shutdown can
-- close every one of them before the Lua state goes.  A luv handle still
-- open when tp_main closes the state is freed under the loop, and the
-- loop's next run reads freed memory (a SIGSEGV instead of a clean exit);
-- one left active keeps uv.run() from returning at all.  uv.walk cannot
-- find them: it wraps every handle of the loop, the C side's too (a box's
-- pipes and timers, the data plane's), as a luv handle, and closing those
-- from Lua frees them twice.
--
-- M.track() makes luv's constructors record what they return, in a table
-- with weak keys (luv holds an open handle in its registry, so only a
-- closed one can be collected); M.close_all() closes what is still open.
-- The daemon tracks from its start (daemon/main.lua M.run), so every
-- module's handles are known without each module registering its own.
local uv = require("luv")

local M = {}

--- The luv functions that make a handle (the handle is their first result).
M.CONSTRUCTORS = { "new_timer", "new_pipe", "new_tcp", "new_udp", "new_tty", "new_signal", "new_fs_event",
                   "new_fs_poll", "new_poll", "new_check", "new_idle", "new_prepare", "new_async", "spawn" }

local owned = setmetatable({}, { __mode = "k" })
local originals

--- From now on every handle luv's constructors make is recorded.  Calling
-- it again changes nothing.
function M.track()
  if originals then return end
  originals = {}
  for _, name in ipairs(M.CONSTRUCTORS) do
    local make = uv[name]
    if make then
      originals[name] = make
      -- (a constructor returns a handle, a handle and a pid, or nil, a
      -- message and an error name: three values at most, passed on without
      -- a table a call)
      uv[name] = function(...)
        local h, a, b = make(...)
        if type(h) == "userdata" then owned[h] = true end
        return h, a, b
      end
    end
  end
end

--- Puts luv's constructors back (what was recorded stays recorded).
function M.untrack()
  if not originals then return end
  for name, make in pairs(originals) do uv[name] = make end
  originals = nil
end

-- Whether h is open.  A handle luv has collected stays a key of `owned`
-- until the collection after its finalizer ran (Lua's rule for weak keys),
-- and luv then refuses it as a handle: it is not open.
local function is_open(h)
  local ok, closing = pcall(h.is_closing, h)
  return ok and not closing
end

--- How many recorded handles are open (not closing).
function M.open_count()
  local n = 0
  for h in pairs(owned) do
    if is_open(h) then n = n + 1 end
  end
  return n
end

--- Closes every recorded handle that is still open (a process handle's
-- process is not signalled: closing it only stops watching it).  The
-- close callbacks run on the loop's next turn.  Returns how many it closed.
function M.close_all()
  local list = {}
  for h in pairs(owned) do
    if is_open(h) then list[#list + 1] = h end
  end
  for _, h in ipairs(list) do
    if is_open(h) then h:close() end
  end
  return #list
end

return M
