--- Test helpers: run coroutines to completion on the luv loop, start a real
-- daemon in a private temp dir, run the tupper CLI, decode base64; and a
-- record of what they started, which M.cleanup_all releases after each spec
-- file (tests/spec/cleanup.lua) whatever the file's tests left.
local uv = require("luv")
local async = require("tupper.util.async")
local client = require("tupper.wire.client")
local luassert = require("luassert")

local M = {}

M.BIN = os.getenv("TUPPER_BIN") or "build/tupper"
M.ROOT = os.getenv("TUPPER_ROOT") or "."
M.TIMEOUT_MS = 30000
-- how long a daemon may take to listen (start_daemon)
M.START_MS = 90000
-- how long a wait for what a daemon or a box does in the background (a
-- process ending, a box removed, a port listening) may take: a loaded
-- 2-core machine takes seconds for what an idle one does in milliseconds
M.WAIT_MS = 20000

--- The loop's time, brought up to date first: uv.now() alone is the time
-- the loop last ran, which is stale after a test spent a while outside it
-- (io.popen, os.execute), and a deadline taken from it would expire early.
function M.now()
  uv.update_time()
  return uv.now()
end

--- Calls fn() every step ms (default 10) until it returns a true value,
-- for at most ms (default M.WAIT_MS) of wall time, not a count of tries;
-- returns that value, or what fn returned last.  In a coroutine (inside
-- M.sync).  A wait that is met returns at once: a generous bound costs
-- nothing when things go well.
function M.poll(fn, ms, step)
  local deadline = M.now() + (ms or M.WAIT_MS)
  while true do
    local v = table.pack(fn())
    if v[1] or M.now() >= deadline then return table.unpack(v, 1, v.n) end
    async.sleep(step or 10)
  end
end

--- Waits (driving the loop) up to ms (default M.WAIT_MS) for path to be
-- gone; true once it is.  A killed box's files and cgroups are removed
-- just after sandbox.kill answers (docs/protocol.md), so a test that
-- checks them waits for them, boundedly.
function M.path_gone(path, ms)
  return M.sync(function()
    local deadline = M.now() + (ms or M.WAIT_MS)
    while uv.fs_stat(path) and M.now() < deadline do async.sleep(10) end
    return uv.fs_stat(path) == nil
  end)
end

--- Runs fn(...) in a coroutine and drives the loop until it returns.
function M.sync(fn, ...)
  return M.sync_for(M.TIMEOUT_MS, fn, ...)
end

--- M.sync with a deadline of its own (ms), for a wait that is known to be
-- longer than TIMEOUT_MS and reports its own, clearer, error first.
function M.sync_for(ms, fn, ...)
  local res
  local args = table.pack(...)
  async.spawn(function() res = table.pack(fn(table.unpack(args, 1, args.n))) end)
  local deadline = M.now() + ms
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

--- For an after_each of a block whose tests share one daemon: kills every
-- sandbox client c's daemon lists but those named in keep (a set of ids),
-- so a test that failed before its own kill does not leave its box to the
-- next tests.  Returns how many it killed.
function M.kill_sandboxes(c, keep)
  keep = keep or {}
  local r = M.call(c, "sandbox.list", {})
  local n = 0
  for _, sb in ipairs(r and r.sandboxes or {}) do
    if not keep[sb.id] then
      M.call(c, "sandbox.kill", { id = sb.id })
      n = n + 1
    end
  end
  return n
end

--- Closes every handle still open and runs the loop until they are gone:
-- call at the end of a spec file so the Lua state closes with no live handle.
function M.drain()
  uv.walk(function(h) if not h:is_closing() then h:close() end end)
  uv.run()
end

-- What this spec file started through the helper: daemons (in start
-- order), temp dirs and other processes (M.track).  busted insulates each
-- spec file, so each file has its own copy of this module and of this
-- record; M.cleanup_all runs at the file's end.
local started = { daemons = {}, dirs = {}, procs = {} }

