--- Harness of fuzz_rpc.c: returns a function that takes one fuzz input.
--
-- Input layout: byte 1 picks the line cap (so short inputs reach the
-- too-long path), byte 2 seeds the chunk sizes the stream is cut into (so
-- lines arrive split across reads); the rest is the byte stream a client
-- writes to the daemon's socket.
--
-- The bytes go through rpc.wrap's read callback on a fake luv stream.  Every
-- message is handled the way daemon.lua's connection handler and
-- Daemon:_request do before they dispatch (batch, id, jsonrpc, method,
-- schema.validate), and is also validated against every method of the
-- schema.  Checked, beyond "no Lua error":
--  * the messages seen, in order, are exactly the non-blank lines of the
--    stream up to the first one over the cap, decoded (an oracle that does
--    not depend on how the stream was cut);
--  * a line over the cap gets one -32600 reply and the connection closes;
--  * what validate returns obeys the schema it was checked against (types,
--    ranges, patterns, no NUL where the agent refuses one);
--  * every request with an id gets exactly one reply, every reply is one
--    JSON line that decodes back, nothing is written after close, close
--    runs once.
-- Findings that are known and reported are counted (printed once each)
-- unless FUZZ_RPC_STRICT=1, which makes them fatal like any other.
local rpc = require("tupper.wire.rpc")
local json = require("tupper.util.json")
local schema = require("tupper.wire.schema")
local has_units, units = pcall(require, "tupper.util.units")

local STRICT = os.getenv("FUZZ_RPC_STRICT") == "1"
local CAPS = { 16, 200, 4096, rpc.MAX_LINE }
-- a string the agent takes as a string field: no NUL, at most TP_STR_MAX
local TP_STR_MAX = 4096 * 8
-- parameters whose values travel to the agent as string fields
local AGENT_STRINGS = { cmd = true, cwd = true, path = true, from = true, to = true }

local known_seen = {}

--- A known finding: fatal in strict mode, else printed once and counted.
local function known(name, detail)
  if STRICT then error("finding " .. name .. ": " .. detail, 2) end
  if not known_seen[name] then
    io.stderr:write(("fuzz_rpc: known finding %s: %s\n"):format(name, detail))
    known_seen[name] = 0
  end
  known_seen[name] = known_seen[name] + 1
end

local function check(cond, fmt, ...)
  if not cond then error(fmt:format(...), 2) end
end

-- ------------------------------------------------------------ fake stream

local Stream = {}
Stream.__index = Stream

local function new_stream()
  return setmetatable({ written = {}, queued = 0, closing = false, reading = false }, Stream)
end

function Stream:read_start(cb)
  check(not self.reading, "read_start twice")
  self.reading, self.on_read = true, cb
  return true
