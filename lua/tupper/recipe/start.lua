--- A recipe's start command and ready check (the recipe field `start`,
-- docs/recipes.md): at every create from the recipe the command is started
-- in the background (as the sandbox's user, in its workdir, with its env;
-- owned by no connection, so it outlives the create and shows in
-- process.list), then the ready check is run until it exits 0.  The create
-- waits for that, at most start.timeout seconds; a start command that dies
-- first, or a check that never passes, fails the create with their output.
-- Runs in the create's coroutine on the daemon's loop.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local policy = require("tupper.recipe.policy")

local M = {}

M.INTERVAL = 200 -- ms between two runs of the ready check
M.TAIL = 2048    -- bytes of output an error quotes

-- The last M.TAIL bytes of s, marked when cut.
local function tail(s)
  if #s <= M.TAIL then return s end
  return "..." .. s:sub(-M.TAIL)
end

-- Starts `/bin/sh -c cmd` in sb and collects its output (the tail) and its
-- exit through a listener of its own (as process.connect attaches one).
-- Returns the process and its collector, or nil, err.
local function spawn(sb, cmd, policies)
  -- judged (and maybe rewritten) by the policies binding the sandbox, as
  -- every process.start is
  local argv = { "/bin/sh", "-c", cmd }
  for _, pol in ipairs(policies or {}) do
    local out, perr = policy.check_exec(pol, argv)
    if not out then return nil, perr end
    argv = out
  end
  local proc, err = sb:exec(argv, nil, nil, false, nil, nil)
  if not proc then return nil, err end
  local col = { parts = {}, n = 0 }
  local l = { closed = false }
  function l.notify(_, method, msg)
    if method == "process.output" then
      local data = msg.encoding == "base64" and core.b64decode(msg.data) or msg.data or ""
      col.parts[#col.parts + 1] = data
      col.n = col.n + #data
      while col.n > 4 * M.TAIL and #col.parts > 1 do col.n = col.n - #table.remove(col.parts, 1) end
    elseif method == "process.exit" then
      col.exited = true
      if col.waiter then local w = col.waiter; col.waiter = nil; w() end
    end
  end
  proc.listeners = proc.listeners or {}
  proc.listeners[l] = "base64"
  col.listener = l
  -- the output that came before the listener did (the ring) is kept too
  for _, chunk in ipairs(proc.ring or {}) do col.parts[#col.parts + 1] = chunk.data end
  if proc.exit_code ~= nil then col.exited = true end
  return proc, col
end

local function output(col) return tail(table.concat(col.parts)) end

local function detach(proc, col)
  col.listener.closed = true
  if proc.listeners then proc.listeners[col.listener] = nil end
end

-- Waits until the process of col exits or ms pass; true when it exited.
local function wait_exit(col, ms)
  if col.exited then return true end
  local timer = uv.new_timer()
  async.wait(function(cb)
    local done = false
    local function once() if not done then done = true; cb() end end
    col.waiter = once
    timer:start(math.max(1, math.ceil(ms)), 0, once)
  end)
  col.waiter = nil
  timer:stop()
  timer:close()
  return col.exited == true
end

local function code_of(proc)
  if proc.signal and proc.signal > 0 then return "signal " .. proc.signal end
  return "exit code " .. tostring(proc.exit_code)
end

--- Starts spec.cmd in sb and waits for spec.ready (both optional, at least
-- one given), within spec.timeout seconds; policies (those binding the
-- sandbox) judge both commands, as they judge process.start.  Returns true, or nil, err: what
-- failed, with the check's and the start command's output.  The caller
-- destroys the box on failure.
function M.run(sb, spec, policies)
  local deadline = uv.now() + spec.timeout * 1000
  local sproc, scol
  if spec.cmd then
    sproc, scol = spawn(sb, spec.cmd, policies)
    if not sproc then return nil, ("start command %q: cannot start: %s"):format(spec.cmd:sub(1, 200), tostring(scol)) end
    sb.start_pid = sproc.pid
  end
  local function start_out()
    if not scol then return "" end
    local o = output(scol)
    return o ~= "" and ("\nthe start command's output:\n" .. o) or ""
  end
  local function finish(ok, err)
    if scol then detach(sproc, scol) end
    return ok, err
  end
  if not spec.ready then return finish(true) end
  local last
  while true do
    if sb.state ~= "running" then
      return finish(nil, ("start: the sandbox went away (%s)"):format(tostring(sb.down_reason or sb.state)))
    end
    if scol and scol.exited and sproc.exit_code ~= 0 then
      return finish(nil, ("start command %q ended (%s) before the ready check %q passed%s")
        :format(spec.cmd:sub(1, 200), code_of(sproc), spec.ready:sub(1, 200), start_out()))
    end
    local rproc, rcol = spawn(sb, spec.ready, policies)
    if not rproc then return finish(nil, ("ready check %q: cannot start: %s"):format(spec.ready:sub(1, 200), tostring(rcol))) end
    local exited = wait_exit(rcol, deadline - uv.now())
    detach(rproc, rcol)
    if not exited then
      sb:signal(rproc, 9)
      last = ("its last run was still going after %d s"):format(spec.timeout)
    elseif rproc.exit_code == 0 and not (rproc.signal and rproc.signal > 0) then
      return finish(true)
    else
      local o = output(rcol)
      last = ("its last run ended with %s%s"):format(code_of(rproc), o ~= "" and (":\n" .. o) or "")
    end
    if uv.now() + M.INTERVAL >= deadline then
      return finish(nil, ("the ready check %q did not pass within %s s: %s%s")
        :format(spec.ready:sub(1, 200), tostring(spec.timeout), last, start_out()))
    end
    async.sleep(M.INTERVAL)
  end
end

return M
