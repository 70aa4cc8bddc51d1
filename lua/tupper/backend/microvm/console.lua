--- A microVM's serial console, read for as long as QEMU lives: its last
-- bytes are what error messages quote (a guest panic says so).
local uv = require("luv")
local async = require("tupper.util.async")

local M = {}

M.CONSOLE_KEEP = 8192     -- bytes of the serial console kept for error messages
M.CONSOLE_WAIT_MS = 2000  -- for QEMU to exit and the console to end, once the guest is down

-- Reads the console pipe for as long as QEMU lives, keeping only the last
-- CONSOLE_KEEP bytes: a guest flooding its console costs the daemon nothing.
-- con.closed(cb) runs cb once the pipe reached EOF (QEMU exited: all it
-- wrote has been read) or after wait_ms.
local function console_reader(pipe)
  local con = { tail = "", eof = false, waiters = {} }
  -- runs every waiter once; their timers are closed, so that no handle
  -- outlives the VM (a daemon stopping right after a kill must find none)
  local function release()
    local w = con.waiters
    con.waiters = {}
    for _, f in ipairs(w) do f() end
  end
  local function ended()
    con.eof = true
    if not pipe:is_closing() then pipe:close() end
    release()
  end
  pipe:read_start(function(err, data)
    if err or not data then return ended() end
    local t = con.tail .. data
    if #t > M.CONSOLE_KEEP then t = t:sub(-M.CONSOLE_KEEP) end
    con.tail = t
  end)
  function con.close()
    if not pipe:is_closing() then pipe:close() end
    release()
  end
  function con.closed(wait_ms, cb)
    if con.eof then return cb() end
    local timer = uv.new_timer()
    local done = false
    local function once()
      if done then return end
      done = true
      if not timer:is_closing() then timer:close() end
      cb()
    end
    con.waiters[#con.waiters + 1] = once
    timer:start(wait_ms, 0, once)
  end
  return con
end

-- What QEMU and the guest said at the end (QEMU's stdout and stderr are
-- both the console pipe): the kernel's panic line and QEMU's own
-- complaints ("qemu-system-x86_64: ..."), else the last lines.
local function console_hint(con)
  local t = con.tail:gsub("\r", ""):gsub("[^%g \n]", "?")
  local panic = t:match("Kernel panic %- not syncing:[^\n]*")
  if panic then return " (guest " .. panic:gsub("^Kernel", "kernel") .. ")" end
  local lines = {}
  for line in t:gmatch("[^\n]+") do lines[#lines + 1] = line end
  local first = math.max(1, #lines - 5)
  local s = table.concat(lines, " | ", first)
  if s == "" then return " (QEMU and the guest printed nothing)" end
  return " (QEMU's output and the console's last lines: " .. s .. ")"
end

-- The hint once QEMU's output has ended (it exited: all it wrote is read),
-- or after wait_ms.  Call from a coroutine.
local function last_words(con, wait_ms)
  async.wait(function(cb) con.closed(wait_ms or M.CONSOLE_WAIT_MS, cb) end)
  return console_hint(con)
end


--- Starts reading the console pipe (a uv pipe); returns the reader: tail,
-- close(), closed(wait_ms, cb).
M.open = console_reader

--- What the console (a reader) says about the end, as " (...)".
M.hint = console_hint

--- The same, waiting (at most wait_ms, default CONSOLE_WAIT_MS) for QEMU's
-- output to end first.  Call from a coroutine.
M.last_words = last_words

return M
