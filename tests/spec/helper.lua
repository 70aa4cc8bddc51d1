--- Test helpers: run coroutines to completion on the luv loop, start a real
-- daemon in a private temp dir, run the tupper CLI, decode base64.
local uv = require("luv")
local async = require("tupper.util.async")
local client = require("tupper.wire.client")

local M = {}

M.BIN = os.getenv("TUPPER_BIN") or "build/tupper"
M.ROOT = os.getenv("TUPPER_ROOT") or "."
M.TIMEOUT_MS = 30000

--- The loop's time, brought up to date first: uv.now() alone is the time
-- the loop last ran, which is stale after a test spent a while outside it
-- (io.popen, os.execute), and a deadline taken from it would expire early.
function M.now()
  uv.update_time()
  return uv.now()
end

--- Runs fn(...) in a coroutine and drives the loop until it returns.
function M.sync(fn, ...)
  local res
  local args = table.pack(...)
  async.spawn(function() res = table.pack(fn(table.unpack(args, 1, args.n))) end)
  local deadline = M.now() + M.TIMEOUT_MS
  local guard = uv.new_timer()
  guard:start(100, 100, function() end) -- wakes uv.run("once") to check the deadline
  while not res do
    uv.run("once")
    if M.now() > deadline then
      guard:close()
      error("timed out", 2)
    end
  end
  guard:close()
  return table.unpack(res, 1, res.n)
end

--- The live processes of box `id` (those in its cgroup), as a count and a
-- listing.  Zombies do not count: an orphaned agent (after a daemon crash)
-- is reaped by the host's init in its own time.
function M.box_pids(id)
  local p = io.popen("for f in /proc/[0-9]*/cgroup; do grep -q '" .. id .. "' $f 2>/dev/null && " ..
    "{ d=${f%/cgroup}; grep -q '^State:.*Z' $d/status 2>/dev/null || echo ${d#/proc/}; }; done")
  local n, text = 0, p:read("a")
  p:close()
  for _ in text:gmatch("[^\n]+") do n = n + 1 end
  return n, text
end

--- c:call(method, params) driven to completion: result, or nil and error.
function M.call(c, method, params)
  return M.sync(function() return c:call(method, params) end)
end

--- Closes every handle still open and runs the loop until they are gone:
-- call at the end of a spec file so the Lua state closes with no live handle.
function M.drain()
  uv.walk(function(h) if not h:is_closing() then h:close() end end)
  uv.run()
end

function M.tmpdir()
  local base = os.getenv("TMPDIR") or "/tmp"
  return assert(uv.fs_mkdtemp(base .. "/tupper-spec-XXXXXX"))
end

function M.rmrf(path)
  os.execute("rm -rf '" .. path .. "'")
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end
M.read_file = read_file

