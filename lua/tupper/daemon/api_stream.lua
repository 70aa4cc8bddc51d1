--- The data plane's JSON methods (docs/protocol.md, "Stream frames"):
-- stream.channel and stream.attach give a control connection its data
-- connection, fs.read_stream and fs.write_stream open file streams on it.
-- The bytes never come here: runtime/host/stream_fs.c relays them between
-- the data connection and the box's agent; this file only decides which
-- sandbox, path and account, and hands out stream ids.
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")
local rpc = require("tupper.wire.rpc")
local async = require("tupper.util.async")
local deadlines = require("tupper.util.deadlines")

local M = {}

M.VERSION = 1                 -- the frames' version (hello's `streams`)
M.PROCESS_STREAMS = 1         -- hello's `process_streams`: process.start, process.connect and
                              -- pty.create take `streams` (docs/protocol.md, "Process streams")
M.TOKEN_TTL = 30000           -- ms a stream.channel token stays valid
M.TOKENS_MAX = 16             -- unused tokens one connection may hold
M.IDLE_MS = 60000             -- a data connection with no credit for this long is dropped
M.ATTACH_WAIT_MS = 5000       -- hello's `attach_wait`: how long a call that asks for streams waits
                              -- for the attach of a token its connection holds
M.EARLY_ATTACH_MS = 1000      -- how long an attach with an unknown token waits for the
                              -- stream.channel that names it (a token the client chose)
M.EARLY_ATTACH_CONN = 1       -- attaches one connection may have waiting so (a data connection
                              -- attaches once: a second is refused at once, -32004)
M.EARLY_ATTACH_MAX = 1024     -- attaches that may wait so at once in all, or --max-clients if
                              -- higher (more: refused at once, -32004): a last resort, since each
                              -- waits on a connection of its own and connections are capped
M.WINDOW = 4 * 1024 * 1024    -- the default window of a data connection
M.FRAME_MAX = 1048576
M.FILE_FDS = 1                -- hello's `file_fds`: fs.read_fd and fs.write_fd (linux sandboxes)
M.FD_SEND_WAIT_MS = 2000      -- how long an fd's reply waits for the connection to take it
M.WRITE_FD = true             -- fs.write_stream into a linux box's file itself (stream_fs.c)
M.READ_FD = true              -- fs.read_stream of a linux box's file itself (stream_fs.c)

-- the waits for an attach (M.await_data_conn) and for a channel (an early
-- attach), on one timer
local waits = deadlines.new()
M.SENDS_OWN_REPLY = { ["fs.read_fd"] = true, ["fs.write_fd"] = true }
M.SENT = setmetatable({}, { __name = "sent" }) -- a handler's result: its reply went out already

