--- The Lua client API, shaped like E2B's SDK: sandboxes, commands and files
-- as plain calls.
--
--     local tupper = require("tupper.sdk")
--     local box = tupper.create{ envs = { FOO = "bar" } }
--     print(box:run("echo $FOO").stdout)
--     box.files:write("/root/a.txt", "hello")
--     box:kill()
--
-- Calls look synchronous.  Inside a coroutine driven by the luv loop (a
-- task of tupper.sdk, or any coroutine of tupper.async) a call yields until
-- the daemon answers; called from the main thread of a plain script, it
-- drives the loop itself until the answer is in.  `run(fn)` runs a whole
-- function as one task.  Errors are Lua errors: "tupper: <what went
-- wrong>".  The module never needs tupper.core: it runs under plain lua5.4
-- with luv as well as inside the tupper binary.
local uv = require("luv")
local async = require("tupper.util.async")
local client = require("tupper.wire.client")
local b64 = require("tupper.util.b64")

local M = {}

M.CHUNK = 1048576 -- raw bytes per fs.read / fs.write call (the protocol's cap)
M.INTERRUPTED = "interrupted"

local conf = {} -- autostart: wire.client decides (off unless TUPPER_AUTOSTART=1)
local conn -- the shared connection to the daemon
local connecting -- waiters while a connect is in flight
local procs = {} -- "sandbox/pid" -> process handle, for notifications

local pack, unpack = table.pack, table.unpack

-- --------------------------------------------------------------- tasks

local tasks = setmetatable({}, { __mode = "k" }) -- coroutine -> task
local waiting = setmetatable({}, { __mode = "k" }) -- coroutine -> wait state
local CANCEL = setmetatable({}, { __tostring = function() return "cancel" end })

local function resume(co, ...)
  local ok, err = coroutine.resume(co, ...)
  if not ok then
    io.stderr:write("tupper: task failed: ", debug.traceback(co, tostring(err)), "\n")
  end
end

--- Starts fn(...) as a task: a coroutine on the luv loop whose outcome is
-- kept.  Returns the task: `done`, then `ok` and `results` (packed) or
-- `err`.  Drive the loop with `drive(task)`, or let others do it.
function M.task(fn, ...)
  local t = { done = false }
  local args = pack(...)
  t.co = coroutine.create(function()
    local r = pack(pcall(fn, unpack(args, 1, args.n)))
    t.done, t.ok = true, r[1]
    if r[1] then t.results = pack(unpack(r, 2, r.n)) else t.err = r[2] end
    if t.on_done then t.on_done(t) end
  end)
  tasks[t.co] = t
  resume(t.co)
  return t
end

--- Runs the loop until task t is done or abandoned (t.abandoned).
function M.drive(t)
  -- uv.run("once") returns early when nothing is active: then the task
  -- waits for something that will never come
  while not t.done and not t.abandoned do
    if not uv.run("once") and not t.done then
      t.abandoned = true
      t.err = "tupper: the task waits for nothing (the loop is empty)"
    end
  end
  return t
end

--- Cancels what task t is waiting for: the call it is in raises
-- "interrupted" inside the task.  Returns false when the task is not in a
-- wait of this module (it is then left to run on).
function M.cancel(t)
  if t.done then return true end
  local st = waiting[t.co]
  if not st then return false end
  st.done = true
  waiting[t.co] = nil
  resume(t.co, CANCEL)
  return true
end

--- Runs fn(...) in a task and drives the loop until it returns; returns its
-- results or raises its error.  Inside a coroutine, just calls fn.
function M.run(fn, ...)
  local co, main = coroutine.running()
  if co and not main and coroutine.isyieldable() then return fn(...) end
  local t = M.drive(M.task(fn, ...))
  if not t.ok then error(t.err, 0) end
  return unpack(t.results, 1, t.results.n)
end

-- Wraps an API function so that it can be called from anywhere.
local function entry(fn)
  return function(...) return M.run(fn, ...) end
end

-- Waits for start's callback, like async.wait, but can be cancelled
-- (M.cancel): it then raises "interrupted" and a late callback is dropped.
local function wait(start)
  local co = coroutine.running()
  local st = { done = false }
  local sync, res = true, nil
  start(function(...)
    if st.done then return end
    st.done = true
    if sync then res = pack(...) else resume(co, ...) end
  end)
  sync = false
  if res then return unpack(res, 1, res.n) end
  waiting[co] = st
  local r = pack(coroutine.yield())
  waiting[co] = nil
  if r[1] == CANCEL then error(M.INTERRUPTED, 0) end
  return unpack(r, 1, r.n)
end

-- ---------------------------------------------------------- connection

local function fail(fmt, ...)
  error("tupper: " .. fmt:format(...), 0)
end

local function decode(data, encoding)
  if encoding == "utf8" then return data end
  return b64.decode(data) or fail("bad base64 from the daemon")
end

local function proc_key(sandbox, pid)
  return tostring(sandbox) .. "/" .. tostring(math.tointeger(pid) or pid)
end

local function on_output(p)
  local h = procs[proc_key(p.sandbox, p.pid)]
  if h then h:_output(p.stream, decode(p.data, p.encoding)) end
end

local function on_exit(p)
  local key = proc_key(p.sandbox, p.pid)
  local h = procs[key]
  if h then
    procs[key] = nil
    h:_exit(p)
  end
end

local function on_close()
  conn = nil
  -- processes of a lost connection will never report: wake their waiters
  local lost = procs
  procs = {}
  for _, h in pairs(lost) do h:_exit({ exit_code = -1, lost = true }) end
end

--- Sets how to reach the daemon: socket, state_dir (for an autostarted
-- daemon), autostart (default: off, unless TUPPER_AUTOSTART=1).  Closes the
-- current connection.
function M.configure(opts)
  conf = { socket = opts.socket, state_dir = opts.state_dir, autostart = opts.autostart }
  M.close()
end

--- The connection to the daemon (a tupper.client), made on first use.
M.client = entry(function()
  if conn then return conn end
  if connecting then
    return wait(function(cb) connecting[#connecting + 1] = cb end) or fail("cannot reach the daemon")
  end
  connecting = {}
  local c, err = wait(function(cb)
    async.spawn(function() cb(client.connect(conf)) end)
  end)
  local waiters = connecting
  connecting = nil
  if c then
    conn = c
    c:on("process.output", on_output)
    c:on("process.exit", on_exit)
    c.on_close = on_close
  end
  for _, cb in ipairs(waiters) do cb(c) end
  if not c then fail("%s", tostring(err)) end
  return c
end)

--- Closes the connection to the daemon (sandboxes keep running).  Call it
-- at the end of a plain script: from the main thread it also runs the loop
-- until the socket is closed.
function M.close()
  if not conn then return end
  local c = conn
  c.on_close = nil
  c:close()
  on_close()
  local co, main = coroutine.running()
  if co and not main then return end
  local stream = c.conn.stream
  -- the shutdown completes at once on a unix socket, then closes it
  for _ = 1, 100 do
    if stream:is_closing() or not uv.run("once") then break end
  end
  uv.run("nowait") -- the close callback
end

-- JSON numbers arrive as floats: whole ones become integers (sizes, pids).
local function integers(v)
  if type(v) == "table" then
    for k, x in pairs(v) do v[k] = integers(x) end
  elseif math.type(v) == "float" then
    return math.tointeger(v) or v
  end
  return v
end

-- Calls method; returns the result or raises "tupper: <message>".  With
-- soft, returns nil, err instead for the errors of the daemon.
local function call(method, params, soft)
  local c = M.client()
  local r, e = wait(function(cb)
    async.spawn(function() cb(c:call(method, params)) end)
  end)
  if r == nil then
    if soft then return nil, e end
    fail("%s", type(e) == "table" and tostring(e.message) or tostring(e))
  end
  return integers(r)
end

-- Calls that need no answer (cleanup after an interrupt).
local function call_later(method, params)
  if conn and not conn.closed then
    conn.conn:send({ jsonrpc = "2.0", method = method, params = params })
  end
end

-- -------------------------------------------------------------- process

local Process = {}
Process.__index = Process
Process.__name = "tupper.Process"

function Process:__tostring()
  return ("<process %d in sandbox %s%s>"):format(self.pid, self.sandbox.id, self.result and ", exited" or "")
end

function Process:_output(stream, data)
  local buf = stream == "stderr" and self._err or self._out
  buf[#buf + 1] = data
  local fn = stream == "stderr" and self._on_stderr or self._on_stdout
  if fn then
    -- in a task of its own: the callback may itself call the API
    M.task(function()
      local ok, err = pcall(fn, data)
      if not ok then io.stderr:write("tupper: output callback: ", tostring(err), "\n") end
    end)
  end
end

function Process:_exit(p)
  local r = { stdout = table.concat(self._out), stderr = table.concat(self._err),
              exit_code = math.tointeger(p.exit_code) or p.exit_code }
  if p.signal and p.signal ~= 0 then r.signal = math.tointeger(p.signal) or p.signal end
  if p.timed_out then r.timed_out = true end
  if p.lost then r.error = "connection to the daemon lost" end
  self.result = r
  local waiters = self._waiters
  self._waiters = {}
  for _, cb in ipairs(waiters) do cb() end
end

local function check_result(cmd, r)
  if r.error then fail("%s: %s", cmd, r.error) end
  if r.exit_code ~= 0 then
    local why = r.signal and ("killed by signal %d"):format(r.signal) or ("exit code %s"):format(r.exit_code)
    if r.timed_out then why = "timed out" end
    local detail = r.stderr:match("[^\n]+")
    fail("command failed (%s): %s%s", why, cmd, detail and ": " .. detail or "")
  end
end

--- Waits until the process exits; returns { stdout, stderr, exit_code,
-- signal?, timed_out? }.  A non-zero exit is a result, not an error, unless
-- the process was started with check = true.
Process.wait = entry(function(self)
  if not self.result then
    wait(function(cb) self._waiters[#self._waiters + 1] = cb end)
  end
  if self.check then check_result(self.cmd, self.result) end
  return self.result
end)

--- Sends a signal to the process's whole tree (default "KILL").
Process.kill = entry(function(self, signal)
  if self.result then return false end
  call("process.signal", { sandbox = self.sandbox.id, pid = self.pid, signal = signal or "KILL" })
  return true
end)

local function sleep(ms)
  wait(function(cb)
    local t = uv.new_timer()
    t:start(ms, 0, function() t:close(); cb() end)
  end)
end

-- Feeds data to a process's stdin in chunks, waiting while the box's
-- queue is full (EAGAIN).
local function send_stdin(sandbox, pid, data)
  if type(data) ~= "string" then fail("send_stdin wants a string") end
  local offset, delay = 0, 5
  while offset < #data do
    local chunk = data:sub(offset + 1, offset + M.CHUNK)
    local r, e = call("process.stdin", { sandbox = sandbox, pid = pid, data = b64.encode(chunk) }, true)
    if r then
      offset, delay = offset + #chunk, 5
    elseif type(e.data) == "table" and e.data.code == "EAGAIN" then
      sleep(delay)
      delay = math.min(delay * 2, 200)
    else
      fail("%s", tostring(e.message))
    end
  end
end

--- Queues data for the process's stdin (started with stdin = true).
Process.send_stdin = entry(function(self, data)
  send_stdin(self.sandbox.id, self.pid, data)
end)

--- Closes the process's stdin once queued data is written.
Process.close_stdin = entry(function(self)
  call("process.close_stdin", { sandbox = self.sandbox.id, pid = self.pid })
end)

-- --------------------------------------------------------------- files

local Files = {}
Files.__index = Files
Files.__name = "tupper.Files"

function Files:__tostring() return ("<files of sandbox %s>"):format(self.sandbox.id) end

-- The encoding the daemon accepts for data: text when it can be text.
local function encode(data)
  if utf8.len(data) and not data:find("\0", 1, true) then return data, "utf8" end
  return b64.encode(data), "base64"
end

local function fs_call(self, method, params, soft)
  params.sandbox = self.sandbox.id
  local r, e = call(method, params, true)
  if r then return r end
  if soft and type(e.data) == "table" and soft[e.data.code] then return nil, e end
  fail("%s", tostring(e.message))
end

-- Every files method takes opts.user: the account of the box it acts as
-- (default root); a relative path is then taken from that account's home.
local function user_of(opts) return type(opts) == "table" and opts.user or nil end

--- Reads a whole file; returns its bytes as a string.  opts: user.
Files.read = entry(function(self, path, opts)
  local parts, offset = {}, 0
  while true do
    local r = fs_call(self, "fs.read", { path = path, offset = offset, length = M.CHUNK, encoding = "utf8",
                                         user = user_of(opts) })
    local data = decode(r.data, r.encoding)
    parts[#parts + 1] = data
    offset = offset + #data
    if r.eof or #data == 0 then break end
  end
  return table.concat(parts)
end)

--- Writes data (a string) to a file, replacing it; missing parent
-- directories are made.  Large data goes in chunks of 1 MiB.  opts: mode,
-- user.  Returns { path, size }.
Files.write = entry(function(self, path, data, opts)
  if type(data) ~= "string" then fail("files:write wants a string") end
  local offset, size = 0, 0
  repeat
    local chunk = data:sub(offset + 1, offset + M.CHUNK)
    local text, enc = encode(chunk)
    local r = fs_call(self, "fs.write", { path = path, data = text, encoding = enc, offset = offset,
      truncate = offset == 0, mode = opts and opts.mode, user = user_of(opts) })
    offset = offset + #chunk
    size = r.size
  until offset >= #data
  return { path = path, size = size }
end)

--- Lists a directory: an array of { name, path, type, size, mode, mtime }.
Files.list = entry(function(self, path, opts)
  return fs_call(self, "fs.list", { path = path, user = user_of(opts) }).entries
end)

--- Returns { name, path, type, size, mode, mtime, uid, gid, link? }.
Files.stat = entry(function(self, path, opts)
  return fs_call(self, "fs.stat", { path = path, user = user_of(opts) })
end)

--- True when path exists (a dangling symlink exists).
Files.exists = entry(function(self, path, opts)
  return fs_call(self, "fs.stat", { path = path, user = user_of(opts) }, { ENOENT = true, ENOTDIR = true }) ~= nil
end)

--- Removes a file, or a directory (opts.recursive for a non-empty one).
Files.remove = entry(function(self, path, opts)
  fs_call(self, "fs.remove", { path = path, recursive = opts and opts.recursive or nil, user = user_of(opts) })
end)

--- Renames from to to.  opts: user.
Files.rename = entry(function(self, from, to, opts)
  fs_call(self, "fs.rename", { from = from, to = to, user = user_of(opts) })
end)

--- Makes a directory and its parents; false when it already existed.
Files.mkdir = entry(function(self, path, opts)
  return fs_call(self, "fs.mkdir", { path = path, parents = true, mode = opts and opts.mode,
                                     user = user_of(opts) }).created
end)

-- -------------------------------------------------------------- sandbox

local Sandbox = {}
Sandbox.__index = Sandbox
Sandbox.__name = "tupper.Sandbox"

function Sandbox:__tostring() return ("<sandbox %s>"):format(self.id) end

local function new_box(info)
  local box = setmetatable({ id = info.id }, Sandbox)
  box.files = setmetatable({ sandbox = box }, Files)
  box.commands = setmetatable({ sandbox = box }, M.Commands)
  return box
end

--- Runs cmd (a shell command line, or an argv array) and waits for it.
-- opts: cwd, envs, user (an account of the box: default the image's User,
-- else root), timeout (a duration), stdin (a string fed then closed;
-- true to keep it open for send_stdin), on_stdout(data), on_stderr(data),
-- check (raise on a non-zero exit), background (return the process handle
-- at once: :wait(), :kill(), :send_stdin(), :close_stdin(), .pid).
Sandbox.run = entry(function(self, cmd, opts)
  opts = opts or {}
  local params = { sandbox = self.id, env = opts.envs, cwd = opts.cwd, timeout = opts.timeout, user = opts.user,
                   stdin = opts.stdin ~= nil and opts.stdin ~= false, encoding = "utf8" }
  if type(cmd) == "table" then params.argv = cmd
  elseif type(cmd) == "string" then params.cmd = cmd
  else fail("run wants a command string or an argv table") end
  local r = call("process.start", params)
  local h = setmetatable({ sandbox = self, pid = math.tointeger(r.pid) or r.pid, check = opts.check,
    cmd = type(cmd) == "table" and table.concat(cmd, " ") or cmd,
    _out = {}, _err = {}, _waiters = {}, _on_stdout = opts.on_stdout, _on_stderr = opts.on_stderr }, Process)
  procs[proc_key(self.id, h.pid)] = h
  if type(opts.stdin) == "string" then
    if #opts.stdin > 0 then h:send_stdin(opts.stdin) end
    h:close_stdin()
  end
  if opts.background then return h end
  local ok, res = pcall(h.wait, h)
  if not ok then
    if res == M.INTERRUPTED and not h.result then
      -- ^C in the REPL: the command goes with the wait
      call_later("process.signal", { sandbox = self.id, pid = h.pid, signal = "KILL" })
    end
    error(res, 0)
  end
  return res
end)

--- Kills the sandbox and removes it; false when it was already gone.
Sandbox.kill = entry(function(self)
  return call("sandbox.kill", { id = self.id }).killed
end)

--- The sandbox now lives `timeout` from now (seconds or "10m"; 0: forever).
Sandbox.set_timeout = entry(function(self, timeout)
  return call("sandbox.set_timeout", { id = self.id, timeout = timeout })
end)

--- Freezes every process of the sandbox.  opts.keep_memory (true or
-- false) also writes the pause to disk (docs/snapshots.md, "Pause to disk").
Sandbox.pause = entry(function(self, opts)
  local keep
  if type(opts) == "table" then keep = opts.keep_memory end
  if keep ~= nil and type(keep) ~= "boolean" then error("pause: keep_memory must be a boolean", 2) end
  return call("sandbox.pause", { id = self.id, keep_memory = keep }).state
end)

--- Thaws a paused sandbox.
Sandbox.resume = entry(function(self)
  return call("sandbox.resume", { id = self.id }).state
end)

--- Resource counters: cpu_usage_usec, memory_bytes, pids, ...
Sandbox.metrics = entry(function(self)
  return call("sandbox.metrics", { id = self.id })
end)

--- What the daemon knows: id, image, state, created_at, metadata, limits...
Sandbox.info = entry(function(self)
  return call("sandbox.get", { id = self.id })
end)

--- Replaces the network rules; the next connection follows them.
Sandbox.update_network = entry(function(self, network)
  return call("sandbox.update_network", { id = self.id, network = network }).network
end)

--- The recent network decisions, oldest first.
Sandbox.network_log = entry(function(self)
  return call("sandbox.network_log", { id = self.id }).entries
end)

--- "127.0.0.1:PORT" on the host, forwarded to port inside the sandbox.
Sandbox.get_host = entry(function(self, port)
  local r = call("sandbox.expose", { id = self.id, port = port })
  return ("%s:%d"):format(r.host, math.tointeger(r.port))
end)

--- Snapshots the sandbox's files (docs/snapshots.md), optionally named;
-- returns the snapshot: id, names, sandbox, created_at, size, sandboxes.
Sandbox.snapshot = entry(function(self, name)
  return call("sandbox.snapshot", { id = self.id, name = name })
end)

--- count (default 1) new sandboxes from one snapshot of this one: an
-- array of handles, and the snapshot's id.
Sandbox.fork = entry(function(self, count)
  local r = call("sandbox.fork", { id = self.id, count = count or 1 })
  local out = {}
  for i, info in ipairs(r.sandboxes) do out[i] = new_box(info) end
  return out, r.snapshot
end)

--- True while the sandbox exists.
Sandbox.is_running = entry(function(self)
  return call("sandbox.get", { id = self.id }, true) ~= nil
end)

-- box.commands, as in E2B: run, list, kill(pid), send_stdin(pid, data).
M.Commands = { __name = "tupper.Commands" }
M.Commands.__index = M.Commands
function M.Commands:__tostring() return ("<commands of sandbox %s>"):format(self.sandbox.id) end
M.Commands.run = function(self, cmd, opts) return self.sandbox:run(cmd, opts) end
M.Commands.list = entry(function(self)
  return call("process.list", { sandbox = self.sandbox.id }).processes
end)
M.Commands.kill = entry(function(self, pid, signal)
  call("process.signal", { sandbox = self.sandbox.id, pid = pid, signal = signal or "KILL" })
  return true
end)
M.Commands.send_stdin = entry(function(self, pid, data)
  send_stdin(self.sandbox.id, pid, data)
end)

M.Sandbox, M.Process, M.Files = Sandbox, Process, Files

-- -------------------------------------------------------------- module

-- The policy param of a create: opts.policy is a path, {source, name} or
-- false; left out, the nearest tupper.lua from the working directory up.
local function policy_param(opt)
  if opt == false then return nil end
  if type(opt) == "table" then
    if type(opt.source) ~= "string" then fail("policy.source must be a string") end
    return { source = opt.source, name = opt.name or "tupper.lua" }
  end
  if opt ~= nil and type(opt) ~= "string" then fail("policy must be a path, {source = ...} or false") end
  -- lazy: start-up cost, an SDK program without policy or recipe loads no recipe VM
  local path = opt or require("tupper.recipe.policy").find()
  if not path then return nil end
  local text, err = require("tupper.recipe.jail").read_source(path) -- lazy: as above
  if not text then fail("policy: %s", tostring(err)) end
  return { source = text, name = path }
end

-- The recipe param of a create: a recipe file's path (its .lock beside it
-- goes too), a shipped recipe's name, or {source, name, lock}.
local function recipe_param(opt)
  if opt == nil then return nil end
  if type(opt) == "table" then
    if type(opt.source) ~= "string" then fail("recipe.source must be a string") end
    return { source = opt.source, name = opt.name or "recipe.lua", lock = opt.lock }
  end
  local spec, err = require("tupper.recipe.file").client_spec(opt) -- lazy: start-up cost, as above
  if not spec then fail("%s", tostring(err)) end
  return spec
end

--- Creates a sandbox.  opts: image, envs, metadata, limits (memory, cpus,
-- pids, disk, timeout), timeout (its lifetime, as limits.timeout), cwd,
-- policy (a policy file's path, {source = text, name = ...}, or false;
-- default: the nearest tupper.lua from the working directory up), recipe
-- (a recipe file's path, a shipped recipe's name, or {source, name, lock}:
-- docs/recipes.md; envs, cwd and limits given here override its own),
-- network ("none", "all" or { allow = {...}, deny = {...} }: docs/network.md),
-- backend ("linux", the default, or "microvm": docs/microvm.md), volumes
-- ({ ["/mnt/data"] = "name" }: docs/volumes.md), snapshot (a snapshot's id
-- or name: its files and settings, docs/snapshots.md).
M.create = entry(function(opts)
  opts = opts or {}
  local limits = opts.limits
  if opts.timeout ~= nil then
    limits = {}
    for k, v in pairs(opts.limits or {}) do limits[k] = v end
    limits.timeout = opts.timeout
  end
  local info = call("sandbox.create", { image = opts.image, env = opts.envs, metadata = opts.metadata,
    limits = limits, cwd = opts.cwd, policy = policy_param(opts.policy), recipe = recipe_param(opts.recipe),
    network = opts.network, backend = opts.backend, volumes = opts.volumes,
    snapshot = opts.snapshot })
  return new_box(info)
end)

--- The daemon's snapshots, oldest first.
M.snapshots = entry(function()
  return call("snapshot.list", {}).snapshots
end)

--- Deletes a snapshot (id or name); raises while a sandbox uses it.
M.delete_snapshot = entry(function(ref)
  return call("snapshot.delete", { id = ref }).deleted
end)

--- A handle on an existing sandbox; raises when there is none.
M.connect = entry(function(id)
  if type(id) ~= "string" then fail("connect wants a sandbox id") end
  return new_box(call("sandbox.get", { id = id }))
end)

--- Every sandbox: an array of what box:info() returns.
M.list = entry(function()
  return call("sandbox.list", {}).sandboxes
end)

--- Volumes (docs/volumes.md): tupper.volumes.create(name, size),
-- .list(), .get(name), .destroy(name).  A volume is { name, id, size,
-- created_at, mounted_by = { { sandbox, path } } }.
M.volumes = {
  create = entry(function(name, size)
    if type(name) ~= "string" then fail("volumes.create wants a name") end
    return call("volume.create", { name = name, size = size })
  end),
  list = entry(function() return call("volume.list", {}).volumes end),
  get = entry(function(name) return call("volume.get", { name = name }) end),
  destroy = entry(function(name) return call("volume.destroy", { name = name }).destroyed end),
}

--- Kills sandbox id; false when there was none.
M.kill = entry(function(id)
  return call("sandbox.kill", { id = id }).killed
end)

return M