--- Starts `tupper daemon` on a private socket and state dir.  Returns a
-- daemon object: socket, state, dir, pid, stop().
function M.start_daemon(dir, opts)
  dir = dir or M.tmpdir()
  opts = opts or {}
  local d = { dir = dir, socket = dir .. "/tupper.sock", state = dir .. "/state", log = dir .. "/daemon.log" }
  local args = { "daemon", "--socket", d.socket, "--state-dir", d.state, "--log", d.log }
  if opts.pool then
    args[#args + 1] = "--pool"
    args[#args + 1] = tostring(opts.pool)
  end
  if opts.policy then
    args[#args + 1] = "--policy"
    args[#args + 1] = opts.policy
  end
  for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
  -- opts.env: the daemon's whole environment ("K=V" list), else this one's
  -- a daemon killed by a signal (an abort on heap corruption, a SIGSEGV)
  -- exits with "code" 0: report it as a shell does, 128 + signal, so that
  -- no test takes a crash for a clean stop
  local handle, pid = uv.spawn(M.BIN, { args = args, env = opts.env }, function(code, signal)
    d.signal = signal ~= 0 and signal or nil
    d.exit_code = d.signal and 128 + signal or code
  end)
  assert(handle, pid)
  d.handle, d.pid = handle, pid
  M.sync(function()
    local deadline = M.now() + 30000 -- a re-adopting daemon on a loaded machine takes seconds
    while M.now() < deadline do
      -- the socket answers (a crashed daemon may have left a stale file)
      local probe = uv.new_pipe(false)
      local err = async.wait(function(cb) probe:connect(d.socket, function(e) cb(e) end) end)
      probe:close()
      if not err then return end
      if d.exit_code then break end
      async.sleep(5)
    end
    error("daemon did not start: " .. tostring(read_file(d.log)))
  end)
  function d.connect()
    return M.sync(client.connect, { socket = d.socket, autostart = false })
  end
  --- SIGKILLs the daemon (a crash): its boxes stay; the dir is kept.
  function d.crash()
    uv.kill(d.pid, "sigkill")
    M.sync(function()
      while not d.exit_code do async.sleep(5) end
    end)
    d.handle:close()
  end
  function d.stop()
    if not d.exit_code then
      uv.kill(d.pid, "sigterm")
      M.sync(function()
        while not d.exit_code do async.sleep(5) end
      end)
    end
    d.handle:close()
    M.rmrf(dir)
    return d.exit_code
  end
  return d
end

--- Runs the tupper CLI; returns exit code, stdout, stderr.  opts: stdin
-- (string), env (list of "K=V"), cwd, args before the verb.
function M.cli(args, opts)
  opts = opts or {}
  local out, err = {}, {}
  local stdout, stderr = uv.new_pipe(false), uv.new_pipe(false)
  local stdin = opts.stdin and uv.new_pipe(false) or nil
  local code, done
  local env = opts.env
  local handle, perr = uv.spawn(M.BIN, { args = args, env = env, cwd = opts.cwd, stdio = { stdin, stdout, stderr } },
    function(c, sig) code = sig ~= 0 and 128 + sig or c end)
  assert(handle, perr)
  local open = 2
  local function reader(t) return function(e, chunk)
    if chunk then t[#t + 1] = chunk else open = open - 1 end
  end end
  stdout:read_start(reader(out))
  stderr:read_start(reader(err))
  if stdin then
    stdin:write(opts.stdin)
    stdin:shutdown(function() stdin:close() end)
  end
  local deadline = M.now() + M.TIMEOUT_MS
  local guard = uv.new_timer()
  guard:start(100, 100, function() end)
  while (code == nil or open > 0) and M.now() < deadline do uv.run("once") end
  guard:close()
  done = code ~= nil
  if not done then uv.process_kill(handle, "sigkill") end
  handle:close()
  stdout:close()
  stderr:close()
  uv.run("nowait") -- let the close callbacks run
  assert(done, "tupper " .. table.concat(args, " ") .. " timed out")
  return code, table.concat(out), table.concat(err)
end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local REV = {}
for i = 1, 64 do REV[B64:byte(i)] = i - 1 end

function M.b64decode(s)
  local out = {}
  for i = 1, #s, 4 do
    local a, b, c, d = s:byte(i, i + 3)
    local n = REV[a] << 18 | REV[b] << 12 | (REV[c] or 0) << 6 | (REV[d] or 0)
    out[#out + 1] = string.char(n >> 16 & 255)
    if c ~= 61 then out[#out + 1] = string.char(n >> 8 & 255) end
    if d ~= 61 then out[#out + 1] = string.char(n & 255) end
  end
  return table.concat(out)
end

function M.b64encode(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = a << 16 | (b or 0) << 8 | (c or 0)
    local function ch(k) return B64:sub((n >> k & 63) + 1, (n >> k & 63) + 1) end
    out[#out + 1] = ch(18) .. ch(12) .. (b and ch(6) or "=") .. (c and ch(0) or "=")
  end
  return table.concat(out)
end

--- Runs a command in a sandbox through the API and collects its output.
-- Returns { stdout, stderr, exit_code, signal }.
function M.run(c, sandbox, argv, opts)
  opts = opts or {}
  local out, err = {}, {}
  local exit, waiter, pid
  c:on("process.output", function(p)
    if p.sandbox ~= sandbox or p.pid ~= pid then return end
    local data = p.encoding == "utf8" and p.data or M.b64decode(p.data)
    if p.stream == "stdout" then out[#out + 1] = data else err[#err + 1] = data end
  end)
  c:on("process.exit", function(p)
    if p.sandbox == sandbox and p.pid == pid then
      exit = p
      if waiter then waiter() end
    end
  end)
  local params = { sandbox = sandbox, argv = argv, encoding = "utf8", env = opts.env, cwd = opts.cwd,
                   stdin = opts.stdin ~= nil, user = opts.user }
  if type(argv) == "string" then params.argv, params.cmd = nil, argv end
  local r, e = c:call("process.start", params)
  if not r then return nil, e end
  pid = r.pid
  if opts.stdin then
    assert(c:call("process.stdin", { sandbox = sandbox, pid = pid, data = opts.stdin, encoding = "utf8" }))
    assert(c:call("process.close_stdin", { sandbox = sandbox, pid = pid }))
  end
  if not exit then async.wait(function(cb) waiter = cb end) end
  return { stdout = table.concat(out), stderr = table.concat(err), exit_code = exit.exit_code,
           signal = exit.signal, pid = pid }
end

return M
