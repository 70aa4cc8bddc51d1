--- JSON for the socket API: lua-cjson with the two gaps of its 2.1.0 release
-- closed.  Empty arrays encode as `[]` (mark them with `json.array`), and
-- numbers print with 14 significant digits (the most lua-cjson 2.1.0 offers),
-- so integers are exact below 10^14: sizes and offsets are capped below it.
local cjson = require("cjson")

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

--- Encodes v; returns the text or nil, err.
function M.encode(v)
  local ok, s = pcall(codec.encode, v)
  if not ok then return nil, s end
  if s:find(EMPTY_JSON, 1, true) then s = s:gsub(EMPTY_PATTERN, "[]") end
  return s
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
  if t ~= "table" then return codec.encode(v) end
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
    parts[#parts + 1] = inner .. codec.encode(k) .. ": " .. M.pretty(v[k], inner)
  end
  return "{\n" .. table.concat(parts, ",\n") .. "\n" .. indent .. "}"
end

M.null = cjson.null

return M
