--- JSON-RPC 2.0 over a byte stream, one JSON object per line (NDJSON).
-- Used by both ends: the daemon wraps each accepted connection, the Lua
-- client wraps its socket.  Every line is bounded (MAX_LINE); a peer that
-- sends more is answered with an error and disconnected, and a peer that
-- does not read its replies is disconnected before they pile up past
-- MAX_BACKLOG.
local json = require("tupper.util.json")

local M = {}

-- the socket API's version, said in `hello` (wire/schema.lua carries it with
-- the methods; here for the clients, which need no schema to connect)
M.PROTOCOL = 1

M.MAX_LINE = 16 * 1024 * 1024
M.MAX_BACKLOG = 64 * 1024 * 1024
-- most bytes of replies held for one write (hold_replies): past it they go
-- as they come, into the write queue that MAX_BACKLOG bounds
M.HOLD_MAX = 64 * 1024

M.PARSE_ERROR = -32700
M.INVALID_REQUEST = -32600
M.METHOD_NOT_FOUND = -32601
M.INVALID_PARAMS = -32602
M.INTERNAL_ERROR = -32603
-- application errors (docs/protocol.md)
M.NOT_FOUND = -32000
M.SANDBOX_ERROR = -32001
M.FS_ERROR = -32002
M.PROCESS_ERROR = -32003
M.BUSY = -32004
M.POLICY_DENIED = -32005
M.IMAGE_ERROR = -32006 -- data = { kind = ... } (tupper.registry)

local Conn = {}
Conn.__index = Conn

-- ------------------------------------------------------------------ ids
-- A reply carries its request's id unchanged (JSON-RPC 2.0, section 5).  A
-- string id and an integer below 10^14 survive the decode and the encode;
-- other numbers (1.5, -0, 1e400, 12345678901234567) do not: the decoder
-- makes a double of them (1e400 is infinity, which JSON cannot carry) and
-- the encoder prints 14 digits.  For those the reply echoes the number's
-- text as the request spelled it: the request's id becomes a RawId.
local RawId = {}
RawId.__index = RawId

local function exact_number(v)
  return v == v and v ~= math.huge and v ~= -math.huge and math.tointeger(v) ~= nil
    and math.abs(v) < 1e14 and not (v == 0 and 1 / v < 0)
end

-- the end of the JSON string that opens at i (the line decoded, so it is well formed)
local function string_end(line, i)
  local j = i + 1
  while true do
    local k = line:find('["\\]', j)
    if line:byte(k) == 34 then return k end
    j = k + 2
  end
end

