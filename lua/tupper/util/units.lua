--- Sizes and durations as people write them: "512M", "1.5G", 1048576;
-- "30s", "10m", "1h30m", 90.  Shared by the socket API, the CLI and
-- (later) recipes, so every front end accepts the same spellings.
local M = {}

local SIZE_UNITS = { [""] = 1, b = 1, k = 1024, kb = 1024, kib = 1024, m = 1024 ^ 2, mb = 1024 ^ 2,
  mib = 1024 ^ 2, g = 1024 ^ 3, gb = 1024 ^ 3, gib = 1024 ^ 3, t = 1024 ^ 4, tb = 1024 ^ 4, tib = 1024 ^ 4 }

M.SIZE_MAX = 2 ^ 46 -- 64 TiB: far above any box, far below JSON's exact range

--- Bytes for a size: an integer, or a string like "256M".  nil, err when bad.
function M.size(v)
  if math.type(v) == "integer" or (type(v) == "number" and math.tointeger(v)) then
    v = math.tointeger(v)
    if v < 0 or v > M.SIZE_MAX then return nil, "size out of range" end
    return v
  end
  if type(v) ~= "string" or #v > 32 then return nil, "a size is bytes or a string like \"512M\"" end
  local num, unit = v:lower():match("^%s*(%d+%.?%d*)%s*(%a*)%s*$")
  local mult = unit and SIZE_UNITS[unit]
  if not num or not mult then
    return nil, ("bad size %q: use a number with an optional unit k, M, G or T"):format(v)
  end
  local bytes = math.floor(tonumber(num) * mult)
  if bytes > M.SIZE_MAX then return nil, ("size %q is too large"):format(v) end
  return math.tointeger(bytes)
end

local DUR_UNITS = { ms = 0.001, s = 1, m = 60, h = 3600, d = 86400 }

M.DURATION_MAX = 30 * 86400

--- Seconds (a number, possibly fractional) for a duration: a number of
-- seconds, or a string like "10m", "1h30m", "500ms".  nil, err when bad.
function M.duration(v)
  if type(v) == "number" then
    if v ~= v or v < 0 or v > M.DURATION_MAX then return nil, "duration out of range" end
    return v
  end
  if type(v) ~= "string" or #v > 32 or v == "" then
    return nil, "a duration is seconds or a string like \"10m\""
  end
  local s = v:lower():gsub("%s", "")
  if s:match("^%d+%.?%d*$") then return M.duration(tonumber(s)) end
  local total, rest = 0, s
  while rest ~= "" do
    local num, unit, tail = rest:match("^(%d+%.?%d*)(%a+)(.*)$")
    if not num or not DUR_UNITS[unit] then
      return nil, ("bad duration %q: use s, m, h, d or ms, e.g. \"1h30m\""):format(v)
    end
    total = total + tonumber(num) * DUR_UNITS[unit]
    rest = tail
  end
  return M.duration(total)
end

--- A byte count for people, as progress bars and listings print it:
-- "512 B", "1.5 MiB" (powers of 1024, up to TiB); with opts.si, "1.5 MB"
-- (powers of 1000, up to GB).
function M.human(n, opts)
  n = tonumber(n) or 0
  local base, names = 1024, { "B", "KiB", "MiB", "GiB", "TiB" }
  if opts and opts.si then base, names = 1000, { "B", "KB", "MB", "GB" } end
  local u = 1
  while n >= base and u < #names do n = n / base; u = u + 1 end
  return u == 1 and ("%d B"):format(n) or ("%.1f %s"):format(n, names[u])
end

--- A human form of bytes, for listings.
function M.format_size(n)
  for _, u in ipairs({ { "T", 1024 ^ 4 }, { "G", 1024 ^ 3 }, { "M", 1024 ^ 2 }, { "K", 1024 } }) do
    if n >= u[2] and n % u[2] == 0 then return ("%d%s"):format(n // u[2], u[1]) end
  end
  return tostring(n)
end

return M
