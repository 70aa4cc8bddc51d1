--- The Lua client's data connection (docs/protocol.md, "Stream frames"):
-- file bytes and a process's stdout, stderr, stdin and terminal as binary
-- frames beside the JSON connection, with credit, instead of base64 inside
-- JSON.  Used by the CLI's `cp`, `exec` and `run`; calls are asynchronous
-- like the client's (run them in a coroutine).  Given an fd instead of a
-- function, a stream's bytes never become Lua strings: the connection's
-- pump in C (tupper.wire.pump) moves them.
local uv = require("luv")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local pump = require("tupper.wire.pump")

local M = {}

M.VERSION = 1
M.PROCESS_STREAMS = 1       -- hello's `process_streams` this client speaks
M.HDR = 12
M.WINDOW = 4 * 1024 * 1024  -- what this client lets the daemon send ahead, per stream
M.CHUNK = 1048576           -- bytes per DATA frame
M.QUEUED_MAX = 2 * M.CHUNK  -- bytes queued for the socket before a sender waits

local T = { OPEN = 1, DATA = 2, END = 3, ERROR = 4, CREDIT = 5 }
M.TYPES = T

--- One frame as bytes.
function M.frame(type_, sid, payload)
  payload = payload or ""
  return string.pack("<I4BBI2I4", #payload, M.VERSION, type_, 0, sid) .. payload
end

-- The connection itself is a C pump (runtime/host/spump.h): it reads and
-- checks the frames, and moves the bytes of a stream given an fd (a sink:
-- stdout, a host file; a source: a host file) without a Lua string per
-- chunk, giving credit as the fd takes them.  Every other frame, and the
-- end of a pumped stream, comes here as an event.
local DC = {}
DC.__index = DC

local ERRNO_NAMES = { [1] = "EPERM", [2] = "ENOENT", [5] = "EIO", [13] = "EACCES", [17] = "EEXIST",
  [20] = "ENOTDIR", [21] = "EISDIR", [22] = "EINVAL", [27] = "EFBIG", [28] = "ENOSPC", [32] = "EPIPE",
  [71] = "EPROTO", [104] = "ECONNRESET", [110] = "ETIMEDOUT", [125] = "ECANCELED" }

local function stream_of(self, sid)
  local s = self.streams[sid]
  if not s then
    s = { queue = {}, credit = 0 }
    self.streams[sid] = s
  end
  return s
end

-- Hands a stream event to whoever waits on that stream.
local function push(self, sid, ev)
  local s = stream_of(self, sid)
  s.queue[#s.queue + 1] = ev
  if s.wake then
    local w = s.wake
    s.wake = nil
    w()
  end
end

-- Wakes an input writer that waits for credit (or for the stream's end).
local function wake_input(s)
  if s.cwake then
    local w = s.cwake
    s.cwake = nil
    w()
  end
end

function DC:_frame(type_, sid, payload)
  if type_ == T.OPEN then
    local _, window = string.unpack("<I4I4", payload)
    local s = stream_of(self, sid)
    s.credit = window
    if s.input then return wake_input(s) end
    push(self, sid, { "credit" }) -- a writer may be waiting for its first window
  elseif type_ == T.DATA then
    push(self, sid, { "data", payload })
  elseif type_ == T.END then
    local s = stream_of(self, sid)
    s.over = s.over or "the process takes no more input"
    wake_input(s)
    push(self, sid, { "end", #payload == 8 and string.unpack("<I8", payload) or nil })
  elseif type_ == T.ERROR then
    local errno = string.unpack("<I4", payload)
    local msg = payload:sub(5)
    if sid == 0 then return self:_down(msg ~= "" and msg or "the daemon closed the data connection", errno) end
    local s = stream_of(self, sid)
    s.over, s.errno = msg, errno
    wake_input(s)
    push(self, sid, { "error", msg, errno })
  elseif type_ == T.CREDIT then
    local s = stream_of(self, sid)
    s.credit = s.credit + string.unpack("<I4", payload)
    if s.input then return wake_input(s) end
    push(self, sid, { "credit" })
  end
end

-- The pump's events: frames of the daemon, or a failure here (loc: the
-- pump told the daemon already; sid 0: the connection is over).
function DC:_events(evs)
  if not evs then return end
  for _, ev in ipairs(evs) do
    if not ev.loc then
      self:_frame(ev.type, ev.sid, ev.payload)
    elseif ev.sid == 0 then
      self:_down(ev.msg, ev.err)
    else
      local s = stream_of(self, ev.sid)
      s.over, s.errno = ev.msg, ev.err
      wake_input(s)
      push(self, ev.sid, { "error", ev.msg, ev.err, true })
    end
  end
end

-- Polls for writing only while bytes wait for the socket; wakes senders
-- once the queue is short again.
function DC:_arm()
  if self.closed then return end
  local queued = self.p:queued()
  local want = queued > 0 and "rw" or "r"
  if want ~= self.mode then
    self.mode = want
    self.poll:start(want, self.on_poll)
  end
  if queued <= M.QUEUED_MAX and #self.qwait > 0 then
    local ws = self.qwait
    self.qwait = {}
    for _, w in ipairs(ws) do w() end
  end
end

function DC:_io(what)
  if self.closed then return end
  if what:find("r", 1, true) then
    local evs, over = self.p:read()
    self:_events(evs)
    if over then return self:_down("the data connection is over", 104) end
  end
  if not self.closed and what:find("w", 1, true) then
    local evs, over = self.p:write()
    self:_events(evs)
    if over then return self:_down("the data connection is over", 104) end
  end
  self:_arm()
end

function DC:_down(msg, errno)
  if self.closed then return end
  self.closed = true
  self.reason = msg
  if not self.poll:is_closing() then self.poll:close() end
  self.p:close()
  for _, w in ipairs(self.qwait) do w() end
  self.qwait = {}
  for sid, s in pairs(self.streams) do
    s.over = s.over or msg
    wake_input(s)
    push(self, sid, { "error", msg, errno or 104 })
  end
end

-- The next event of stream sid (waits for one).
function DC:_next(sid)
  local s = stream_of(self, sid)
  while #s.queue == 0 do
    if self.closed then return { "error", self.reason or "data connection closed", 104 } end
    async.wait(function(cb) s.wake = cb end)
  end
  return table.remove(s.queue, 1)
end

-- Queues frames for the socket; waits while too much is queued.
function DC:_send(bytes)
  if self.closed then return nil, self.reason or "data connection closed" end
  local ok, err = self.p:send(bytes)
  if not ok then return nil, err end
  self:_io("w")
  while not self.closed and self.p:queued() > M.QUEUED_MAX do
    async.wait(function(cb) self.qwait[#self.qwait + 1] = cb end)
  end
  if self.closed then return nil, self.reason or "data connection closed" end
  return true
end

local function fail(ev)
  return nil, { code = -32002, message = ev[2], data = { errno = ev[3], code = ERRNO_NAMES[ev[3]] },
                loc = ev[4] or nil }
end

-- Writes data to fd as a blocking write would: true, or nil and why.
local function write_fd(fd, data)
  local off = 0
  while off < #data do
    local n, err, name = uv.fs_write(fd, off == 0 and data or data:sub(off + 1), -1)
    if not n then return nil, "write: " .. tostring(err), name end
    off = off + n
  end
  return true
end

local ERRNO_OF = { EPIPE = 32, ENOSPC = 28, EFBIG = 27, EIO = 5, EBADF = 9 }

-- The one read loop.  Stream sid's bytes go to sink: a function (each
-- chunk as a string; false or an error stops it) or an fd, written by the
-- pump in C once what came before is out (Lua sees only the end).  Credit
-- goes back as the sink takes the bytes, so a slow sink slows the sender.
-- At most limit bytes (an fd sink).  Returns the END's size, or nil and an
-- error object (loc: it failed here, and the daemon was told).
function DC:_drain(sid, sink, limit)
  local s = stream_of(self, sid)
  local got = 0
  local function stop(msg, errno)
    if not s.pumped then
      self:_send(M.frame(T.ERROR, sid, string.pack("<I4", 125) .. "the client stopped"))
    end
    if s.pumped and not self.closed then self.p:drop(sid) end
    self.streams[sid] = nil
    return nil, { code = -1, message = tostring(msg or "the client stopped"),
                  data = { errno = errno, code = ERRNO_NAMES[errno or 0] }, loc = true }
  end
  while true do
    if type(sink) == "number" and not s.pumped and #s.queue == 0 and not self.closed then
      local ok, perr, code = self.p:sink(sid, sink, limit and limit - got or nil)
      if not ok then return stop(perr, code) end
      s.pumped = true
    end
    local ev = self:_next(sid)
    if ev[1] == "data" then
      if type(sink) == "number" then
        if limit and got + #ev[2] > limit then return stop("more bytes than asked for", 27) end
        local ok, werr, name = write_fd(sink, ev[2])
        if not ok then return stop(werr, ERRNO_OF[name] or 5) end
      else
        local pok, ok, serr = pcall(sink, ev[2])
        if not pok or ok == false then return stop(pok and serr or ok) end
      end
      got = got + #ev[2]
      self:_send(M.frame(T.CREDIT, sid, string.pack("<I4", #ev[2])))
    elseif ev[1] == "end" then
      if not s.input then self.streams[sid] = nil end
      return ev[2] or 0
    elseif ev[1] == "error" then
      if s.pumped and not self.closed then self.p:drop(sid) end
      self.streams[sid] = nil
      return fail(ev)
    end
  end
end

--- Reads a box's file into sink: a function called with each chunk (false
-- from it stops with an error) or an fd that the bytes are written to in C.
-- params as fs.read_stream's; limit: most bytes an fd takes.  Returns the
-- bytes read, nil and the file's size, or nil and an error object.
function DC:read_file(client, params, sink, limit)
  local r, err = client:call("fs.read_stream", params)
  if not r then return nil, err end
  local n, derr = self:_drain(r.stream, sink, limit)
  if not n then return nil, derr end
  return n, nil, r.size
end

local Writer = {}
Writer.__index = Writer

--- Sends data (a string) on the writer's stream, within its credit.
-- Returns true, or nil and an error object (the daemon's ERROR, or the
-- connection's end).
function Writer:write(data)
  local dc, sid, s = self.dc, self.sid, self.s
  local off = 1
  while off <= #data do
    for i, ev in ipairs(s.queue) do
      if ev[1] == "error" then table.remove(s.queue, i); dc.streams[sid] = nil; return fail(ev) end
    end
    while s.credit == 0 do
      local ev = dc:_next(sid)
      if ev[1] == "error" then dc.streams[sid] = nil; return fail(ev) end
    end
    local n = math.min(#data - off + 1, s.credit, M.CHUNK)
    s.credit = s.credit - n
    local ok, serr = dc:_send(M.frame(T.DATA, sid, off == 1 and n == #data and data or data:sub(off, off + n - 1)))
    if not ok then return nil, { code = -1, message = serr } end
    off = off + n
  end
  return true
end

--- Ends the stream and waits for the daemon's END: the bytes written, or
-- nil and an error object.
function Writer:finish()
  local dc, sid = self.dc, self.sid
  dc:_send(M.frame(T.END, sid))
  while true do
    local ev = dc:_next(sid)
    if ev[1] == "end" then dc.streams[sid] = nil; return ev[2] or 0 end
    if ev[1] == "error" then dc.streams[sid] = nil; return fail(ev) end
  end
end

--- Opens a write stream (fs.write_stream with params): a writer, or nil
-- and an error object.
function DC:writer(client, params)
  local r, err = client:call("fs.write_stream", params)
  if not r then return nil, err end
  return setmetatable({ dc = self, sid = r.stream, s = stream_of(self, r.stream) }, Writer)
end

--- Sends the rest of fd (a host file) on the writer's stream from C, at
-- most length bytes, then ends it and waits for the daemon's END: the
-- bytes written, or nil and an error object.  An fd that is not a regular
-- file is read here instead.
function Writer:pump(fd, length)
  local dc, sid, s = self.dc, self.sid, self.s
  for i = #s.queue, 1, -1 do -- the window of its OPEN moves to the pump
    local k = s.queue[i][1]
    if k == "credit" then table.remove(s.queue, i) elseif k == "error" or k == "end" then break end
  end
  if #s.queue == 0 and not dc.closed then
    local ok, _, code = dc.p:source(sid, fd, s.credit, length)
    if ok then
      s.credit, s.pumped = 0, true
      dc:_io("w")
      local ev = dc:_next(sid)
      while ev[1] == "credit" do ev = dc:_next(sid) end
      if not dc.closed then dc.p:drop(sid) end
      dc.streams[sid] = nil
      if ev[1] == "end" then return ev[2] or 0 end
      return fail(ev)
    end
    if code ~= 22 then return fail({ "error", "the pump refused the file", code }) end
  end
  local left = length or math.huge
  while left > 0 do
    local data, rerr = uv.fs_read(fd, math.min(M.CHUNK, left), -1)
    if not data then self:abort(); return nil, { code = -1, message = "read: " .. tostring(rerr), loc = true } end
    if #data == 0 then break end
    left = left - #data
    local ok, werr = self:write(data)
    if not ok then return nil, werr end
  end
  return self:finish()
end

--- Gives up on the writer's stream (an ERROR to the daemon).
function Writer:abort()
  self.dc:_send(M.frame(T.ERROR, self.sid, string.pack("<I4", 125) .. "the client stopped"))
  self.dc.streams[self.sid] = nil
end

--- Writes a box's file from source: a function that returns strings (nil
-- at the end), or an fd whose bytes are sent from C (Writer:pump).
-- params as fs.write_stream's.  Returns the bytes written, or nil and an error object.
function DC:write_file(client, params, source)
  local w, err = self:writer(client, params)
  if not w then return nil, err end
  if type(source) == "number" then return w:pump(source) end
  while true do
    local chunk = source()
    if chunk == nil then break end
    local ok, werr = w:write(chunk)
    if not ok then return nil, werr end
  end
  return w:finish()
end

--- Reads stream sid (a process's stdout or stderr, or its terminal) into
-- sink, giving the daemon credit as the sink takes the bytes: a slow sink
-- slows the process down.  sink: a function (each chunk; false from it
-- stops the stream with an error) or an fd the bytes are written to in C.
-- Returns the bytes read (END's size), or nil and an error object (loc:
-- the sink failed, e.g. EPIPE, and the daemon was told).
function DC:drain(sid, sink)
  return self:_drain(sid, sink)
end

local Input = {}
Input.__index = Input

--- Sends data (a string) on a process's stdin or terminal stream, within
-- its credit (waits for more).  Returns true, or nil and a message (the
-- process takes no more input, the stream or the connection is over).
function Input:write(data)
  local dc, sid, s = self.dc, self.sid, self.s
  local off = 1
  while off <= #data do
    while s.credit == 0 and not s.over and not dc.closed do
      async.wait(function(cb) s.cwake = cb end)
    end
    if s.over or dc.closed then return nil, s.over or dc.reason or "data connection closed" end
    local n = math.min(#data - off + 1, s.credit, M.CHUNK)
    s.credit = s.credit - n
    local ok, serr = dc:_send(M.frame(T.DATA, sid, off == 1 and n == #data and data or data:sub(off, off + n - 1)))
    if not ok then return nil, serr end
    off = off + n
  end
  return true
end

--- Sends the rest of fd (a regular file: the CLI's stdin redirected from
-- one) from C, within the stream's credit, then its END.  Returns true,
-- or nil and a message when fd is not a regular file (then write it).
function Input:pump(fd)
  local dc, sid, s = self.dc, self.sid, self.s
  if s.over or dc.closed then return nil, s.over or dc.reason or "data connection closed" end
  local ok, perr = dc.p:source(sid, fd, s.credit)
  if not ok then return nil, perr end
  s.credit, s.pumped = 0, true
  dc:_io("w")
  return true
end

--- The end of the input (the process's stdin is closed once it read what came).
function Input:close()
  if self.s.over or self.dc.closed then return end
  self.dc:_send(M.frame(T.END, self.sid))
end

--- A writer for stream sid, a process's stdin or terminal (opened by the
-- daemon: process.start's `streams`).
function DC:input(sid)
  local s = stream_of(self, sid)
  s.input = true
  -- its OPEN may have come already, as a credit event in the queue
  for i = #s.queue, 1, -1 do
    if s.queue[i][1] == "credit" then table.remove(s.queue, i) end
  end
  return setmetatable({ dc = self, sid = sid, s = s }, Input)
end

function DC:close()
  self:_down("closed")
end

--- Opens the data connection of client (stream.channel, then stream.attach
-- on a second connection to the same socket).  Returns it, or nil, err.
function M.open(client, window)
  if not (client.server and client.server.streams == M.VERSION) then
    return nil, "the daemon has no data plane"
  end
  local r, err = client:call("stream.channel", {})
  if not r then return nil, err.message end
  local pipe = uv.new_pipe(false)
  local cerr = async.wait(function(cb) pipe:connect(client.socket, function(e) cb(e) end) end)
  if cerr then pipe:close(); return nil, cerr end
  -- the attach's reply is the only JSON line; frames follow it, for the pump
  local buf, attached, waiter = "", nil, nil
  local function got(v)
    if attached ~= nil then return end
    attached = v
    pipe:read_stop()
    if waiter then waiter() end
  end
  pipe:read_start(function(e, chunk)
    if attached ~= nil then return end
    if e or not chunk then return got(false) end
    buf = buf .. chunk
    local nl = buf:find("\n", 1, true)
    if not nl then
      if #buf > 65536 then got(false) end
      return
    end
    local reply = json.decode(buf:sub(1, nl - 1)) or false
    buf = buf:sub(nl + 1)
    got(reply)
  end)
  pipe:write(json.encode({ jsonrpc = "2.0", id = 1, method = "stream.attach",
    params = { token = r.token, window = window or M.WINDOW } }) .. "\n")
  if attached == nil then async.wait(function(cb) waiter = cb end) end
  if not attached or not attached.result then
    pipe:close()
    local msg = attached and attached.error and attached.error.message or "no reply"
    return nil, "stream.attach: " .. msg
  end
  local p, perr = pump.new(pipe:fileno(), buf)
  pipe:close()
  if not p then return nil, perr end
  local self = setmetatable({ p = p, streams = {}, closed = false, qwait = {}, mode = "r" }, DC)
  self.poll = uv.new_poll(p:fd())
  self.on_poll = function(e, what)
    if e then return self:_down("data connection: " .. tostring(e), 104) end
    self:_io(what or "r")
  end
  self.poll:start("r", self.on_poll)
  if #buf > 0 then self:_io("r") end -- frames that came with the reply
  return self
end

return M