-- the end of the JSON value that starts at i
local function value_end(line, i)
  local c = line:byte(i)
  if c == 34 then return string_end(line, i) end
  if c ~= 123 and c ~= 91 then return (line:find("[,}%]%s]", i) or #line + 1) - 1 end
  local depth, j = 0, i
  while true do
    local k = line:find('[%[%]{}"]', j)
    local b = line:byte(k)
    if b == 34 then
      k = string_end(line, k)
    elseif b == 123 or b == 91 then
      depth = depth + 1
    else
      depth = depth - 1
      if depth == 0 then return k end
    end
    j = k + 1
  end
end

--- The text of the last top-level member `"id"` of the JSON object in line
-- (the one the decoder kept), or nil.
local function raw_member(line, name)
  local i = line:find("{", 1, true)
  local found
  while i do
    local ks = line:find('"', i + 1, true)
    if not ks then break end
    local ke = string_end(line, ks)
    local key = line:sub(ks, ke)
    if key:find("\\", 1, true) then key = json.decode(key) else key = key:sub(2, -2) end
    local vs = line:find("[^%s:]", ke + 1)
    local ve = value_end(line, vs)
    if key == name then found = line:sub(vs, ve) end
    i = line:find("[,}]", ve + 1)
    if not i or line:byte(i) == 125 then break end
  end
  return found
end

--- Whether v is an id a request may carry: a string, a number, null.
function M.valid_id(v)
  return type(v) == "string" or type(v) == "number" or v == json.null or getmetatable(v) == RawId
end

--- Wraps a luv stream.  handlers.message(conn, msg, err) gets every decoded
-- object (or nil and an error for a bad line); handlers.close(conn) runs once.
function M.wrap(stream, handlers, opts)
  local self = setmetatable({
    stream = stream,
    handlers = handlers,
    parts = {},
    size = 0,
    closed = false,
    max_line = opts and opts.max_line or M.MAX_LINE,
    max_backlog = opts and opts.max_backlog or M.MAX_BACKLOG, -- 0: no bound
    on_backlog = opts and opts.on_backlog, -- called (conn, bytes) before the drop
    -- the replies the lines of one read make at once go out in one write
    -- (the daemon's side: `tupper exec` sends hello, stream.channel and
    -- process.start together, and is woken once for the first two replies)
    hold_replies = opts and opts.hold_replies,
  }, Conn)
  stream:read_start(function(err, chunk)
    if err or not chunk then
      self:close()
      return
    end
    self:_feed(chunk)
  end)
  return self
end

function Conn:_line(line)
  if line:match("^%s*$") then return end
  local msg, err = json.decode(line)
  if msg == nil or type(msg) ~= "table" then
    self.handlers.message(self, nil, err or "not a JSON object")
  else
    local id = msg.id
    if type(id) == "number" and not exact_number(id) then
      local text = raw_member(line, "id")
      if text then msg.id = setmetatable({ text = text, value = id }, RawId) end
    end
    self.handlers.message(self, msg)
  end
end

function Conn:_feed(chunk)
  if not self.hold_replies then return self:_feed_lines(chunk) end
  self.held, self.held_bytes = {}, 0
  local ok, err = pcall(self._feed_lines, self, chunk)
  self:flush()
  if not ok then error(err, 0) end
end

--- Writes what the lines read so far answered at once (hold_replies),
-- before anything else writes to the socket (an fd's reply, a handover).
function Conn:flush()
  local held = self.held
  self.held = nil
  if held and #held > 0 and not self.closed and not self.stream:is_closing() then self.stream:write(held) end
end

function Conn:_feed_lines(chunk)
  local start = 1
  while not self.closed do
    local nl = chunk:find("\n", start, true)
    if not nl then break end
    local piece = chunk:sub(start, nl - 1)
    if self.size + #piece > self.max_line then
      return self:_too_long()
    end
    if #self.parts > 0 then
      self.parts[#self.parts + 1] = piece
      piece = table.concat(self.parts)
      self.parts, self.size = {}, 0
    end
    self:_line(piece)
    start = nl + 1
  end
  if self.closed or start > #chunk then return end
  local rest = chunk:sub(start)
  self.size = self.size + #rest
  if self.size > self.max_line then return self:_too_long() end
  self.parts[#self.parts + 1] = rest
end

function Conn:_too_long()
  self.parts, self.size = {}, 0
  self:send({ jsonrpc = "2.0", id = json.null,
    error = { code = M.INVALID_REQUEST, message = ("message longer than %d bytes"):format(self.max_line) } })
  self:close()
end

--- Sends one object; returns true, or nil and an error.
-- result: JSON text (json.raw's: a string or a list of strings) to go in
-- as the member "result"
function Conn:send(obj, result)
  if self.closed then return nil, "connection closed" end
  local text, err
  if getmetatable(obj.id) == RawId then
    local raw = obj.id
    obj.id = nil
    text, err = json.encode(obj)
    obj.id = raw
    if text then text = '{"id":' .. raw.text .. "," .. text:sub(2) end
  else
    text, err = json.encode(obj)
  end
  if not text then return nil, err end
  -- obj has members (jsonrpc at least): text is `{...}`, never `{}`
  local out
  if type(result) == "table" then -- its strings, written as they are (json.raw)
    out = { '{"result":' }
    table.move(result, 1, #result, 2, out)
    out[#out + 1] = ","
    out[#out + 1] = text:sub(2)
    out[#out + 1] = "\n"
  elseif result then
    out = '{"result":' .. result .. "," .. text:sub(2) .. "\n"
  else
    out = text .. "\n"
  end
  local queued = self.stream:get_write_queue_size()
  if self.max_backlog > 0 and queued > self.max_backlog then
    -- the peer does not read: drop it rather than buffer without bound
    -- (at once: a shutdown would wait for the bytes it does not read)
    if self.on_backlog then self.on_backlog(self, queued) end
    self.stream:read_stop()
    if not self.stream:is_closing() then self.stream:close() end
    self:close()
    return nil, "peer is not reading"
  end
  -- the daemon's: a data connection's frames held for this line (a
  -- process's OPENs before its start's reply, its ENDs before its exit)
  -- go right before it, so that the client finds both in one poll
  local before = self.before_write
  if before then before(self) end
  local held = self.held
  if held then -- in order, with the others of this read (Conn:flush)
    local n = 0
    if type(out) == "table" then
      for i = 1, #out do n = n + #out[i] end
    else
      n = #out
    end
    if self.held_bytes + n <= M.HOLD_MAX then
      if type(out) == "table" then
        table.move(out, 1, #out, #held + 1, held)
      else
        held[#held + 1] = out
      end
      self.held_bytes = self.held_bytes + n
      return true
    end
    self:flush() -- too much to hold: what waits goes first, this one after it
    self.held, self.held_bytes = {}, 0
  end
  -- a reply of one string is written at once where the socket takes it
  -- all (uv_try_write: libuv queues nothing, then, and calls nothing back;
  -- it refuses while anything is queued, so the order holds), else queued
  -- as before.  A list of strings (json.raw's) is queued as it is: its
  -- length, to tell a partial write, would be summed in Lua for each call.
  local n = type(out) == "string" and self.stream:try_write(out)
  if not n then
    self.stream:write(out)
  elseif n < #out then -- the rest of a partial write
    self.stream:write(out:sub(n + 1))
  end
  return true
end

function Conn:reply(id, result)
  local raw = json.raw_text(result)
  if raw then return self:send({ jsonrpc = "2.0", id = id }, raw) end
  return self:send({ jsonrpc = "2.0", id = id, result = result })
end

function Conn:error(id, code, message, data)
  return self:send({ jsonrpc = "2.0", id = id == nil and json.null or id,
    error = { code = code, message = message, data = data } })
end

function Conn:notify(method, params)
  return self:send({ jsonrpc = "2.0", method = method, params = params })
end

function Conn:backlog()
  return self.closed and 0 or self.stream:get_write_queue_size()
end

function Conn:close()
  if self.closed then return end
  self:flush()
  self.closed = true
  if not self.stream:is_closing() then
    self.stream:read_stop()
    -- let queued replies go out before the close
    local req = self.stream:shutdown(function()
      if not self.stream:is_closing() then self.stream:close() end
    end)
    if not req then self.stream:close() end
  end
  if self.handlers.close then self.handlers.close(self) end
end

return M
