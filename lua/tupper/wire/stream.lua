--- The Lua client's data connection (docs/protocol.md, "Stream frames"):
-- file bytes and a process's stdout, stderr, stdin and terminal as binary
-- frames beside the JSON connection, with credit, instead of base64 inside
-- JSON.  Used by the CLI's `cp`, `exec` and `run`; calls are asynchronous
-- like the client's (run them in a coroutine).
local uv = require("luv")
local async = require("tupper.util.async")
local json = require("tupper.util.json")

local M = {}

M.VERSION = 1
M.PROCESS_STREAMS = 1       -- hello's `process_streams` this client speaks
M.HDR = 12
M.WINDOW = 4 * 1024 * 1024  -- what this client lets the daemon send ahead, per stream
M.CHUNK = 1048576           -- bytes per DATA frame

local T = { OPEN = 1, DATA = 2, END = 3, ERROR = 4, CREDIT = 5 }
M.TYPES = T

--- One frame as bytes.
function M.frame(type_, sid, payload)
  payload = payload or ""
  return string.pack("<I4BBI2I4", #payload, M.VERSION, type_, 0, sid) .. payload
end

local DC = {}
DC.__index = DC

local ERRNO_NAMES = { [1] = "EPERM", [2] = "ENOENT", [5] = "EIO", [13] = "EACCES", [17] = "EEXIST",
  [20] = "ENOTDIR", [21] = "EISDIR", [22] = "EINVAL", [28] = "ENOSPC", [71] = "EPROTO",
  [104] = "ECONNRESET", [110] = "ETIMEDOUT" }

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

-- Frames out of the socket's chunks.  A header is read once it is whole;
-- its payload is gathered as the chunks come and joined once (a 1 MiB DATA
-- frame crosses 16 reads of 64 KiB: one copy of it, not three).
function DC:_feed(chunk)
  local pos = 1
  while not self.closed do
    if not self.hdr then
      local want = M.HDR - self.have
      local avail = #chunk - pos + 1
      if avail <= 0 then return end
      local piece = avail <= want and (pos == 1 and chunk or chunk:sub(pos)) or chunk:sub(pos, pos + want - 1)
      self.parts[#self.parts + 1] = piece
      self.have = self.have + #piece
      pos = pos + #piece
      if self.have < M.HDR then return end
      local h = table.concat(self.parts)
      local len, ver, type_, flags, sid = string.unpack("<I4BBI2I4", h)
      if ver ~= M.VERSION or flags ~= 0 or len > M.CHUNK + 8192 then
        return self:_down("the daemon sent a bad frame", 71)
      end
      self.hdr = { len = len, type = type_, sid = sid }
      self.parts, self.have = {}, 0
    end
    local hdr = self.hdr
    local want = hdr.len - self.have
    local avail = #chunk - pos + 1
    if want > 0 then
      if avail <= 0 then return end
      local piece = avail <= want and (pos == 1 and chunk or chunk:sub(pos)) or chunk:sub(pos, pos + want - 1)
      self.parts[#self.parts + 1] = piece
      self.have = self.have + #piece
      pos = pos + #piece
      if self.have < hdr.len then return end
    end
    local payload = #self.parts == 1 and self.parts[1] or table.concat(self.parts)
    self.hdr, self.parts, self.have = nil, {}, 0
    self:_frame(hdr.type, hdr.sid, payload)
  end
end

function DC:_down(msg, errno)
  if self.closed then return end
  self.closed = true
  self.reason = msg
  if not self.pipe:is_closing() then self.pipe:close() end
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

function DC:_send(bytes)
  if self.closed then return nil, self.reason or "data connection closed" end
  self.pipe:write(bytes)
  -- keep what is queued bounded: wait while the kernel does not take it
  while not self.closed and self.pipe:get_write_queue_size() > 2 * M.CHUNK do async.sleep(1) end
  return true
end

local function fail(ev)
  return nil, { code = -32002, message = ev[2], data = { errno = ev[3], code = ERRNO_NAMES[ev[3]] } }
end

--- Reads a box's file into sink(chunk) (false from sink stops with an error).
-- params as fs.read_stream's.  Returns the bytes read, or nil and an error object.
function DC:read_file(client, params, sink)
  local r, err = client:call("fs.read_stream", params)
  if not r then return nil, err end
  local sid = r.stream
  while true do
    local ev = self:_next(sid)
    if ev[1] == "data" then
      local pok, ok, serr = pcall(sink, ev[2])
      if not pok then serr = ok end
      if not pok or not ok then
        self:_send(M.frame(T.ERROR, sid, string.pack("<I4", 125) .. "the client stopped"))
        self.streams[sid] = nil
        return nil, { code = -1, message = tostring(serr) }
      end
      self:_send(M.frame(T.CREDIT, sid, string.pack("<I4", #ev[2])))
    elseif ev[1] == "end" then
      self.streams[sid] = nil
      return ev[2] or 0, nil, r.size
    elseif ev[1] == "error" then
      self.streams[sid] = nil
      return fail(ev)
    end
  end
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

--- Writes what source() returns (strings; nil at the end) to a box's file.
-- params as fs.write_stream's.  Returns the bytes written, or nil and an error object.
function DC:write_file(client, params, source)
  local w, err = self:writer(client, params)
  if not w then return nil, err end
  while true do
    local chunk = source()
    if chunk == nil then break end
    local ok, werr = w:write(chunk)
    if not ok then return nil, werr end
  end
  return w:finish()
end

--- Reads stream sid (a process's stdout or stderr, or its terminal) into
-- sink(chunk), giving the daemon credit as sink returns: a slow sink slows
-- the process down.  false from sink stops the stream with an error.
-- Returns the bytes read (END's size), or nil and an error object.
function DC:drain(sid, sink)
  while true do
    local ev = self:_next(sid)
    if ev[1] == "data" then
      local pok, ok, serr = pcall(sink, ev[2])
      if not pok then serr = ok end
      if not pok or ok == false then
        self:_send(M.frame(T.ERROR, sid, string.pack("<I4", 125) .. "the client stopped"))
        self.streams[sid] = nil
        return nil, { code = -1, message = tostring(serr or "the client stopped") }
      end
      self:_send(M.frame(T.CREDIT, sid, string.pack("<I4", #ev[2])))
    elseif ev[1] == "end" then
      if not (self.streams[sid] and self.streams[sid].input) then self.streams[sid] = nil end
      return ev[2] or 0
    elseif ev[1] == "error" then
      self.streams[sid] = nil
      return fail(ev)
    end
  end
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
  local self = setmetatable({ pipe = pipe, streams = {}, parts = {}, have = 0, closed = false }, DC)
  window = window or M.WINDOW
  -- the attach's reply is the only JSON line; frames follow it
  local line_parts, attached, waiter = {}, nil, nil
  pipe:read_start(function(e, chunk)
    if e or not chunk then
      if attached == nil then attached = false; if waiter then waiter() end end
      return self:_down(e or "the daemon closed the data connection")
    end
    if attached then return self:_feed(chunk) end
    line_parts[#line_parts + 1] = chunk
    local text = table.concat(line_parts)
    local nl = text:find("\n", 1, true)
    if not nl then line_parts = { text }; return end
    attached = json.decode(text:sub(1, nl - 1)) or false
    if nl < #text then self:_feed(text:sub(nl + 1)) end
    if waiter then waiter() end
  end)
  pipe:write(json.encode({ jsonrpc = "2.0", id = 1, method = "stream.attach",
    params = { token = r.token, window = window } }) .. "\n")
  if attached == nil then async.wait(function(cb) waiter = cb end) end
  if not attached or not attached.result then
    local msg = attached and attached.error and attached.error.message or "no reply"
    self:_down(msg)
    return nil, "stream.attach: " .. msg
  end
  return self
end

return M
