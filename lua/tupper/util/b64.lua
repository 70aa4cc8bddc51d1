--- Base64 for the Lua side: the C codec of tupper.core when the module runs
-- inside the tupper binary, a pure-Lua one otherwise (plain lua5.4, as the
-- specs run).  encode(s) -> string; decode(s) -> string or nil on bad input.
local M = {}

local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

-- 12-bit lookup tables: two base64 characters per 12 bits, both ways;
-- made on the pure-Lua codec's first use only (4,096 strings: the binary,
-- which has the C codec, would pay for them at every start)
local ENC12, DEC
local function tables()
  ENC12, DEC = {}, {}
  for i = 0, 63 do DEC[ALPHABET:byte(i + 1)] = i end
  for i = 0, 4095 do
    ENC12[i] = ALPHABET:sub((i >> 6) + 1, (i >> 6) + 1) .. ALPHABET:sub((i & 63) + 1, (i & 63) + 1)
  end
end

--- Pure-Lua encoder (RFC 4648, with padding).
function M.lua_encode(s)
  if not ENC12 then tables() end
  local out, n = {}, #s
  local full = n - n % 3
  for i = 1, full, 3 do
    local a, b, c = s:byte(i, i + 2)
    local v = a << 16 | b << 8 | c
    out[#out + 1] = ENC12[v >> 12] .. ENC12[v & 4095]
  end
  local rest = n - full
  if rest == 1 then
    local v = s:byte(n) << 16
    out[#out + 1] = ENC12[v >> 12] .. "=="
  elseif rest == 2 then
    local a, b = s:byte(n - 1, n)
    local v = a << 16 | b << 8
    out[#out + 1] = ENC12[v >> 12] .. ENC12[v & 4095]:sub(1, 1) .. "="
  end
  return table.concat(out)
end

--- Pure-Lua decoder; nil for input that is not canonical padded base64.
function M.lua_decode(s)
  if #s % 4 ~= 0 then return nil end
  if not DEC then tables() end
  local out = {}
  for i = 1, #s, 4 do
    local a, b, c, d = s:byte(i, i + 3)
    local va, vb, vc, vd = DEC[a], DEC[b], DEC[c], DEC[d]
    if not va or not vb then return nil end
    local last = i + 3 == #s
    if vc and vd then
      local v = va << 18 | vb << 12 | vc << 6 | vd
      out[#out + 1] = string.char(v >> 16, v >> 8 & 255, v & 255)
    elseif last and vc and d == 61 then
      local v = va << 18 | vb << 12 | vc << 6
      out[#out + 1] = string.char(v >> 16, v >> 8 & 255)
    elseif last and c == 61 and d == 61 then
      out[#out + 1] = string.char((va << 18 | vb << 12) >> 16)
    else
      return nil
    end
  end
  return table.concat(out)
end

-- optional: tupper.core exists only in the binary (the specs run under plain lua5.4)
local ok, core = pcall(require, "tupper.core")
if ok and type(core) == "table" and core.b64encode then
  M.encode, M.decode = core.b64encode, core.b64decode
else
  M.encode, M.decode = M.lua_encode, M.lua_decode
end

return M
