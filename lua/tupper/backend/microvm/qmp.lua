--- A QMP client (QEMU's monitor in control mode), for snapshots and
-- restores.  Call from a coroutine.
local uv = require("luv")
local json = require("cjson")
local core = require("tupper.core")
local async = require("tupper.util.async")

local M = {}

M.QMP_LINE_MAX = 1024 * 1024

-- A QMP client on the socket fd (QEMU's monitor, in control mode): q.cmd
-- (name, args) -> the return value, or nil, err.  Replies come in order;
-- events are skipped.  QEMU may be the guest's by now: every line is
-- bounded, a bad one closes the monitor.
-- fd: a socket fd, or a connected luv pipe.  timeout_ms (optional): how
-- long the greeting may take (a QEMU that does not answer).
local function qmp_open(fd, timeout_ms)
  local pipe = fd
  if type(fd) == "number" then
    pipe = uv.new_pipe()
    pipe:open(fd)
  end
  local q = { buf = "", waiters = {} }
  local function fail_all(why)
    q.closed = why
    local w = q.waiters
    q.waiters = {}
    for _, cb in ipairs(w) do cb(nil, why) end
    if not pipe:is_closing() then pipe:close() end
  end
  pipe:read_start(function(err, data)
    if err or not data then return fail_all("QEMU's monitor closed") end
    q.buf = q.buf .. data
    if #q.buf > M.QMP_LINE_MAX then return fail_all("QEMU's monitor sent an oversized line") end
    while true do
      local line, rest = q.buf:match("^([^\n]*)\n(.*)$")
      if not line then break end
      q.buf = rest
      local ok, msg = pcall(json.decode, line)
      if not ok or type(msg) ~= "table" then return fail_all("QEMU's monitor sent a bad line") end
      if msg.event == nil then
        local cb = table.remove(q.waiters, 1)
        if cb then
          if msg.error then cb(nil, tostring(type(msg.error) == "table" and msg.error.desc or "error"))
          else cb(msg["return"] or msg.QMP or {}) end
        end
      end
    end
  end)
  -- with_fd: a file descriptor passed along (SCM_RIGHTS), for getfd
  function q.cmd(name, args, with_fd)
    if q.closed then return nil, q.closed end
    return async.wait(function(cb)
      q.waiters[#q.waiters + 1] = cb
      if not name then return end
      local line = json.encode({ execute = name, arguments = args }) .. "\n"
      if with_fd then
        local ok, err = core.send_with_fd(pipe:fileno(), line, with_fd)
        if not ok then table.remove(q.waiters); cb(nil, err) end
      else
        pipe:write(line)
      end
    end)
  end
  function q.close() if not pipe:is_closing() then pipe:close() end end
  -- the greeting, then capabilities negotiation
  local timer
  if timeout_ms then
    timer = uv.new_timer()
    timer:start(timeout_ms, 0, function() fail_all("QEMU's monitor did not answer in time") end)
  end
  local g, gerr = q.cmd(nil)
  if timer then timer:close() end
  if not g then q.close(); return nil, gerr end
  local c, cerr = q.cmd("qmp_capabilities")
  if not c then q.close(); return nil, cerr end
  return q
end

-- Polls QMP until pred(reply of cmd) is true (bounded: ms, a poll every
-- step_ms).
local function qmp_until(q, cmd, pred, ms, step_ms)
  step_ms = step_ms or 10
  for _ = 1, ms // step_ms do
    local r, err = q.cmd(cmd)
    if not r then return nil, err end
    local done, ferr = pred(r)
    if done then return r end
    if ferr then return nil, ferr end
    async.sleep(step_ms)
  end
  return nil, cmd .. ": timed out"
end


--- Opens a QMP client on the socket fd (or a connected pipe): q.cmd(name,
-- args, with_fd) -> the return value, or nil, err; q.close().  timeout_ms:
-- a bound on the greeting.  Returns q or nil, err.
M.open = qmp_open

--- Connects to the monitor socket at path (QEMU listens; a restarted
-- daemon's way back to a VM's monitor) and opens a QMP client on it,
-- the greeting bounded by timeout_ms.  Returns q or nil, err.
function M.connect(path, timeout_ms)
  local pipe = uv.new_pipe(false)
  local err = async.wait(function(cb) pipe:connect(path, function(e) cb(e) end) end)
  if err then pipe:close(); return nil, "connect to " .. path .. ": " .. tostring(err) end
  return qmp_open(pipe, timeout_ms)
end

--- Polls q until pred(reply of cmd) is true (bounded: ms, a poll every
-- step_ms).  Returns the reply or nil, err.
M.until_ready = qmp_until

return M