end
function Stream:read_stop() self.reading = false; return true end
function Stream:write(s)
  check(type(s) == "string", "write of a %s", type(s))
  check(not self.closing, "write after close")
  self.written[#self.written + 1] = s
  self.queued = self.queued + #s
  return true
end
-- (what a socket with no room says: rpc.lua then queues the bytes with
-- write, which the harness records)
function Stream:try_write()
  check(not self.closing, "write after close")
  return nil, "EAGAIN: resource temporarily unavailable", "EAGAIN"
end
function Stream:get_write_queue_size() return self.queued end
function Stream:is_closing() return self.closing end
function Stream:shutdown(cb)
  check(not self.closing and not self.shut, "shutdown of a closing stream")
  self.shut = cb
  return {}
end
function Stream:close()
  check(not self.closing, "stream closed twice")
  self.closing = true
end

-- ----------------------------------------------------------- the oracle

--- What the daemon must see for stream s under cap: a list of lines (blank
-- ones dropped), and whether a line over the cap ends the connection.
local function expected_lines(s, cap)
  local lines, start = {}, 1
  while true do
    local nl = s:find("\n", start, true)
    if not nl then break end
    local line = s:sub(start, nl - 1)
    if #line > cap then return lines, true end
    if not line:match("^%s*$") then lines[#lines + 1] = line end
    start = nl + 1
  end
  return lines, #s - start + 1 > cap
end

-- ------------------------------------------------- validated params

local function in_list(v, list)
  for _, x in ipairs(list) do if v == x then return true end end
  return false
end

local check_value

--- Checks one normalised value against its spec.
function check_value(where, spec, v)
  local t = spec.type
  if t == "string" then
    check(type(v) == "string", "%s: %s is not a string", where, type(v))
    check(not spec.min or #v >= spec.min, "%s: shorter than %d", where, spec.min or 0)
    check(not spec.max or #v <= spec.max, "%s: longer than %d", where, spec.max or 0)
    check(not spec.pattern or v:match(spec.pattern), "%s: does not match %s", where, spec.pattern)
  elseif t == "enum" then
    check(in_list(v, spec.values), "%s: %q not in the enum", where, tostring(v))
  elseif t == "integer" then
    check(math.type(v) == "integer", "%s: not an integer", where)
    check((not spec.min or v >= spec.min) and (not spec.max or v <= spec.max),
      "%s: %d out of range", where, v)
  elseif t == "boolean" then
    check(type(v) == "boolean", "%s: not a boolean", where)
  elseif t == "signal" then
    check(math.type(v) == "integer" and v >= 1 and v <= 64, "%s: bad signal %s", where, tostring(v))
  elseif t == "array" then
    check(type(v) == "table", "%s: not a table", where)
    local n = #v
    for k in pairs(v) do
      check(math.type(k) == "integer" and k >= 1 and k <= n, "%s: not a sequence", where)
    end
    check(n >= (spec.min or 0) and (not spec.max or n <= spec.max), "%s: %d items", where, n)
    for i = 1, n do
      check(type(v[i]) == "string" and not v[i]:find("\0", 1, true)
        and (not spec.item_max or #v[i] <= spec.item_max), "%s[%d]: bad item", where, i)
    end
  elseif t == "map" then
    check(type(v) == "table", "%s: not a table", where)
    local n = 0
    for k, x in pairs(v) do
      n = n + 1
      check(type(k) == "string" and #k > 0 and not k:find("[=%z]"), "%s: bad key", where)
      check(type(x) == "string" and not x:find("\0", 1, true), "%s.%s: bad value", where, k)
      check(not spec.key_max or #k <= spec.key_max, "%s: key too long", where)
      check(not spec.value_max or #x <= spec.value_max, "%s: value too long", where)
    end
    check(not spec.max or n <= spec.max, "%s: %d entries", where, n)
  elseif t == "number" then
    check(type(v) == "number" and v == v, "%s: not a number", where)
    check((not spec.min or v >= spec.min) and (not spec.max or v <= spec.max), "%s: %s out of range",
      where, tostring(v))
  elseif t == "size" then
    check(math.type(v) == "integer" and v >= (spec.min or 0), "%s: bad size %s", where, tostring(v))
    check(not has_units or v <= units.SIZE_MAX, "%s: size %d over SIZE_MAX", where, v)
  elseif t == "duration" then
    check(type(v) == "number" and v == v and v >= 0, "%s: bad duration %s", where, tostring(v))
    check(not has_units or v <= units.DURATION_MAX, "%s: duration %s too long", where, tostring(v))
  elseif t == "object" then
    check(type(v) == "table", "%s: not a table", where)
    for k, x in pairs(v) do
      local sub = type(k) == "string" and spec.fields and spec.fields[k]
      check(sub, "%s: unknown field %s let through", where, tostring(k))
      check_value(where .. "." .. k, sub, x)
    end
  end
  -- types this harness does not know yet (added later) are left unchecked
end

--- Checks what schema.validate returned for method m.
local function check_validated(name, m, out)
  check(type(out) == "table", "%s: validate returned a %s", name, type(out))
  for k, v in pairs(out) do
    local spec = type(k) == "string" and k ~= "required" and k ~= "one_of" and m.params[k]
    check(spec, "%s: validate let unknown parameter %s through", name, tostring(k))
    check_value(name .. "." .. k, spec, v)
    if AGENT_STRINGS[k] and type(v) == "string" then
      if v:find("\0", 1, true) then
        known("nul-in-string-param", ("%s.%s passes validation with a NUL byte; the agent channel " ..
          "refuses it (internal error -32603)"):format(name, k))
      end
      if #v > TP_STR_MAX then
        known("string-param-over-agent-cap", ("%s.%s of %d bytes passes validation; the agent " ..
          "refuses strings over %d bytes"):format(name, k, #v, TP_STR_MAX))
      end
    end
  end
  for _, k in ipairs(m.params.required or {}) do
    check(out[k] ~= nil, "%s: required %s missing after validate", name, k)
  end
  if m.params.one_of then
    local n = 0
    for _, k in ipairs(m.params.one_of) do if out[k] ~= nil then n = n + 1 end end
    check(n == 1, "%s: one_of holds %d", name, n)
  end
end

--- Every value of the message goes through units, if that module exists.
local function check_units(v, depth)
  if not has_units or depth > 3 then return end
  if type(v) == "table" then
    for _, x in pairs(v) do check_units(x, depth + 1) end
    return
  end
  if type(v) ~= "string" and type(v) ~= "number" then return end
  local size, serr = units.size(v)
  check(size == nil and type(serr) == "string" or math.type(size) == "integer" and size >= 0
    and size <= units.SIZE_MAX, "units.size(%q) = %s", tostring(v), tostring(size))
  local dur, derr = units.duration(v)
  check(dur == nil and type(derr) == "string" or type(dur) == "number" and dur == dur and dur >= 0
    and dur <= units.DURATION_MAX, "units.duration(%q) = %s", tostring(v), tostring(dur))
end

-- ------------------------------------------------------------ requests

--- daemon.lua's checks before dispatch; returns whether a reply is owed.
local function request(conn, msg, sent)
  local id = msg.id
  local is_call = id ~= nil
  if is_call and not rpc.valid_id(id) then
    return sent(conn:error(nil, rpc.INVALID_REQUEST, "'id' must be a string or a number"))
  end
  if msg.jsonrpc ~= "2.0" or type(msg.method) ~= "string" then
    return sent(conn:error(id, rpc.INVALID_REQUEST, "not a JSON-RPC 2.0 request"))
  end
  for name, m in pairs(schema.methods) do
    local out, err = schema.validate(name, msg.params)
    if out == nil then
      check(type(err) == "string", "%s: validate failed without a message", name)
    else
      check_validated(name, m, out)
    end
  end
  check_units(msg.params, 0)
  if not schema.methods[msg.method] then
    if not is_call then return end
    local text = ("unknown method '%s'"):format(msg.method:sub(1, 100))
    return sent(conn:error(id, rpc.METHOD_NOT_FOUND, text))
  end
  local params, err = schema.validate(msg.method, msg.params)
  if not is_call then return end
  if not params then return sent(conn:error(id, rpc.INVALID_PARAMS, msg.method .. ": " .. err)) end
  return sent(conn:reply(id, { ok = true }))
end

local same_value

--- Checks every line written back: one JSON-RPC object per line, valid
-- UTF-8, each with the id (as the client decodes it) of the request it
-- answers, in order (ids: nil when the stream was cut over the cap).
local function check_written(stream, ids)
  local text = table.concat(stream.written)
  check(text == "" or text:sub(-1) == "\n", "reply does not end with a newline")
  local n = 0
  for line in text:gmatch("([^\n]*)\n") do
    n = n + 1
    check(utf8.len(line), "a reply is not valid UTF-8: %q", line:sub(1, 200))
    local obj, err = json.decode(line)
    check(type(obj) == "table", "a reply does not decode: %s: %q", tostring(err), line:sub(1, 200))
    if ids then
      local want = ids[n]
      check(want ~= nil, "reply %d answers no request", n)
      check(same_value(obj.id, want), "reply %d has id %s for the request's %s", n, tostring(obj.id), tostring(want))
    end
    check(obj.jsonrpc == "2.0", "a reply without jsonrpc 2.0")
    check((obj.result ~= nil) ~= (obj.error ~= nil), "a reply with neither or both result and error")
  end
  return n
end

-- ------------------------------------------------------------- one input

function same_value(a, b)
  if a == b then return true end
  if type(a) ~= type(b) then return false end
  if type(a) == "table" then return true end -- two decodes of one object: not the same table
  return type(a) == "number" and a ~= a and b ~= b -- NaN
end

return function(data)
  local cap = CAPS[((data:byte(1) or 0) & 3) + 1]
  local seed = data:byte(2) or 0
  local s = data:sub(3)
  local want, overlong = expected_lines(s, cap)

  local stream = new_stream()
  local seen, owed, replies, closes = 0, 0, 0, 0
  local conn
  local ids = {} -- the id each reply must carry, in order
  local cur_id
  local function sent(ok, err)
    if ok then replies = replies + 1; ids[replies] = cur_id; return end
    if conn.closed then return end
    known("unanswerable-request", "a request got no reply: " .. tostring(err))
  end
  conn = rpc.wrap(stream, {
    message = function(c, msg, err)
      seen = seen + 1
      local line = want[seen]
      check(line ~= nil, "message %d: there are only %d lines", seen, #want)
      local ref = json.decode(line)
      cur_id = json.null
      if type(ref) ~= "table" then
        check(msg == nil and type(err) == "string", "line %d: %q must be refused", seen, line:sub(1, 100))
        owed = owed + 1
        return sent(c:error(nil, rpc.PARSE_ERROR, "parse error: " .. tostring(err)))
      end
      check(type(msg) == "table", "line %d: decoded to a %s", seen, type(msg))
      local mid = msg.id
      if rpc.valid_id(mid) and type(mid) == "table" then mid = mid.value end -- a RawId
      check(same_value(msg.method, ref.method) and same_value(mid, ref.id),
        "line %d: decoded differently", seen)
      if msg[1] ~= nil then
        owed = owed + 1
        return sent(c:error(nil, rpc.INVALID_REQUEST, "batch requests are not supported"))
      end
      local before = replies
      if rpc.valid_id(ref.id) and ref.id ~= nil then
        -- a string id comes back as valid UTF-8 (its bad bytes as U+FFFD)
        cur_id = type(ref.id) == "string" and json.valid_utf8(ref.id) or ref.id
      end
      request(c, msg, function(ok, e) owed = owed + 1; sent(ok, e) end)
      check(replies - before <= 1, "line %d: answered %d times", seen, replies - before)
    end,
    close = function() closes = closes + 1 end,
  }, { max_line = cap })

  -- cut the stream into chunks with a small LCG
  local pos, x = 1, seed
  while pos <= #s and not conn.closed do
    x = (x * 73 + 41) % 256
    local len = ({ 1, 2, 3, 7, 16, 64, 1000, #s })[(x % 8) + 1]
    stream.on_read(nil, s:sub(pos, pos + len - 1))
    pos = pos + len
  end
  if not conn.closed then stream.on_read(nil, nil) end -- EOF
  if stream.shut then stream.shut() end

  check(closes == 1, "close handler ran %d times", closes)
  check(stream.closing, "the stream was not closed")
  if overlong then
    check(seen == #want, "overlong stream: %d of %d lines seen", seen, #want)
  else
    check(seen == #want, "%d of %d lines seen", seen, #want)
  end
  local lines = check_written(stream, not overlong and ids or nil)
  check(lines == replies + (overlong and 1 or 0), "%d lines written for %d replies", lines, replies)
  if overlong then
    local last = json.decode(stream.written[#stream.written])
    check(last.error and last.error.code == rpc.INVALID_REQUEST, "overlong line not answered with -32600")
  end
  check(owed >= replies, "more replies than requests")
end