local function hex_token()
  local bytes = assert(uv.random(16))
  return (bytes:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

-- Wakes the calls of conn that wait for its attach (M.await_data_conn).
local function wake_waiters(conn)
  local w = conn._attach_waiters
  conn._attach_waiters = nil
  for done in pairs(w or {}) do done() end
end

-- Before a line of the control connection: what its data connection holds
-- for the loop turn (tp_sconn_hold_turn: a process's OPENs, its ENDs).
local function flush_data(c)
  local dc = c.data_conn
  if dc then dc:flush() end
end

-- The control connection's data connection goes with it, and a call that
-- waits for an attach stops waiting.
local function on_control_close(conn)
  if conn._stream_hooked then return end
  conn._stream_hooked = true
  local handlers = conn.handlers
  local prev = handlers.close
  conn.handlers = setmetatable({ close = function(c)
    if c.data_conn then c.data_conn:close(); c.data_conn = nil end
    wake_waiters(c)
    if prev then return prev(c) end
  end }, { __index = handlers })
end

--- Registers the handlers into api.lua's table; helpers are api.lua's.
function M.register(h, helpers)
  local get_sandbox, abs_path, as, agent_call, MSG = helpers.get_sandbox, helpers.abs_path,
    helpers.as, helpers.agent_call, helpers.MSG
  local errno_data = helpers.errno_data

  function h.stream_channel(d, conn, p)
    d.stream_tokens = d.stream_tokens or {}
    local now = uv.now()
    for t, e in pairs(d.stream_tokens) do
      if e.expires < now or e.conn.closed then
        d.stream_tokens[t] = nil
        if e.conn.tokens_out then e.conn.tokens_out[t] = nil end
      end
    end
    local mine = 0
    for _, e in pairs(d.stream_tokens) do if e.conn == conn then mine = mine + 1 end end
    if mine >= M.TOKENS_MAX then
      return nil, rpc.BUSY, ("stream.channel: %d unused tokens on this connection already"):format(mine),
        { cap = "stream_tokens", value = M.TOKENS_MAX }
    end
    local token = p.token
    if token then
      -- the client's own (the attach may already be under way, M.EARLY_ATTACH_MS)
      if type(token) ~= "string" or #token ~= 32 or not token:match("^[0-9a-f]+$") then
        return nil, rpc.INVALID_PARAMS, "stream.channel: 'token' must be 32 lowercase hex digits"
      end
      if d.stream_tokens[token] then
        return nil, rpc.INVALID_PARAMS, "stream.channel: that token is in use"
      end
    else
      token = hex_token()
    end
    d.stream_tokens[token] = { conn = conn, expires = now + M.TOKEN_TTL }
    -- what a call of this connection that asks for streams may wait for
    conn.tokens_out = conn.tokens_out or {}
    conn.tokens_out[token] = now + M.TOKEN_TTL
    -- an attach that came first goes on now (and may take the token at once)
    local early = d.early_attach and d.early_attach[token]
    if early then
      d.early_attach[token] = nil
      for done in pairs(early) do done() end
    end
    return { token = token }
  end

  -- Whether an attach of conn with a token not known yet may wait for its
  -- stream.channel: nil, or nil, code, msg, data to refuse it at once.
  -- Bounded per connection, so that one client's attaches never take the
  -- places of another's, and in all as a last resort.
  local function may_wait_early(d, conn)
    if (conn.early_attaches or 0) >= M.EARLY_ATTACH_CONN then
      return nil, rpc.BUSY, ("stream.attach: this connection has %d attach waiting for its token's "
        .. "stream.channel already: a data connection attaches once"):format(conn.early_attaches),
        { cap = "early_attaches", value = M.EARLY_ATTACH_CONN }
    end
    local clients = d.caps and d.caps.clients or 0
    local all = math.max(M.EARLY_ATTACH_MAX, clients)
    if (d.early_attaches or 0) >= all then
      return nil, rpc.BUSY, ("stream.attach: %d attaches wait for their token's stream.channel already, "
        .. "the daemon's most: send the stream.channel first"):format(d.early_attaches),
        { cap = "early_attaches_all", value = all }
    end
    return true
  end

  function h.stream_attach(d, conn, p)
    local e = d.stream_tokens and d.stream_tokens[p.token]
    if not e then
      local ok, code, msg, data = may_wait_early(d, conn)
      if not ok then return nil, code, msg, data end
      -- a client that chose its token sends its stream.channel and this
      -- attach at once, on two connections: the channel may come second
      d.early_attaches = (d.early_attaches or 0) + 1
      conn.early_attaches = (conn.early_attaches or 0) + 1
      async.wait(function(cb)
        local entry
        d.early_attach = d.early_attach or {}
        local waiting = d.early_attach[p.token] or {}
        d.early_attach[p.token] = waiting
        local function done()
          waiting[done] = nil
          if next(waiting) == nil and d.early_attach[p.token] == waiting then d.early_attach[p.token] = nil end
          waits:cancel(entry)
          cb()
        end
        waiting[done] = true
        entry = waits:add(M.EARLY_ATTACH_MS, done)
      end)
      d.early_attaches = d.early_attaches - 1
      conn.early_attaches = conn.early_attaches - 1
      e = d.stream_tokens and d.stream_tokens[p.token]
    end
    if e then
      d.stream_tokens[p.token] = nil
      if e.conn.tokens_out then e.conn.tokens_out[p.token] = nil end
    end
    if not e or e.expires < uv.now() or e.conn.closed then
      return nil, rpc.INVALID_PARAMS, "stream.attach: unknown or expired token"
    end
    local control = e.conn
    if control.data_conn and control.data_conn:alive() then
      return nil, rpc.INVALID_REQUEST, "stream.attach: that connection has a data connection already"
    end
    if conn.closed then return {} end
    local window = p.window or M.WINDOW
    local reply = json.encode({ jsonrpc = "2.0", id = p._rpc_id or 1,
      result = { protocol = M.VERSION, window = window, frame_max = M.FRAME_MAX } }) .. "\n"
    -- from here the socket is C's: luv lets go of it without a shutdown
    -- (that would end the dup'ed descriptor's writes too); what Lua
    -- answered on it before goes first
    conn:flush()
    conn.stream:read_stop()
    local fd = conn.stream:fileno()
    local dc, err = core.stream_attach(fd, window, M.IDLE_MS, reply, function() end)
    conn.closed = true
    conn.stream:close()
    if conn.handlers.close then conn.handlers.close(conn) end
    if not dc then return nil, rpc.INTERNAL_ERROR, "stream.attach: " .. tostring(err) end
    control.data_conn = dc
    control.before_write = flush_data
    on_control_close(control)
    wake_waiters(control)
    return {} -- not sent: the reply went out as the data connection's first bytes
  end

  -- The next stream id of conn.
  local function next_sid(conn)
    local sid = conn.next_sid or 1
    conn.next_sid = sid < 0x7fffffff and sid + 1 or 1
    return sid
  end

  --- The data connection of conn, or nil, code, msg (for a call that asks for streams).
  function M.data_conn(conn)
    local dc = conn.data_conn
    if not dc or not dc:alive() then
      return nil, rpc.INVALID_REQUEST, "'streams': no data connection: call stream.channel, then stream.attach on a second connection"
    end
    return dc
  end

  --- The data connection of conn as M.data_conn; where none is attached
  -- yet but conn holds an unused token, first waits (in the caller's
  -- coroutine) for its attach, at most ATTACH_WAIT_MS and never past the
  -- token's expiry: a client may send its process.start right behind its
  -- stream.attach, on the other connection, without waiting for the
  -- attach's reply (one round trip less a start).
  function M.await_data_conn(conn)
    local dc = conn.data_conn
    if dc and dc:alive() then return dc end
    local now, last = uv.now(), nil
    for token, expires in pairs(conn.tokens_out or {}) do
      if expires <= now then
        conn.tokens_out[token] = nil
      elseif not last or expires > last then
        last = expires
      end
    end
    if last and not conn.closed then
      on_control_close(conn) -- its close ends the wait
      async.wait(function(cb)
        local entry
        local function done()
          if conn._attach_waiters then conn._attach_waiters[done] = nil end
          waits:cancel(entry)
          cb()
        end
        conn._attach_waiters = conn._attach_waiters or {}
        conn._attach_waiters[done] = true
        entry = waits:add(math.min(last - now, M.ATTACH_WAIT_MS), done)
      end)
    end
    return M.data_conn(conn)
  end

  --- Binds the streams of process pid of sb (started with credit) to conn's
  -- data connection; pty: one terminal stream; stdin: a stdin stream.
  -- Returns the reply's `streams` ({stdout, stderr, stdin} or {pty}), or
  -- nil, code, msg, data (EBUSY: bound to another live connection).
  function M.bind_process(conn, sb, pid, pty, stdin)
    local dc, code, msg = M.data_conn(conn)
    if not dc then return nil, code, msg end
    local ids
    if pty then
      ids = { stdout = next_sid(conn), pty = true }
    else
      ids = { stdout = next_sid(conn), stderr = next_sid(conn), stdin = stdin and next_sid(conn) or nil }
    end
    local ok, err, errno = dc:process(sb.box.core or sb.box, pid, ids)
    if not ok then
      local names = { [16] = "EBUSY", [22] = "EINVAL", [24] = "EMFILE", [32] = "EPIPE", [12] = "ENOMEM" }
      local data = { errno = errno, code = names[errno] or ("E" .. tostring(errno)) }
      return nil, errno == 16 and rpc.BUSY or rpc.PROCESS_ERROR, err, data
    end
    if pty then return { pty = ids.stdout } end
    return ids -- {stdout, stderr, stdin} already: the reply's own table
  end

  local take_file -- below: the box's file from its agent (FS_OPEN)

  local function open(d, conn, p, write, spec)
    local dc = conn.data_conn
    if not dc or not dc:alive() then
      return nil, rpc.INVALID_REQUEST, "no data connection: call stream.channel, then stream.attach on a second connection"
    end
    local sb, code, msg = get_sandbox(d, p.sandbox)
    if not sb then return nil, code, msg end
    local sid = next_sid(conn)
    -- a backend that wraps core's box (a microVM's) hands the box itself over as core
    local ok, err, errno = dc:file(sb.box.core or sb.box, sid, write, as(p, spec))
    if errno == 24 then
      -- the connection's streams cap (stream.c): a per-client bound, busy
      -- for now as a cap of requests in flight is (E2B's RateLimitError)
      return nil, rpc.BUSY, err, { errno = errno, code = "EMFILE", cap = "streams", value = 256 }
    end
    if not ok then return nil, rpc.FS_ERROR, err, { errno = errno } end
    return sid
  end

  function h.fs_read_stream(d, conn, p)
    local sb, code, msg = get_sandbox(d, p.sandbox)
    if not sb then return nil, code, msg end
    local path = abs_path(p.path)
    -- a linux box's file itself, read by the daemon from the thread pool;
    -- where that cannot be (or the open fails: its error comes the
    -- agent's way below) the agent reads it (FS_READ) as before
    local dc = conn.data_conn
    if sb.fs_fd and dc and dc:alive() and M.READ_FD then
      local f, r = take_file(sb, as(p, { path = path }))
      if f and dc:alive() then
        local sid = next_sid(conn)
        local ok = dc:file_fd_read(sb.box.core or sb.box, sid, f, { path = path, offset = p.offset or 0,
          length = p.length })
        f:close()
        if ok then return { stream = sid, size = math.tointeger(r.size) or 0 } end
      elseif f then
        f:close()
      end
    end
    -- the size, and ENOENT/EISDIR/EACCES as a JSON error before any frame
    local r, c, m, x = agent_call(sb, MSG.FS_READ, as(p, { path = path, offset = 0, length = 0 }), rpc.FS_ERROR)
    if not r then return nil, c, m, x end
    local sid, ec, em, ex = open(d, conn, p, false, { path = path, offset = p.offset or 0, length = p.length })
    if not sid then return nil, ec, em, ex end
    return { stream = sid, size = math.tointeger(r.size) or 0 }
  end

  function h.fs_write_stream(d, conn, p)
    local offset = p.offset or 0
    local truncate = p.truncate
    if truncate == nil then truncate = offset == 0 and not p.append end
    local flags = 4 | (truncate and 1 or 0) | (p.append and 2 or 0)
    -- a linux box's file itself, written by the daemon from the thread
    -- pool (the agent's hop saved); where that cannot be, the agent
    -- writes it (FS_WRITE) as before, and says why it fails
    local sb = d.sandboxes[p.sandbox]
    local dc = conn.data_conn
    if sb and sb.fs_fd and sb.state == "running" and dc and dc:alive() and M.WRITE_FD then
      local path = abs_path(p.path)
      local f = take_file(sb, as(p, { path = path, flags = 8 | flags, mode = p.mode or 420 }))
      if f and dc:alive() then
        local sid = next_sid(conn)
        local ok = dc:file_fd(sb.box.core or sb.box, sid, f, { path = path, offset = offset, append = p.append })
        f:close()
        if ok then return { stream = sid } end
      elseif f then
        f:close()
      end
    end
    local sid, ec, em, ex = open(d, conn, p, true, { path = abs_path(p.path), offset = offset,
      flags = flags, mode = p.mode or 420 })
    if not sid then return nil, ec, em, ex end
    return { stream = sid }
  end

  -- ---- open files as descriptors (docs/protocol.md, "Files as descriptors") ----

  -- The reply's id as JSON text (a raw id keeps its text).
  local function id_text(id)
    if type(id) == "table" and id.text then return id.text end
    return json.encode(id)
  end

  -- Sends text with f attached to its first byte on conn's socket, once
  -- nothing else is queued there (else the fd would go with other bytes).
  -- true, or nil and why.
  local function send_with_fd(conn, text, f)
    local deadline = uv.now() + M.FD_SEND_WAIT_MS
    conn:flush() -- replies held from the same read go before (rpc.lua)
    while true do
      if conn.closed or not conn.stream or conn.stream:is_closing() then return nil, "the client went away" end
      if conn.stream:get_write_queue_size() == 0 then
        local fd = conn.stream:fileno()
        if not fd then return nil, "the client's connection has no descriptor" end
        local n, err, errno = core.send_fd(fd, text, f)
        if n then
          if n < #text then conn.stream:write(text:sub(n + 1)) end -- in order: nothing else was queued
          return true
        end
        if errno ~= 11 then return nil, err end -- EAGAIN: the client does not read yet
      end
      if uv.now() >= deadline then return nil, "the client does not read its connection" end
      async.sleep(1)
    end
  end

  -- The box's file, opened by its agent (FS_OPEN, as the account) and
  -- handed over: a core file, or nil, msg, errno, busy (the channel had
  -- other bytes queued all along: nothing was asked).
  function take_file(sb, fields)
    local r, err, errno, unsent
    for _ = 1, 50 do -- the channel must be idle for the socket to go with the frame
      local pair, perr, perrno = core.fd_pair()
      if not pair then return nil, perr, perrno end
      r, err, errno, unsent = sb:request(MSG.FS_OPEN, fields, pair)
      local f
      if r then f, err, errno = pair:take() end
      pair:close()
      if r then
        if f and not f:size() then f:close(); return nil, "the agent's file: fstat failed", 5 end
        if f then return f, r end
        return nil, err, errno
      end
      if unsent ~= 11 then return nil, err, errno end -- EAGAIN: other bytes were queued on the channel
      async.sleep(2)
    end
    return nil, "the sandbox's channel is busy", 11, true
  end

  -- Opens p.path of p.sandbox through its agent and sends the reply with
  -- the open file.  Linux boxes whose agent hands files over only: others
  -- get an error with data.fallback, and the client uses the streams.
  local function open_fd(d, conn, p, flags, mode)
    local sb, code, msg = get_sandbox(d, p.sandbox)
    if not sb then return nil, code, msg end
    if not sb.fs_fd then
      return nil, rpc.FS_ERROR, "this sandbox does not hand out open files (use fs.read_stream or fs.write_stream)",
        { fallback = true }
    end
    if not conn.stream then
      return nil, rpc.INVALID_REQUEST, "open files go only over the daemon's unix socket", { fallback = true }
    end
    local f, err, errno, busy = take_file(sb, as(p, { path = abs_path(p.path), flags = flags, mode = mode }))
    local r = f and err
    if not f then
      -- EOPNOTSUPP: a file the daemon will not hand over (not on a disk or memory
      -- filesystem: l_fsfd.c): the streams can
      if busy or errno == 95 then return nil, rpc.FS_ERROR, err, { fallback = true } end
      return nil, rpc.FS_ERROR, err, errno_data(errno)
    end
    local text = ('{"jsonrpc":"2.0","id":%s,"result":%s}\n'):format(id_text(p._rpc_id),
      json.encode({ size = f:size() or 0, mode = math.tointeger(r.mode) or 0 }))
    local ok, serr = send_with_fd(conn, text, f)
    f:close() -- the client holds its own now (or nobody does)
    if not ok then return nil, rpc.FS_ERROR, serr, { fallback = true } end
    return M.SENT
  end

  function h.fs_write_fd(d, conn, p)
    local truncate = p.truncate
    if truncate == nil then truncate = not p.append end
    -- OPEN_WRITE | PARENTS, and TRUNC / APPEND as fs.write_stream
    local flags = 8 | 4 | (truncate and 1 or 0) | (p.append and 2 or 0)
    return open_fd(d, conn, p, flags, p.mode or 420)
  end

  function h.fs_read_fd(d, conn, p)
    return open_fd(d, conn, p, 0, nil)
  end
end

return M
