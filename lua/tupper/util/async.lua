--- Coroutines over the libuv loop: a request handler runs in its own
-- coroutine and waits for callbacks (agent replies, timers) without blocking
-- the loop.
local uv = require("luv")

local M = {}

local function report(co, ok, err)
  if not ok then
    io.stderr:write("tupper: task failed: ", debug.traceback(co, tostring(err)), "\n")
  end
end

--- Runs fn(...) in a new coroutine now.
function M.spawn(fn, ...)
  local co = coroutine.create(fn)
  report(co, coroutine.resume(co, ...))
  return co
end

--- Waits inside a coroutine until start's callback fires; returns the values
-- given to the callback.  start(cb) must call cb exactly once (it may call it
-- at once).  Outside a coroutine only a callback called at once can be
-- waited for: else it raises, and the callback, when it comes, finds the
-- wait gone (it used to resume the main thread: "cannot resume
-- non-suspended coroutine").
function M.wait(start)
  local co, main = coroutine.running()
  local sync, done, res = true, false, nil
  start(function(...)
    if done then return end
    done = true
    if sync then
      res = table.pack(...)
    else
      report(co, coroutine.resume(co, ...))
    end
  end)
  sync = false
  if res then return table.unpack(res, 1, res.n) end
  if main or not coroutine.isyieldable() then
    done = true
    error("async.wait outside a coroutine", 2)
  end
  return coroutine.yield()
end

--- Runs every function of fns in a coroutine of its own, side by side, and
-- waits inside a coroutine until all of them returned.  A function that
-- raises is reported like a failed spawn and counts as returned.
function M.all(fns)
  if #fns == 0 then return end
  return M.wait(function(cb)
    local left = #fns
    for _, fn in ipairs(fns) do
      M.spawn(function()
        local ok, err = pcall(fn)
        if not ok then report(coroutine.running(), false, err) end
        left = left - 1
        if left == 0 then cb() end
      end)
    end
  end)
end

--- Sleeps ms milliseconds inside a coroutine.
function M.sleep(ms)
  return M.wait(function(cb)
    local t = uv.new_timer()
    t:start(ms, 0, function() t:close(); cb() end)
  end)
end

return M