function M.tmpdir()
  local base = os.getenv("TMPDIR") or "/tmp"
  local dir = assert(uv.fs_mkdtemp(base .. "/tupper-spec-XXXXXX"))
  started.dirs[#started.dirs + 1] = dir
  return dir
end

--- Records a process a test spawned itself ({ pid, handle, exit_code } as
-- its exit callback sets it), for M.cleanup_all to end if it still runs.
function M.track(proc, name)
  proc.name = proc.name or name
  started.procs[#started.procs + 1] = proc
  return proc
end

--- The tag a daemon on state dir `state` gives its boxes' cgroups
-- (<tag>-<box id>): FNV-1a of the dir's real path, as the daemon computes it.
function M.cgroup_tag(state)
  local path = uv.fs_realpath(state) or state
  local h = 0xcbf29ce484222325
  for i = 1, #path do
    h = (h ~ path:byte(i)) * 0x100000001b3
  end
  return ("%08x"):format(h & 0xffffffff)
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

-- Runs the loop until proc.exit_code is set (its exit callback ran) or ms
-- have passed; true if it exited.
local function wait_exit(proc, ms)
  local deadline = M.now() + ms
  local guard = uv.new_timer()
  guard:start(50, 50, function() end)
  while proc.exit_code == nil and M.now() < deadline do uv.run("once") end
  guard:close()
  uv.run("nowait")
  return proc.exit_code ~= nil
end

-- Ends a process we spawned: SIGTERM, up to ms for it to exit, then
-- SIGKILL.  Returns "stopped" or "killed" (nil if it had already exited).
local function end_process(proc, ms)
  local how
  if proc.exit_code == nil then
    how = "stopped"
    uv.kill(proc.pid, "sigterm")
    if not wait_exit(proc, ms) then
      how = "killed"
      uv.kill(proc.pid, "sigkill")
      wait_exit(proc, 5000)
    end
  end
  if proc.handle and not proc.handle:is_closing() then proc.handle:close() end
  return how
end

--- Starts `tupper daemon` on a private socket and state dir.  Returns a
-- daemon object: socket, state, dir, pid, tag (of its cgroups), stop(),
-- crash().  It is recorded for M.cleanup_all.
function M.start_daemon(dir, opts)
  dir = dir or M.tmpdir()
  opts = opts or {}
  local d = { dir = dir, socket = dir .. "/tupper.sock", state = dir .. "/state", log = dir .. "/daemon.log",
              opts = opts }
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
  -- this daemon's own "listening on" line: the one before it on this dir
  -- (crashed) may have left its socket file, and a connect must reach the
  -- new daemon's listener, not the old one's (a box's set-up child no
  -- longer holds that: it closes the daemon's fds first, test_box)
  local function listening()
    local n = 0
    for _ in (read_file(d.log) or ""):gmatch("listening on ") do n = n + 1 end
    return n
  end
  local before = listening()
  local handle, pid = uv.spawn(M.BIN, { args = args, env = opts.env }, function(code, signal)
    d.signal = signal ~= 0 and signal or nil
    d.exit_code = d.signal and 128 + signal or code
  end)
  assert(handle, pid)
  d.handle, d.pid = handle, pid
  started.daemons[#started.daemons + 1] = d
  -- a re-adopting daemon re-attaches to every box before it listens: on a
  -- loaded machine, with microVMs under TCG, that takes tens of seconds.
  -- Its own deadline comes first, and its error carries the daemon's log.
  M.sync_for(M.START_MS + 5000, function()
    local deadline = M.now() + M.START_MS
    while M.now() < deadline do
      -- the socket answers (a crashed daemon may have left a stale file)
      local err = "not listening yet"
      if listening() > before then
        local probe = uv.new_pipe(false)
        err = async.wait(function(cb) probe:connect(d.socket, function(e) cb(e) end) end)
        probe:close()
      end
      if not err then return end
      if d.exit_code then break end
      async.sleep(5)
    end
    error("daemon did not start: " .. tostring(read_file(d.log)))
  end)
  d.tag = M.cgroup_tag(d.state)
  function d.connect()
    return M.sync(client.connect, { socket = d.socket, autostart = false })
  end
  --- SIGKILLs the daemon (a crash): its boxes stay; the dir is kept.
  function d.crash()
    d.crashed = true
    uv.kill(d.pid, "sigkill")
    M.sync(function()
      while not d.exit_code do async.sleep(5) end
    end)
    if not d.handle:is_closing() then d.handle:close() end
  end
  --- SIGTERMs the daemon (its boxes are destroyed), waits, removes its dir;
  -- returns its exit code.  Safe to call again, and after crash().
  function d.stop()
    if not d.exit_code then
      uv.kill(d.pid, "sigterm")
      M.sync(function()
        while not d.exit_code do async.sleep(5) end
      end)
    end
    if not d.handle:is_closing() then d.handle:close() end
    -- a daemon killed by a signal leaves its btrfs pool mounted for the
    -- next one (docs/limits.md): none comes, so unmount it as an admin would
    if d.signal then
      for line in (read_file("/proc/self/mountinfo") or ""):gmatch("[^\n]+") do
        local point = line:match("^%S+ %S+ %S+ %S+ (%S+)")
        if point == d.state .. "/pool" then os.execute("umount -l '" .. point .. "'") end
      end
    end
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
-- Returns { stdout, stderr, exit_code, signal, pid, exit (the process.exit
-- notification) }.
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
           signal = exit.signal, pid = pid, exit = exit }
end

--- M.run from outside a coroutine, for a test that wants the process's
-- exit as the daemon told it: M.run's table (its `exit` the process.exit
-- notification).  Raises if the process does not start.
function M.run_exit(c, id, argv)
  local r, err = M.sync(M.run, c, id, argv)
  assert(r, err and err.message)
  return r
end

--- Runs a host command (argv[1] found on PATH) in its own process group,
-- bounded by opts.ms: opts.cwd, opts.env (a "K=V" list: its whole
-- environment; nil: this one's).  Past the bound the group gets SIGTERM,
-- 15 s, then SIGKILL (the runner, its tests and what they started: all of
-- them).  Returns its exit code (128 + signal when killed) and its stdout
-- and stderr together.
function M.run_host(argv, opts)
  local out = {}
  local stdout, stderr = uv.new_pipe(false), uv.new_pipe(false)
  local code
  local args = {}
  for i = 2, #argv do args[#args + 1] = argv[i] end
  local handle, pid = uv.spawn(argv[1], { args = args, cwd = opts.cwd, env = opts.env,
    stdio = { nil, stdout, stderr }, detached = true }, function(c, sig) code = sig ~= 0 and 128 + sig or c end)
  assert(handle, pid)
  local open = 2
  local function reader(_, chunk) if chunk then out[#out + 1] = chunk else open = open - 1 end end
  stdout:read_start(reader)
  stderr:read_start(reader)
  local deadline = M.now() + opts.ms
  local guard = uv.new_timer()
  guard:start(1000, 1000, function() end)
  while (code == nil or open > 0) and M.now() < deadline do uv.run("once") end
  guard:close()
  if code == nil then
    uv.kill(-pid, "sigterm")
    local grace = M.now() + 15000
    while code == nil and M.now() < grace do uv.run("once") end
    uv.kill(-pid, "sigkill")
    while code == nil do uv.run("once") end
  end
  handle:close()
  if not stdout:is_closing() then stdout:close() end
  if not stderr:is_closing() then stderr:close() end
  uv.run("nowait")
  return code, table.concat(out)
end

--- For a block's setup: starts a daemon (M.start_daemon(dir, opts)) and
-- connects to it.  Returns the daemon and the client.
function M.daemon_and_client(dir, opts)
  local d = M.start_daemon(dir, opts)
  return d, assert(d.connect())
end

--- For the teardown of a block whose tests share daemon d and client c
-- (either nil when the setup failed): kills c's sandboxes, closes c, stops
-- d and asserts that it exited 0.
function M.stop_daemon_and_client(d, c)
  if c then M.kill_sandboxes(c); c:close() end
  if d then luassert.are.equal(0, d.stop()) end
end

--- For a block that drives a daemon through the Lua SDK (tupper.sdk, the
-- module sdk): starts one (pool 0) and points the SDK at it.  Returns the
-- daemon.
function M.sdk_daemon(sdk)
  local d = M.start_daemon(nil, { pool = 0 })
  sdk.configure({ socket = d.socket, autostart = false })
  return d
end

--- The teardown of such a block: kills the SDK's sandboxes, runs tidy (for
-- what else the block made), closes the SDK, each of them whatever a
-- failure left; then stops d.  Returns d.stop()'s exit code (nil without d).
function M.sdk_teardown(sdk, d, tidy)
  pcall(function() for _, s in ipairs(sdk.list()) do sdk.kill(s.id) end end)
  if tidy then pcall(tidy) end
  pcall(sdk.close)
  return d and d.stop()
end

--- A state dir that daemons use one after another, for the blocks that
-- SIGKILL a daemon and check what the next one makes of what it left.
-- Hook it in with setup(r.setup), after_each(r.after_each) and
-- teardown(r.teardown); in a test, `d, c = r.start()` starts a daemon on
-- the dir (opts: M.start_daemon's, default { pool = 0 }) and connects,
-- `d, c = r.restart(c)` closes c, SIGKILLs the daemon and starts the next.
function M.restarts(opts)
  local r = { opts = opts or { pool = 0 } }
  function r.setup() r.dir = M.tmpdir() end
  -- a test that fails between a crash and the restart leaves boxes that no
  -- daemon owns: release restarts a daemon on that state dir to stop them
  function r.after_each() M.release(r.d) end
  function r.teardown()
    M.rmrf(r.dir)
    M.drain()
  end
  --- A daemon on the dir, released after each test.  Returns d.
  function r.daemon()
    r.d = M.start_daemon(r.dir, r.opts)
    return r.d
  end
  function r.start()
    local d = r.daemon()
    return d, assert(d.connect())
  end
  function r.restart(c)
    if c then c:close() end
    r.d.crash()
    return r.start()
  end
  --- A daemon a test started otherwise (on another dir): after_each
  -- releases it instead.  Returns d.
  function r.track(d)
    r.d = d
    return d
  end
  return r
end

-- Is path dir itself or below it?
local function under(path, dir)
  return path == dir or path:sub(1, #dir + 1) == dir .. "/"
end

local function alive(pid)
  local stat = read_file("/proc/" .. pid .. "/stat")
  return stat ~= nil and stat:match("^%d+ %b() (%a)") ~= "Z"
end

-- `tupper daemon` processes not started through M.start_daemon (the CLI
-- starts one with --autostart, as tupper-core: the binary it runs in)
-- whose command line names a path under one of dirs:
-- { pid, tag (of its cgroups, if it names its state dir) }.
local function foreign_daemons(dirs, known)
  local found = {}
  local scan = uv.fs_scandir("/proc")
  while scan do
    local name = uv.fs_scandir_next(scan)
    if not name then break end
    local pid = tonumber(name)
    if pid and not known[pid] then
      local argv, is_daemon, mine = {}, false, false
      for a in (read_file("/proc/" .. name .. "/cmdline") or ""):gmatch("[^%z]+") do argv[#argv + 1] = a end
      local state
      if argv[1] and (argv[1]:match("tupper$") or argv[1]:match("tupper%-core$")) then
        for i = 2, #argv do
          if argv[i] == "daemon" then is_daemon = true end
          if argv[i - 1] == "--state-dir" then state = argv[i] end
          for _, dir in ipairs(dirs) do mine = mine or under(argv[i], dir) end
        end
      end
      if is_daemon and mine then found[#found + 1] = { pid = pid, tag = state and M.cgroup_tag(state) } end
    end
  end
  return found
end

-- Kills what is left in the cgroups of daemon tag `tag` (a box whose daemon
-- can no longer destroy it) and removes them; returns how many boxes had
-- cgroups (one per controller on cgroup v1).
local function sweep_cgroups(tag)
  local p = io.popen("find /sys/fs/cgroup -mindepth 1 -maxdepth 6 -type d -name '" .. tag .. "-*' 2>/dev/null")
  local tops, boxes, n = {}, {}, 0
  for line in p:lines() do
    tops[#tops + 1] = line
    local name = line:match("[^/]+$")
    if not boxes[name] then boxes[name] = true; n = n + 1 end
  end
  p:close()
  for _, top in ipairs(tops) do
    p = io.popen("find '" .. top .. "' -depth -type d 2>/dev/null")
    for cg in p:lines() do
      for file, value in pairs({ ["freezer.state"] = "THAWED", ["cgroup.freeze"] = "0" }) do
        local f = io.open(cg .. "/" .. file, "w")
        if f then f:write(value); f:close() end
      end
      for pid in (read_file(cg .. "/cgroup.procs") or ""):gmatch("%d+") do uv.kill(tonumber(pid), "sigkill") end
    end
    p:close()
  end
  for _, top in ipairs(tops) do
    local deadline = M.now() + 10000 -- the killed take a moment to leave
    repeat
      os.execute("find '" .. top .. "' -depth -type d -exec rmdir {} + 2>/dev/null")
      if not uv.fs_stat(top) then break end
      uv.sleep(20)
    until M.now() >= deadline
  end
  return n
end

-- Stops daemons (in start order) and the boxes they leave: each still
-- running is stopped (SIGTERM, which destroys its boxes; SIGKILL after a
-- bound); a state dir whose last daemon is gone (crashed, or killed) with
-- boxes still in it gets a daemon started on it again, re-adopting them,
-- and stopped, so they go too.  note(fmt, ...) hears what was done.
local function release_daemons(list, note)
  note = note or function() end
  local latest, order = {}, {}
  for _, d in ipairs(list) do
    if not latest[d.state] then order[#order + 1] = d.state end
    latest[d.state] = d
    local how = end_process(d, 30000)
    if how then note("%s daemon %d (%s)", how, d.pid, d.dir) end
  end
  for _, state in ipairs(order) do
    local d = latest[state]
    local scan = uv.fs_scandir(state .. "/boxes")
    if scan and uv.fs_scandir_next(scan) then
      local ok, d2 = pcall(M.start_daemon, d.dir, d.opts)
      if ok then
        end_process(d2, 30000)
        note("restarted and stopped daemon %d's state (%s) for its boxes", d.pid, d.dir)
      else
        note("could not restart daemon %d's state (%s): %s", d.pid, d.dir, tostring(d2))
      end
    end
  end
end

--- For a test's finally or a block's teardown: releases daemons d1, d2, ...
-- (nil ones skipped) whatever state a failure left them in, as
-- release_daemons above (a crashed daemon's boxes included), and removes
-- their dirs.  Daemons already stopped cost nothing.
function M.release(...)
  local args, list = table.pack(...), {}
  for i = 1, args.n do
    if args[i] then list[#list + 1] = args[i] end
  end
  release_daemons(list)
  for _, d in ipairs(list) do M.rmrf(d.dir) end
end

--- Releases whatever this spec file started through the helper and is still
-- there, as a failed test leaves it: tracked processes and running daemons
-- are stopped (SIGTERM, which destroys a daemon's boxes; SIGKILL after a
-- bound); a daemon that crashed (d.crash(), a test's SIGKILL) with boxes in
-- its state dir and no later daemon on that dir is restarted there and
-- stopped, so its boxes go too; a daemon the CLI started on demand under
-- one of the dirs is stopped; cgroups of these daemons' tags still there
-- are emptied and removed; mounts under the dirs are detached and the dirs
-- removed.  Returns a list of what it had to do (empty: nothing was left).
function M.cleanup_all()
  local done = {}
  local function note(fmt, ...) done[#done + 1] = fmt:format(...) end
  local rec = started
  started = { daemons = {}, dirs = {}, procs = {} }

  for _, p in ipairs(rec.procs) do
    local how = end_process(p, 5000)
    if how then note("%s process %d (%s)", how, p.pid, p.name or "tracked") end
  end
  local dirs, known = {}, {}
  for _, dir in ipairs(rec.dirs) do dirs[#dirs + 1] = dir end -- parents before the daemons' dirs in them
  for _, d in ipairs(rec.daemons) do
    known[d.pid] = true
    dirs[#dirs + 1] = d.dir
  end
  release_daemons(rec.daemons, note)
  local tags = {}
  for _, f in ipairs(foreign_daemons(dirs, known)) do
    local pid = f.pid
    if f.tag then tags[#tags + 1] = { tag = f.tag, pid = pid } end
    uv.kill(pid, "sigterm")
    local deadline = M.now() + 30000
    while alive(pid) and M.now() < deadline do uv.sleep(20) end
    local how = "stopped"
    if alive(pid) then how = "killed"; uv.kill(pid, "sigkill") end
    note("%s daemon %d started outside the helper", how, pid)
  end
  started = { daemons = {}, dirs = {}, procs = {} } -- the restarts' own records
  for _, d in ipairs(rec.daemons) do
    if d.tag then tags[#tags + 1] = { tag = d.tag, pid = d.pid } end
  end
  local swept = {}
  for _, t in ipairs(tags) do
    if not swept[t.tag] then
      swept[t.tag] = true
      local n = sweep_cgroups(t.tag)
      if n > 0 then note("removed the cgroups of %d boxes of daemon %d (tag %s)", n, t.pid, t.tag) end
    end
  end
  local mounts = {}
  for line in (read_file("/proc/self/mountinfo") or ""):gmatch("[^\n]+") do
    local point = line:match("^%S+ %S+ %S+ %S+ (%S+)")
    for _, dir in ipairs(dirs) do
      if point and under(point, dir) then mounts[#mounts + 1] = point end
    end
  end
  for i = #mounts, 1, -1 do
    os.execute("umount -l '" .. mounts[i] .. "' 2>/dev/null")
    note("unmounted %s", mounts[i])
  end
  local removed = 0
  for _, dir in ipairs(dirs) do
    if uv.fs_stat(dir) then
      removed = removed + 1
      os.execute("rm -rf --one-file-system '" .. dir .. "'")
    end
  end
  if removed > 0 then note("removed %d dirs", removed) end
  -- and no handle left open (a failed test's connection): the Lua state
  -- must not close with live handles
  M.drain()
  return done
end


--- Shorthands of the snapshot and pause specs: helper.run to its end, a
-- file of box id read or written as UTF-8 text (read: nil if it fails).
function M.run_sync(c, id, argv) return M.sync(function() return M.run(c, id, argv) end) end

function M.read_text(c, id, path)
  local r = M.call(c, "fs.read", { sandbox = id, path = path, encoding = "utf8" })
  return r and r.data
end

function M.write_text(c, id, path, data)
  assert(M.call(c, "fs.write", { sandbox = id, path = path, data = data, encoding = "utf8" }))
end

--- The error message of a call expected to fail (asserted).
function M.fails(c, method, params)
  local r, err = M.call(c, method, params)
  assert(r == nil, method .. " should have failed")
  return type(err) == "table" and err.message or tostring(err)
end

--- The names in dir, sorted ({} if it cannot be read).
function M.entries(dir)
  local out = {}
  local h = uv.fs_scandir(dir)
  while h do
    local name = uv.fs_scandir_next(h)
    if not name then break end
    out[#out + 1] = name
  end
  table.sort(out)
  return out
end


--- A shell command's exit code and its output (stdout and stderr).
function M.sh_status(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok and 0 or code, out
end

--- A loopback TCP port nothing listens on (bound and released).
function M.free_port()
  local t = uv.new_tcp()
  assert(t:bind("127.0.0.1", 0))
  local port = t:getsockname().port
  t:close()
  return port
end

--- Waits (at most M.WAIT_MS) until something listens on loopback port;
-- raises if not.
function M.wait_port(port)
  M.sync(function()
    local up = M.poll(function()
      local t = uv.new_tcp()
      local err = async.wait(function(cb) t:connect("127.0.0.1", port, function(e) cb(e) end) end)
      t:close()
      return not err
    end, nil, 25)
    if not up then error("nothing listens on port " .. port) end
  end)
end

return M
