--- The socket API's methods.  Each handler runs in its own coroutine with
-- validated params (tupper.schema) and returns a result table, or nil, code,
-- message[, data] for a JSON-RPC error.
local core = require("tupper.core")
local json = require("tupper.util.json")
local rpc = require("tupper.wire.rpc")
local schema = require("tupper.wire.schema")
local guard = require("tupper.recipe.guard")
local sandbox = require("tupper.daemon.sandbox")
local build = require("tupper.recipe.build")
local backends = require("tupper.backend.registry")
local paths = require("tupper.util.paths")
local api_stream = require("tupper.daemon.api_stream")

local MSG = core.MSG
local M = {}

local ERRNO_NAMES = { [1] = "EPERM", [2] = "ENOENT", [3] = "ESRCH", [5] = "EIO", [11] = "EAGAIN",
  [13] = "EACCES", [16] = "EBUSY", [17] = "EEXIST", [20] = "ENOTDIR", [21] = "EISDIR",
  [22] = "EINVAL", [27] = "EFBIG", [28] = "ENOSPC", [36] = "ENAMETOOLONG", [39] = "ENOTEMPTY",
  [40] = "ELOOP", [12] = "ENOMEM", [7] = "E2BIG", [8] = "ENOEXEC", [24] = "EMFILE",
  [25] = "ENOTTY", [122] = "EDQUOT", [32] = "EPIPE", [18] = "EXDEV", [30] = "EROFS",
  [95] = "EOPNOTSUPP" }
local FILE_TYPES = { "file", "dir", "symlink", "other" }

local function errno_data(errno)
  errno = math.tointeger(errno) or 0
  return { errno = errno, code = ERRNO_NAMES[errno] or ("E" .. errno) }
end

local function decode_data(data, encoding)
  if encoding == "utf8" then return data end
  local raw, err = core.b64decode(data)
  if not raw then return nil, err end
  return raw
end

--- Bytes for a client: as text when it asked for utf8 and they are valid
-- UTF-8, else base64.  Returns data, encoding.
function M.encode_data(data, encoding)
  if encoding == "utf8" and utf8.len(data) and not data:find("\0", 1, true) then return data, "utf8" end
  return core.b64encode(data), "base64"
end

local function abs_path(p)
  if p:sub(1, 1) ~= "/" then p = "/" .. p end
  return p
end

-- The agent fields of a file request, acting as the account guard.check
-- looked up for p.user (none: root).
local function as(p, fields)
  return sandbox.as_fields(fields, p._account)
end

local function join(dir, name)
  return dir:sub(-1) == "/" and dir .. name or dir .. "/" .. name
end

local h = {}
M.handlers = h

