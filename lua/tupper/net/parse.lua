--- Parsers for what a box sends through the network relay: the head of an
-- HTTP proxy request, a SOCKS5 handshake, a DNS query, a TLS ClientHello.
-- Every byte is hostile: each parser is bounded, never errors, and answers
-- "need more", a result, or a refusal with a reason.  Pure functions, so
-- the unit spec feeds them hostile bytes directly.
local M = {}

M.HEAD_MAX = 16384     -- bytes of an HTTP request head
M.HEADERS_MAX = 100
M.HELLO_MAX = 16384 + 5 -- one TLS record

-- ----------------------------------------------------------------- HTTP

-- host[:port] of an authority; default port dflt.  Returns host, port or nil, why.
local function authority(a, dflt)
  if a == "" then return nil, "empty authority" end
  if a:find("@", 1, true) then return nil, "userinfo in authority" end
  local host, port
  local v6, rest = a:match("^(%[[^%]]*%])(.*)$")
  if v6 then
    host = v6
    if rest ~= "" then port = rest:match("^:(%d+)$"); if not port then return nil, "bad port" end end
  else
    host, port = a:match("^([^:]*):(%d*)$")
    if not host then
      if a:find(":", 1, true) then return nil, "bad authority" end
      host = a
    elseif port == "" then
      return nil, "empty port"
    end
  end
  if host == "" then return nil, "empty host" end
  local p = dflt
  if port then
    if #port > 5 then return nil, "bad port" end
    p = tonumber(port)
  end
  if not p or p < 1 or p > 65535 then return nil, "bad port" end
  return host, p
end
M.authority = authority

local HOP = { ["connection"] = true, ["proxy-connection"] = true, ["keep-alive"] = true,
              ["proxy-authorization"] = true, ["te"] = true, ["upgrade"] = true,
              ["proxy-authenticate"] = true, ["trailer"] = true }

