--- JSON for the socket API: lua-cjson with the gaps of its 2.1.0 release
-- closed.  Empty arrays encode as `[]` (mark them with `json.array`), and
-- numbers print with 14 significant digits (the most lua-cjson 2.1.0 offers),
-- so integers are exact below 10^14: sizes and offsets are capped below it.
-- lua-cjson copies string bytes as they are; the encoder here never emits
-- invalid UTF-8: each byte that is not part of a valid UTF-8 sequence comes
-- out as U+FFFD (a field that needs the exact bytes carries them in base64
-- beside it, see `M.text`).
local cjson = require("cjson")
local b64 = require("tupper.util.b64")

local M = {}

local codec = cjson.new()
codec.encode_number_precision(14)
codec.decode_invalid_numbers(false) -- NaN and Infinity are not JSON: an id of NaN could not be answered
codec.decode_max_depth(64)
codec.encode_max_depth(64)

local EMPTY = "\0tupper-empty-array\0"
local EMPTY_JSON = codec.encode(EMPTY)
local EMPTY_PATTERN = EMPTY_JSON:gsub("%p", "%%%0")

--- Marks t as a JSON array: an empty table then encodes as `[]`.
function M.array(t)
  if next(t) == nil then return EMPTY end
  return t
end

--- Whether the table t is a list: its keys are exactly 1..#t (what a
-- recipe's or a lock's list must be; checked before a hostile table is read
-- with ipairs).
function M.is_array(t)
  local n = #t
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end

local REPLACEMENT = "\239\191\189" -- U+FFFD in UTF-8

--- s with each byte that is not part of a valid UTF-8 sequence replaced by
-- U+FFFD (utf8.len is strict in Lua 5.4: no overlong forms, surrogates or
-- code points past U+10FFFF).  Returns s itself when it is valid.
function M.valid_utf8(s)
  local n, bad = utf8.len(s)
  if n then return s end
  local out, from = {}, 1
  while bad do
    out[#out + 1] = s:sub(from, bad - 1)
    out[#out + 1] = REPLACEMENT
    from = bad + 1
    n, bad = utf8.len(s, from)
  end
  out[#out + 1] = s:sub(from)
  return table.concat(out)
end

--- For a text field of a reply (a file name, a path, a link target): the
-- field as valid UTF-8 and, when s was not valid UTF-8, its exact bytes in
-- base64 (nil otherwise).  docs/protocol.md, "Names that are not UTF-8".
function M.text(s)
  if s == nil or utf8.len(s) then return s, nil end
  return M.valid_utf8(s), b64.encode(s)
end

--- Encodes v; returns the text or nil, err.  The text is valid UTF-8
-- whatever strings v holds (see the module comment).
function M.encode(v)
  local ok, s = pcall(codec.encode, v)
  if not ok then return nil, s end
  if s:find(EMPTY_JSON, 1, true) then s = s:gsub(EMPTY_PATTERN, "[]") end
  -- the encoder's own output is ASCII, so a bad byte is inside a string
  return M.valid_utf8(s)
end

-- JSON text made already, to go into a reply as it is (rpc.lua's
-- Conn:reply): the result of a call whose parts are each encoded once and
-- kept (sandbox.list's entries).
local Raw = {}

--- Marks text, made by M.encode (valid JSON and UTF-8), as a reply's result.
-- text may also be a list of strings whose concatenation is that text: they
-- go out as they are, never joined into one string (a list of 100 boxes
-- had been joined into a 30 KiB string, and copied three times more on its
-- way to the socket, for the collector to walk the whole heap after).
function M.raw(text)
  return setmetatable({ text = text }, Raw)
end

--- The text of a value marked by M.raw (a string, or a list of strings:
-- see M.raw), else nil.
function M.raw_text(v)
  return getmetatable(v) == Raw and v.text or nil
end

--- Decodes s; returns the value or nil, err.
function M.decode(s)
  local ok, v = pcall(codec.decode, s)
  if not ok then return nil, v end
  return v
end

--- Encodes v with sorted keys and two-space indentation (stable output for
-- files kept in git, like docs/protocol.schema.json).
function M.pretty(v, indent)
  indent = indent or ""
  local t = type(v)
  if v == EMPTY then return "[]" end
  if t ~= "table" then return M.valid_utf8(codec.encode(v)) end
  local inner = indent .. "  "
  local parts = {}
  if v[1] ~= nil then
    for _, x in ipairs(v) do parts[#parts + 1] = inner .. M.pretty(x, inner) end
    return "[\n" .. table.concat(parts, ",\n") .. "\n" .. indent .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = tostring(k) end
  if #keys == 0 then return "{}" end
  table.sort(keys)
  for _, k in ipairs(keys) do
    parts[#parts + 1] = inner .. M.valid_utf8(codec.encode(k)) .. ": " .. M.pretty(v[k], inner)
  end
  return "{\n" .. table.concat(parts, ",\n") .. "\n" .. indent .. "}"
end

M.null = cjson.null

return M