function h.hello(d, conn, p)
  if p.protocol and p.protocol ~= schema.PROTOCOL then
    return nil, rpc.INVALID_PARAMS, ("protocol %d is not supported; this daemon speaks %d")
      :format(p.protocol, schema.PROTOCOL)
  end
  -- the reply does not change while the daemon runs: encoded once (about
  -- 12 us a hello, which every `tupper exec` sends) and sent as it is
  local text = M.hello_text
  if not text then
    local names = {}
    for name in pairs(schema.methods) do names[#names + 1] = name end
    table.sort(names)
    text = assert(json.encode({ protocol = schema.PROTOCOL, server = "tupper", version = core.version,
      methods = names, streams = api_stream.VERSION, process_streams = api_stream.PROCESS_STREAMS,
      attach_wait = api_stream.ATTACH_WAIT_MS, file_fds = api_stream.FILE_FDS }))
    M.hello_text = text
  end
  return json.raw(text)
end

function h.sandbox_create(d, conn, p)
  local sb, err, data = d:create_sandbox(p)
  -- data: a daemon cap refused it (daemon/limits.lua), a busy daemon's -32004
  if not sb then return nil, data and rpc.BUSY or rpc.SANDBOX_ERROR, err, data end
  if p.kill_on_disconnect then
    if conn.closed then
      d:kill_sandbox(sb.id)
      return nil, rpc.SANDBOX_ERROR, "the client went away"
    end
    conn.owned = conn.owned or {}
    conn.owned[sb.id] = true
  end
  return sb:info()
end

function h.recipe_build(d, conn, p)
  local loaded, err = build.load(p.recipe)
  if not loaded then return nil, rpc.SANDBOX_ERROR, err end
  -- the daemon's own policy judges the setup's commands and files
  local plan
  plan, err = build.prepare(d, loaded, { build = true, policies = d.policy and { d.policy } or {} })
  if not plan then return nil, rpc.SANDBOX_ERROR, err end
  return { recipe = plan.recipe.name, image = plan.image.ref, image_digest = plan.image.digest,
           layer = plan.layer or json.null, cached = plan.cached == true, lock = plan.lock }
end

-- A sandbox by id; `any_state` also returns a paused one.
local function get_sandbox(d, id, any_state)
  local sb = d.sandboxes[id]
  -- a pause or resume in flight (in the thread pool) ends first: the
  -- request sees the box as it leaves it
  if sb and sb.freezing then
    sb:freeze_wait()
    sb = d.sandboxes[id]
  end
  if not sb or (sb.state ~= "running" and sb.state ~= "paused") then
    return nil, rpc.NOT_FOUND, ("no sandbox '%s'"):format(id)
  end
  if sb.state == "paused" and not any_state then
    return nil, rpc.SANDBOX_ERROR, ("sandbox '%s' is paused: resume it first"):format(id)
  end
  return sb
end

-- sandbox.pause and sandbox.resume are snapshot_api.lua's (with the pause to disk)

function h.sandbox_metrics(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.id, true)
  if not sb then return nil, code, msg end
  local st, err = sb:stats()
  if not st then return nil, rpc.SANDBOX_ERROR, err end
  local r = { cpu_usage_usec = st.cpu_usage_usec, memory_bytes = st.memory_current,
              memory_peak = st.memory_peak, pids = st.pids_current, nr_throttled = st.nr_throttled,
              throttled_usec = st.throttled_usec, oom_kills = st.oom_kills }
  if p.series then r.samples = json.array(require("tupper.daemon.metrics").series(sb)) end
  return r
end

function h.sandbox_get(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.id, true)
  if not sb then return nil, code, msg end
  return sb:info()
end

-- What sandbox.list keeps of each listed box (by the box, weak: it goes
-- with the box): its sort key and its entry as JSON, kept until its info
-- changes.  Encoding the entries, and collecting a table a box each list,
-- made most of a sandbox.list's CPU: 15 ms at 1,000 boxes
-- (docs/benchmarks.md, "Churn").  A sandbox's entry is kept with what its
-- info is made of (Sandbox:info_inputs), compared at each list in one C
-- call (Sandbox:info_same).  Another kind of listed box (one paused to
-- disk: daemon/pause.lua) has its info filled into one table and compared
-- member by member with the kept one; a member that is a table (metadata,
-- limits, volumes) is replaced when it changes, never changed in place, so
-- its identity says whether it changed.
--
-- The list's order: by created_at, then id.  The sort key is created_at ..
-- "\0" .. id (made again when created_at moves: a pooled box gets a new one
-- when a create takes it), and the keys are sorted by table.sort's own
-- string order: the same order (a "\0" sorts before any byte of an id, and
-- a created_at that is a prefix of another's before it), without a call of
-- a Lua comparator for each comparison.
local kept = setmetatable({}, { __mode = "k" })
local scratch = {}
local keys, by_key = {}, {}

-- The entry of sb, whose kept record e did not match (or has none yet).
local function entry_json(sb, e)
  if e.info then -- not a Sandbox: its info compared member by member
    local info, old, same, n = sb:info(scratch), e.info, true, 0
    for k, v in pairs(info) do
      n = n + 1
      if old[k] ~= v then same = false; break end
    end
    if same and n == e.n then return e.text end
  end
  local same = sb.info_same
  if same then
    e.same, e.inputs = same, sb:info_inputs()
    e.text = assert(json.encode(sb:info(scratch)))
    return e.text
  end
  local copy, n = {}, 0
  for k, v in pairs(sb:info(scratch)) do copy[k] = v; n = n + 1 end
  e.info, e.n, e.text = copy, n, assert(json.encode(copy))
  return e.text
end

function h.sandbox_list(d, conn, p)
  -- (emptied as the reply is made; again here, after a call that raised)
  for i = #keys, 1, -1 do keys[i] = nil end
  for k in pairs(by_key) do by_key[k] = nil end
  local n = 0
  for _, sb in pairs(d.sandboxes) do
    local state = sb.state
    if state == "running" or state == "paused" then
      local e, at = kept[sb], sb.created_at
      if e == nil or e.at ~= at then
        e = { at = at, key = at .. "\0" .. sb.id }
        kept[sb] = e
      end
      local same, text = e.same, e.text
      if not (same and same(sb, e.inputs)) then text = entry_json(sb, e) end
      n = n + 1
      local k = e.key
      keys[n], by_key[k] = k, text
    end
  end
  table.sort(keys)
  -- the reply goes out as these strings (json.raw): the kept entries and
  -- the commas between them, never joined
  local parts = { '{"sandboxes":[' }
  for i = 1, n do
    local k = keys[i]
    parts[2 * i] = by_key[k]
    parts[2 * i + 1] = i < n and "," or "]}"
    keys[i], by_key[k] = nil, nil
  end
  if n == 0 then parts[2] = "]}" end
  return json.raw(parts)
end

function h.sandbox_set_timeout(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.id, true)
  if not sb then return nil, code, msg end
  d:set_timeout(sb, p.timeout)
  return { timeout = p.timeout, expires_at = sb:info().expires_at }
end

function h.sandbox_update_network(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.id, true)
  if not sb then return nil, code, msg end
  local ok, err = sb:set_network(p.network, d:policy_networks(sb.policy))
  if not ok then return nil, rpc.SANDBOX_ERROR, err end
  d:save(sb)
  return { network = p.network }
end

function h.sandbox_network_log(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.id, true)
  if not sb then return nil, code, msg end
  return { entries = json.array(sb.net and sb.net:entries() or {}) }
end

function h.sandbox_expose(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.id)
  if not sb then return nil, code, msg end
  if sb.net_error then return nil, rpc.SANDBOX_ERROR, "network relay unavailable: " .. sb.net_error end
  local port, err = sb.net:expose(p.port)
  if not port then return nil, rpc.SANDBOX_ERROR, "cannot listen: " .. tostring(err) end
  return { host = "127.0.0.1", port = port }
end

function h.sandbox_kill(d, conn, p)
  return { killed = d:kill_sandbox(p.id) }
end

-- The account a process runs as: p.user looked up in the box's
-- /etc/passwd; nil (the sandbox's user, else root) without one.  A name
-- goes to an agent that looks it up itself as part of the EXEC (no round
-- trip first) when the cwd does not need the home here.
local function account_for(sb, p)
  if not p.user then return nil end
  if sb.exec_user and type(p.user) == "string" and #p.user >= 1 and #p.user <= 256
    and not p.user:find("\0", 1, true) and (sb.id_count or 65536) == 65536
    and (p.cwd == nil or p.cwd:sub(1, 1) == "/") then
    return { name = p.user, by_agent = true }
  end
  local acct, err, errno = sb:account(p.user)
  if not acct then return nil, rpc.PROCESS_ERROR, err, errno_data(errno or 5) end
  return acct
end

-- Starts argv for conn with p's env, cwd, user and timeout; x as for
-- Sandbox:exec.  Returns the reply or nil, code, msg, data.
local function start(sb, conn, argv, p, x)
  local acct, c, m, dt = account_for(sb, p)
  if c then return nil, c, m, dt end
  -- a relative cwd is taken from the account's home (else from /)
  local cwd = p.cwd and paths.clean_path(p.cwd, acct and acct.home or "/")
  if not cwd and acct then cwd = acct.home end -- nil when the agent resolves it
  local streams, bc, bm, bd
  if p.streams then
    -- process streams (api_stream.lua): bound right after the agent's
    -- reply, before it can send a byte of output
    local _, sc, sm = api_stream.await_data_conn(conn)
    if sc then return nil, sc, sm end
    x.credit = true
    x.on_pid = function(proc)
      proc.streamed = true
      streams, bc, bm, bd = api_stream.bind_process(conn, sb, proc.pid, x.pty ~= nil, p.stdin)
      return streams ~= nil
    end
  end
  local proc, err, errno = sb:exec(argv, p.env, cwd, p.stdin, conn, acct, x)
  if not proc and bc then return nil, bc, bm, bd end
  if not proc then return nil, rpc.PROCESS_ERROR, err, errno_data(errno) end
  proc.encoding = p.encoding or "base64"
  if p.timeout and p.timeout > 0 then
    -- the process (and its group) is killed when its time is up
    sb:kill_after(proc, math.ceil(p.timeout * 1000))
  end
  return { pid = proc.pid, streams = streams }
end

-- A start's reply as it is; the refill the box's create held goes now,
-- after the agent's answer (daemon/pool.lua), started or failed.
local function started(d, sb, ...)
  d:_pool_release(sb)
  return ...
end

function h.process_start(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  return started(d, sb, start(sb, conn, p.argv or { "/bin/sh", "-c", p.cmd }, p, {}))
end

function h.pty_create(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  p.encoding, p.stdin = "base64", nil -- terminal bytes are bytes; input goes to the terminal
  return started(d, sb, start(sb, conn, p.argv or { "/bin/sh", "-i", "-l" }, p, { pty = { cols = p.cols, rows = p.rows } }))
end

local function get_proc(d, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  if not sb.procs[p.pid] then
    return nil, rpc.NOT_FOUND, ("no process %d in sandbox '%s'"):format(p.pid, p.sandbox)
  end
  return sb
end

local function agent_call(sb, type_, fields, code)
  local r, err, errno = sb:request(type_, fields)
  if not r then return nil, code or rpc.PROCESS_ERROR, err, errno_data(errno) end
  return r
end

function h.process_stdin(d, conn, p)
  local sb, code, msg = get_proc(d, p)
  if not sb then return nil, code, msg end
  local data, err = decode_data(p.data, p.encoding)
  if not data then return nil, rpc.INVALID_PARAMS, "'data': " .. err end
  local r, c, m, x = agent_call(sb, MSG.STDIN, { pid = p.pid, data = data })
  if not r then return nil, c, m, x end
  return {}
end

function h.pty_resize(d, conn, p)
  local sb, code, msg = get_proc(d, p)
  if not sb then return nil, code, msg end
  if not sb.procs[p.pid].pty then
    return nil, rpc.PROCESS_ERROR, ("process %d has no terminal"):format(p.pid), errno_data(25)
  end
  local r, c, m, x = agent_call(sb, MSG.PTY_RESIZE, { pid = p.pid, cols = p.cols, rows = p.rows })
  if not r then return nil, c, m, x end
  return {}
end

-- What process.list and process.connect tell of an exited process.
local function exit_of(proc)
  return { exit_code = proc.exit_code, signal = proc.signal, timed_out = proc.timed_out or nil,
           oom_killed = proc.oom_killed or nil, ended_at = proc.ended_at }
end

function h.process_connect(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local gone = not sb.procs[p.pid] and p.exited and sb:exited_proc(p.pid)
  if gone then -- its backlog and its exit; nothing follows
    local out = {}
    for i, chunk in ipairs(gone.ring or {}) do
      local data, e = M.encode_data(chunk.data, p.encoding or gone.encoding or "base64")
      out[i] = { stream = chunk.stream, data = data, encoding = e }
    end
    return { pid = gone.pid, output = json.array(out), dropped = gone.ring_dropped or 0, exit = exit_of(gone) }
  end
  sb, code, msg = get_proc(d, p)
  if not sb then return nil, code, msg end
  local proc = sb.procs[p.pid]
  local enc = p.encoding or proc.encoding or "base64"
  local streams, listen = nil, enc
  if p.streams then
    -- its output from now on comes on this connection's data connection
    -- (a process started with streams whose reader is gone, or never was)
    if not core.stream_proc_known(sb.box.core or sb.box, proc.pid) then
      return nil, rpc.PROCESS_ERROR, ("process %d was not started with streams"):format(proc.pid),
        errno_data(95)
    end
    local bc, bm, bd
    streams, bc, bm, bd = api_stream.bind_process(conn, sb, proc.pid, proc.pty, proc.stdin)
    if not streams then return nil, bc, bm, bd end
    listen = "streams" -- its exit comes here as a notification, its bytes on the streams
  end
  local out = {}
  local ring, dropped = proc.ring, proc.ring_dropped
  if proc.streamed then -- kept in C with its streams (stream_proc.c)
    ring, dropped = core.stream_proc_ring(sb.box.core or sb.box, proc.pid, false)
  end
  for i, chunk in ipairs(ring or {}) do
    local data, e = M.encode_data(chunk.data, enc)
    out[i] = { stream = chunk.stream, data = data, encoding = e }
  end
  -- no yield from here to the reply: nothing can come between the backlog
  -- and the notifications that follow it
  -- its owner follows as a listener too where it asks for JSON of a
  -- streamed process: such a process tells its owner nothing of its output
  -- (events.lua D:_output), and its exit reaches the owner once (D:_exit)
  if conn ~= proc.owner or (proc.streamed and listen ~= "streams") then
    proc.listeners = proc.listeners or {}
    proc.listeners[conn] = listen
    -- a JSON follower of a streamed process: its output reaches Lua too
    if proc.streamed and listen ~= "streams" then core.stream_proc_mirror(sb.box.core or sb.box, proc.pid) end
  end
  return { pid = proc.pid, output = json.array(out), dropped = dropped or 0, streams = streams }
end

function h.fs_watch(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local w, err, errno = sb:watch(abs_path(p.path), p.recursive, conn, p._account)
  if not w then return nil, rpc.FS_ERROR, err, errno_data(errno) end
  if conn.closed then -- gone while the agent answered: nobody to tell
    sb:unwatch(w)
    return nil, rpc.SANDBOX_ERROR, "the client went away"
  end
  conn.watches = conn.watches or {}
  conn.watches[w] = sb
  return { watch = w.id }
end

function h.fs_unwatch(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox, true)
  if not sb then return nil, code, msg end
  local w = sb.watches[p.watch]
  if not w or w.owner ~= conn then
    return nil, rpc.NOT_FOUND, ("no watch %d of this connection in sandbox '%s'"):format(p.watch, p.sandbox)
  end
  if conn.watches then conn.watches[w] = nil end
  local ok, err, errno = sb:unwatch(w)
  if not ok then return nil, rpc.FS_ERROR, err, errno_data(errno) end
  return {}
end

function h.process_close_stdin(d, conn, p)
  local sb, code, msg = get_proc(d, p)
  if not sb then return nil, code, msg end
  local r, c, m, x = agent_call(sb, MSG.STDIN_CLOSE, { pid = p.pid })
  if not r then return nil, c, m, x end
  return {}
end

function h.process_signal(d, conn, p)
  local sb, code, msg = get_proc(d, p)
  if not sb then return nil, code, msg end
  local ok, err, errno = sb:signal(sb.procs[p.pid], p.signal or 9)
  if not ok then return nil, rpc.PROCESS_ERROR, err, errno_data(errno) end
  return {}
end

function h.process_list(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local list = {}
  for pid, proc in pairs(sb.procs) do
    -- a process whose start is still in flight (held, being given its
    -- cgroup) is not listed yet: no client knows its pid
    if not proc.starting then
      list[#list + 1] = { pid = pid, argv = proc.argv, cwd = proc.cwd, started_at = proc.started_at,
                          pty = proc.pty or nil, user = proc.user }
    end
  end
  table.sort(list, function(a, b) return a.pid < b.pid end)
  if p.exited then -- then the kept exited ones, in the order they ended
    for _, proc in ipairs(sb.exited) do
      list[#list + 1] = { pid = proc.pid, argv = proc.argv, cwd = proc.cwd, started_at = proc.started_at,
                          pty = proc.pty or nil, user = proc.user, exit = exit_of(proc) }
    end
  end
  return { processes = json.array(list) }
end

function h.fs_read(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local offset = p.offset or 0
  local r, c, m, x = agent_call(sb, MSG.FS_READ, as(p, { path = abs_path(p.path), offset = offset,
    length = p.length or core.CHUNK_MAX }), rpc.FS_ERROR)
  if not r then return nil, c, m, x end
  local data = r.data or ""
  local out, enc = M.encode_data(data, p.encoding)
  local size = math.tointeger(r.size) or 0
  return { data = out, encoding = enc, size = size, eof = offset + #data >= size }
end

function h.fs_write(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local data, err = decode_data(p.data, p.encoding)
  if not data then return nil, rpc.INVALID_PARAMS, "'data': " .. err end
  if #data > core.CHUNK_MAX then
    return nil, rpc.INVALID_PARAMS, ("'data' is over %d bytes: write in chunks"):format(core.CHUNK_MAX)
  end
  local offset = p.offset or 0
  local truncate = p.truncate
  if truncate == nil then truncate = offset == 0 and not p.append end
  local flags = 4 | (truncate and 1 or 0) | (p.append and 2 or 0)
  local r, c, m, x = agent_call(sb, MSG.FS_WRITE, as(p, { path = abs_path(p.path), data = data,
    offset = offset, flags = flags, mode = p.mode or 420 }), rpc.FS_ERROR)
  if not r then return nil, c, m, x end
  return { size = math.tointeger(r.size) or 0 }
end

-- A name, path or link target of the box as a reply's field: valid UTF-8,
-- and its exact bytes in <field>_raw (base64) when it is not UTF-8
-- (docs/protocol.md, "Names that are not UTF-8").
local function text_field(t, field, s)
  local text, raw = json.text(s)
  t[field] = text
  if raw then t[field .. "_raw"] = raw end
end

local function stat_result(path, f)
  local r = { type = FILE_TYPES[f.type] or "other", size = f.size, mode = f.mode, mtime = f.mtime,
              uid = f.uid, gid = f.gid }
  text_field(r, "name", path:match("([^/]*)/*$") or path)
  text_field(r, "path", path)
  text_field(r, "link", f.link)
  return r
end

function h.fs_stat(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local path = abs_path(p.path)
  local r, c, m, x = agent_call(sb, MSG.FS_STAT, as(p, { path = path }), rpc.FS_ERROR)
  if not r then return nil, c, m, x end
  return stat_result(path, r)
end

function h.fs_list(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local path = abs_path(p.path)
  local r, c, m, x = agent_call(sb, MSG.FS_LIST, as(p, { path = path }), rpc.FS_ERROR)
  if not r then return nil, c, m, x end
  local entries = {}
  for i, e in ipairs(r.entries or {}) do
    if type(e.name) ~= "string" or e.name == "" or e.name:find("/", 1, true) or e.name == "." or e.name == ".." then
      sb:_hostile("bad directory entry name")
      return nil, rpc.SANDBOX_ERROR, "sandbox agent misbehaved"
    end
    entries[i] = stat_result(join(path, e.name), e)
  end
  return { entries = json.array(entries), truncated = (r.flags or 0) & 1 == 1 }
end

function h.fs_mkdir(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local r, c, m, x = agent_call(sb, MSG.FS_MKDIR, as(p, { path = abs_path(p.path), mode = p.mode or 493,
    flags = p.parents and 1 or 0 }), rpc.FS_ERROR)
  if not r then return nil, c, m, x end
  return { created = r.created == 1 }
end

function h.fs_remove(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local r, c, m, x = agent_call(sb, MSG.FS_REMOVE, as(p, { path = abs_path(p.path),
    flags = p.recursive and 1 or 0 }), rpc.FS_ERROR)
  if not r then return nil, c, m, x end
  return {}
end

function h.fs_rename(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local r, c, m, x = agent_call(sb, MSG.FS_RENAME, as(p, { path = abs_path(p.from), path2 = abs_path(p.to) }),
    rpc.FS_ERROR)
  if not r then return nil, c, m, x end
  return {}
end

function h.fs_setattr(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local r, c, m, x = agent_call(sb, MSG.FS_SETATTR, as(p, { path = abs_path(p.path), mode = p.mode,
    mtime = p.mtime }), rpc.FS_ERROR)
  if not r then return nil, c, m, x end
  return {}
end

function h.fs_symlink(d, conn, p)
  local sb, code, msg = get_sandbox(d, p.sandbox)
  if not sb then return nil, code, msg end
  local r, c, m, x = agent_call(sb, MSG.FS_SYMLINK, as(p, { path = abs_path(p.path), link = p.target }),
    rpc.FS_ERROR)
  if not r then return nil, c, m, x end
  return {}
end

function h.image_list(d, conn, p)
  local list = d.images:list()
  for _, i in ipairs(list) do i.created = i.created or json.null end
  return { images = json.array(list) }
end

function h.image_inspect(d, conn, p)
  local r, err = d.images:inspect(p.ref)
  if not r then return nil, rpc.NOT_FOUND, err end
  r.layers = json.array(r.layers)
  return r
end

function h.image_remove(d, conn, p)
  local r, err = d.images:remove(p.ref)
  if not r then return nil, rpc.IMAGE_ERROR, err, { kind = "store" } end
  -- what backends made of its layers (a microVM's root images) goes with them
  backends.gc(d.state)
  return r
end

function h.image_prune(d, conn, p)
  local r, err = d.images:prune(p.all)
  if not r then return nil, rpc.IMAGE_ERROR, err, { kind = "store" } end
  backends.gc(d.state)
  return r
end

function h.image_import(d, conn, p)
  if p.path:sub(1, 1) ~= "/" then return nil, rpc.INVALID_PARAMS, "'path' must be absolute" end
  local r, err = d.images:import(p.path, p.ref)
  if not r then return nil, rpc.IMAGE_ERROR, "import: " .. tostring(err), { kind = "import" } end
  return r
end

--- The handler for a method name ("sandbox.create" -> h.sandbox_create).
function h.image_pull(d, conn, p)
  local progress
  if p.progress then
    progress = function(done, total)
      if not conn.closed then conn:notify("image.progress", { ref = p.ref, done = done, total = total }) end
    end
  end
  local res, err, kind = d:pull_image(p.ref, progress)
  if not res then return nil, rpc.IMAGE_ERROR, err, { kind = kind } end
  local layers = {}
  for i, l in ipairs(res.layers) do layers[i] = { digest = l.digest, size = l.size, media_type = l.mediaType } end
  return { ref = res.ref, digest = res.digest, size = res.size, layers = json.array(layers) }
end

-- recipe.register, recipe.list, recipe.remove: the template registry's
for k, fn in pairs(require("tupper.daemon.templates").handlers) do h[k] = fn end
-- sandbox.snapshot, sandbox.fork, snapshot.list, snapshot.delete
for k, fn in pairs(require("tupper.daemon.snapshot_api").handlers) do h[k] = fn end

-- the data plane's methods (stream.*, fs.*_stream) live in api_stream.lua
api_stream.register(h, { get_sandbox = get_sandbox, abs_path = abs_path, as = as, agent_call = agent_call,
                         MSG = MSG, errno_data = errno_data })
-- fs.read_fd and fs.write_fd send their reply (and its fd) themselves
M.SENDS_OWN_REPLY = api_stream.SENDS_OWN_REPLY
M.SENT = api_stream.SENT
-- volume.create, volume.list, volume.get, volume.destroy
for k, fn in pairs(require("tupper.daemon.volumes").handlers) do h[k] = fn end

-- (by method name: a name is made into a handler's once)
local handlers = {}

function M.lookup(method)
  local fn = handlers[method]
  if fn then return fn end
  if not schema.methods[method] then return nil end
  fn = h[(method:gsub("%.", "_"))]
  if fn then handlers[method] = fn end
  return fn
end

return M