--- Parses a proxy request head from buf.  Returns:
--   nil                 need more bytes
--   false, status, why  refuse (status: HTTP status code to answer)
--   req, rest           req = { method, host, port, connect = bool, head = rewritten
--                       head for the upstream (plain requests) }, rest = bytes after the head
function M.http_head(buf)
  local e = buf:find("\r\n\r\n", 1, true)
  if not e then
    if #buf > M.HEAD_MAX then return false, 431, "request head too large" end
    if buf:find("\0", 1, true) then return false, 400, "NUL in request head" end
    return nil
  end
  if e + 3 > M.HEAD_MAX then return false, 431, "request head too large" end
  local head, rest = buf:sub(1, e + 1), buf:sub(e + 4)
  if head:find("[%z\127]") then return false, 400, "NUL or DEL in request head" end
  local lines = {}
  for line in head:gmatch("(.-)\r\n") do lines[#lines + 1] = line end
  local method, target, version = (lines[1] or ""):match("^([A-Z]+) ([^ ]+) (HTTP/1%.[01])$")
  if not method then return false, 400, "malformed request line" end
  if #lines - 1 > M.HEADERS_MAX then return false, 431, "too many header fields" end
  local headers, hosts = {}, {}
  for i = 2, #lines do
    local l = lines[i]
    if l:find("^[ \t]") then return false, 400, "obsolete line folding" end
    local name, value = l:match("^([!#$%%&'*+.^_`|~%w%-]+):[ \t]*(.-)[ \t]*$")
    if not name then return false, 400, "malformed header field" end
    if l:find("[%z\1-\8\10-\31\127]") then return false, 400, "control byte in header" end
    local lname = name:lower()
    if lname == "host" then hosts[#hosts + 1] = value end
    headers[#headers + 1] = { name, value, lname }
  end
  if #hosts > 1 then return false, 400, "more than one Host header" end
  local req = { method = method, version = version }
  if method == "CONNECT" then
    local host, port = authority(target, nil)
    if not host then return false, 400, "CONNECT target: " .. tostring(port) end
    req.host, req.port, req.connect = host, port, true
    if hosts[1] then
      local hh, hp = authority(hosts[1], port)
      if not hh or hh:lower() ~= host:lower() or hp ~= port then
        return false, 400, "Host header does not match the CONNECT target"
      end
    end
    return req, rest
  end
  local scheme, auth, path = target:match("^(%a[%w+.-]*)://([^/?#]*)(.*)$")
  if not scheme then return false, 400, "a proxy request needs an absolute http:// URI" end
  if scheme:lower() ~= "http" then return false, 400, "only http:// through the plain proxy (use CONNECT)" end
  local host, port = authority(auth, 80)
  if not host then return false, 400, "request target: " .. tostring(port) end
  if path == "" then path = "/" end
  if path:sub(1, 1) ~= "/" then path = "/" .. path end
  if path:find("#", 1, true) then path = path:match("^([^#]*)") end
  if version == "HTTP/1.1" and not hosts[1] then return false, 400, "no Host header" end
  if hosts[1] then
    local hh, hp = authority(hosts[1], 80)
    if not hh or hh:lower() ~= host:lower() or hp ~= port then
      return false, 400, "Host header does not match the request target"
    end
  end
  local out = { ("%s %s %s\r\n"):format(method, path, version) }
  if not hosts[1] then out[#out + 1] = "Host: " .. auth .. "\r\n" end
  for _, h in ipairs(headers) do
    if not HOP[h[3]] then out[#out + 1] = h[1] .. ": " .. h[2] .. "\r\n" end
  end
  -- one request per upstream connection: what follows goes to the same host
  out[#out + 1] = "Connection: close\r\n\r\n"
  req.host, req.port, req.head = host, port, table.concat(out)
  return req, rest
end

--- A complete HTTP response for a refusal.
function M.http_error(status, why)
  local text = ({ [400] = "Bad Request", [403] = "Forbidden", [431] = "Request Header Fields Too Large",
                  [502] = "Bad Gateway", [504] = "Gateway Timeout" })[status] or "Error"
  local body = ("tupper: %s\n"):format(why)
  return ("HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s")
    :format(status, text, #body, body)
end

-- ---------------------------------------------------------------- SOCKS5

M.SOCKS_OK, M.SOCKS_FAIL, M.SOCKS_RULESET, M.SOCKS_NETUNREACH = 0, 1, 2, 3
M.SOCKS_HOSTUNREACH, M.SOCKS_REFUSED, M.SOCKS_CMD, M.SOCKS_ATYP = 4, 5, 7, 8

--- Parses the SOCKS5 greeting and request from buf (both: a client may
-- send them back to back).  Returns:
--   nil, reply?          need more bytes; reply: bytes to answer now (the method choice)
--   false, reply, why    refuse: send reply (may be ""), then close
--   req, rest, reply     req = { host = text (a name or an address literal), port }
-- `greeted` says the method choice was already sent.
function M.socks(buf, greeted)
  if #buf < 2 then return nil end
  if buf:byte(1) ~= 5 then return false, "", "not SOCKS5" end
  local nm = buf:byte(2)
  if nm == 0 then return false, "\5\255", "no authentication methods offered" end
  if #buf < 2 + nm then return nil end
  local methods = buf:sub(3, 2 + nm)
  if not methods:find("\0", 1, true) then return false, "\5\255", "client does not offer 'no authentication'" end
  local choice = not greeted and "\5\0" or nil
  local r = buf:sub(3 + nm)
  if #r < 4 then return nil, choice end
  local function reply(code) return (choice or "") .. string.char(5, code, 0, 1, 0, 0, 0, 0, 0, 0) end
  if r:byte(1) ~= 5 or r:byte(3) ~= 0 then return false, reply(M.SOCKS_FAIL), "malformed request" end
  if r:byte(2) ~= 1 then return false, reply(M.SOCKS_CMD), "only CONNECT is supported" end
  local atyp, host, off = r:byte(4), nil, nil
  if atyp == 1 then
    if #r < 10 then return nil, choice end
    host, off = ("%d.%d.%d.%d"):format(r:byte(5, 8)), 9
  elseif atyp == 4 then
    if #r < 22 then return nil, choice end
    local g = {}
    for i = 5, 19, 2 do g[#g + 1] = ("%x"):format(r:byte(i) * 256 + r:byte(i + 1)) end
    host, off = "[" .. table.concat(g, ":") .. "]", 21
  elseif atyp == 3 then
    if #r < 5 then return nil, choice end
    local n = r:byte(5)
    if n == 0 then return false, reply(M.SOCKS_FAIL), "empty name" end
    if #r < 5 + n + 2 then return nil, choice end
    host, off = r:sub(6, 5 + n), 6 + n
    if host:find("[^%w%.%-_]") then return false, reply(M.SOCKS_RULESET), "name with bytes other than LDH" end
  else
    return false, reply(M.SOCKS_ATYP), "unknown address type"
  end
  local port = r:byte(off) * 256 + r:byte(off + 1)
  if port == 0 then return false, reply(M.SOCKS_FAIL), "port 0" end
  return { host = host, port = port }, r:sub(off + 2), choice
end

--- A SOCKS5 reply with code (the bound address is not told: zeros).
function M.socks_reply(code)
  return string.char(5, code, 0, 1, 0, 0, 0, 0, 0, 0)
end

-- ------------------------------------------------------------------ DNS

local function u16(s, i) return s:byte(i) * 256 + s:byte(i + 1) end

M.DNS_NOERROR, M.DNS_FORMERR, M.DNS_SERVFAIL, M.DNS_NXDOMAIN, M.DNS_NOTIMP, M.DNS_REFUSED = 0, 1, 2, 3, 4, 5
M.QTYPE_A, M.QTYPE_AAAA = 1, 28

--- Parses a DNS query.  Returns { id, rd, qname (raw labels joined by '.',
-- unchecked), qtype, qclass, question (raw bytes) } or nil, why, id (id
-- when the header was readable: then answer FORMERR).
function M.dns_query(msg)
  if type(msg) ~= "string" or #msg < 12 then return nil, "short message" end
  local id, flags = u16(msg, 1), u16(msg, 3)
  if flags & 0x8000 ~= 0 then return nil, "not a query" end
  if (flags >> 11) & 0xf ~= 0 then return nil, "opcode is not QUERY", id end
  if u16(msg, 5) ~= 1 then return nil, "not exactly one question", id end
  local i, labels, total = 13, {}, 0
  while true do
    local n = msg:byte(i)
    if not n then return nil, "truncated name", id end
    if n == 0 then i = i + 1; break end
    if n > 63 then return nil, "compressed or over-long label", id end
    local label = msg:sub(i + 1, i + n)
    if #label ~= n then return nil, "truncated label", id end
    total = total + n + 1
    if total > 255 then return nil, "name longer than 255 bytes", id end
    labels[#labels + 1] = label
    i = i + 1 + n
  end
  if #msg < i + 3 then return nil, "truncated question", id end
  return { id = id, rd = (flags >> 8) & 1, qname = table.concat(labels, "."), nlabels = #labels,
           qtype = u16(msg, i), qclass = u16(msg, i + 2), question = msg:sub(13, i + 3) }
end

--- An answer to q: rcode, and for an A answer the 4 address bytes.
function M.dns_answer(q, rcode, addr)
  local flags = 0x8000 | (q.rd << 8) | 0x0080 | (rcode & 0xf) | 0x0400 -- QR, RD, RA, AA
  local an = addr and 1 or 0
  local out = { string.char(q.id >> 8, q.id & 0xff, flags >> 8, flags & 0xff, 0, 1, 0, an, 0, 0, 0, 0),
                q.question }
  if addr then
    -- name: pointer to the question (offset 12); type A, class IN, TTL 60, 4 bytes
    out[#out + 1] = "\192\12\0\1\0\1\0\0\0\60\0\4" .. addr
  end
  return table.concat(out)
end

--- FORMERR/SERVFAIL... for a message whose header was readable.
function M.dns_error(id, rcode)
  local flags = 0x8000 | 0x0080 | (rcode & 0xf)
  return string.char(id >> 8, id & 0xff, flags >> 8, flags & 0xff, 0, 0, 0, 0, 0, 0, 0, 0)
end

--- A query for name/qtype (the daemon's own upstream lookups).
function M.dns_make_query(id, name, qtype)
  local out = { string.char(id >> 8, id & 0xff, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0) }
  for label in name:gmatch("[^.]+") do out[#out + 1] = string.char(#label) .. label end
  out[#out + 1] = "\0" .. string.char(qtype >> 8, qtype & 0xff, 0, 1)
  return table.concat(out)
end

-- Skips a (possibly compressed) name at i; returns the index after it.
local function skip_name(msg, i)
  for _ = 1, 128 do
    local n = msg:byte(i)
    if not n then return nil end
    if n == 0 then return i + 1 end
    if n >= 0xc0 then return msg:byte(i + 1) and i + 2 or nil end
    if n > 63 then return nil end
    i = i + 1 + n
  end
  return nil
end

--- The addresses (4 or 16 bytes) of the A/AAAA records in an answer with
-- id; or nil, why.
function M.dns_parse_answer(msg, id)
  if type(msg) ~= "string" or #msg < 12 or u16(msg, 1) ~= id then return nil, "not our answer" end
  local flags = u16(msg, 3)
  if flags & 0x8000 == 0 then return nil, "not an answer" end
  local rcode = flags & 0xf
  if rcode ~= 0 then return nil, rcode == 3 and "no such name" or ("rcode %d"):format(rcode) end
  local qd, an = u16(msg, 5), u16(msg, 7)
  local i = 13
  for _ = 1, qd do
    i = skip_name(msg, i)
    if not i or #msg < i + 3 then return nil, "truncated" end
    i = i + 4
  end
  local out = {}
  for _ = 1, an do
    i = skip_name(msg, i)
    if not i or #msg < i + 9 then return nil, "truncated" end
    local t, len = u16(msg, i), u16(msg, i + 8)
    local data = msg:sub(i + 10, i + 9 + len)
    if #data ~= len then return nil, "truncated" end
    if (t == 1 and len == 4) or (t == 28 and len == 16) then out[#out + 1] = data end
    i = i + 10 + len
  end
  return out
end

-- ------------------------------------------------------------------ TLS

--- Looks at the first bytes a box sends on a tunnel.  Returns:
--   nil                  need more bytes
--   { tls = false }      not TLS
--   { tls = true, sni = name|nil }
--   false, why           TLS, but a ClientHello that cannot be judged
function M.client_hello(buf)
  if #buf < 1 then return nil end
  if buf:byte(1) ~= 0x16 then return { tls = false } end
  if #buf < 5 then return nil end
  if buf:byte(2) ~= 3 then return false, "bad TLS record version" end
  local rlen = u16(buf, 4)
  if rlen > 16384 or rlen < 4 then return false, "bad TLS record length" end
  if #buf < 5 + rlen then return nil end
  local rec = buf:sub(6, 5 + rlen)
  if rec:byte(1) ~= 1 then return false, "first handshake message is not a ClientHello" end
  local hlen = rec:byte(2) * 65536 + u16(rec, 3)
  if hlen + 4 > #rec then return false, "ClientHello split over records" end
  local h = rec:sub(5, 4 + hlen)
  local i = 35 -- version (2) + random (32)
  local sid = h:byte(i)
  if not sid or sid > 32 then return false, "bad session id" end
  i = i + 1 + sid
  if #h < i + 1 then return false, "truncated ClientHello" end
  i = i + 2 + u16(h, i) -- cipher suites
  local nc = h:byte(i)
  if not nc then return false, "truncated ClientHello" end
  i = i + 1 + nc -- compression methods
  if i > #h then return { tls = true } end -- no extensions: no SNI
  if #h < i + 1 then return false, "truncated extensions" end
  local elen = u16(h, i)
  i = i + 2
  local stop = i + elen
  if stop - 1 > #h then return false, "truncated extensions" end
  local sni, seen
  while i + 3 < stop do
    local et, el = u16(h, i), u16(h, i + 2)
    local ed = h:sub(i + 4, i + 3 + el)
    if #ed ~= el or i + 4 + el > stop then return false, "truncated extension" end
    if et == 0 then
      if seen then return false, "two server_name extensions" end
      seen = true
      if #ed < 5 then return false, "bad server_name" end
      local ll = u16(ed, 1)
      if ll + 2 ~= #ed then return false, "bad server_name list" end
      local j, names = 3, 0
      while j <= #ed do
        if j + 2 > #ed then return false, "bad server_name entry" end
        local nt, nl = ed:byte(j), u16(ed, j + 1)
        local name = ed:sub(j + 3, j + 2 + nl)
        if #name ~= nl then return false, "bad server_name entry" end
        if nt == 0 then
          names = names + 1
          sni = name
        end
        j = j + 3 + nl
      end
      if names ~= 1 then return false, "server_name must hold exactly one host name" end
    end
    i = i + 4 + el
  end
  return { tls = true, sni = sni }
end

return M
