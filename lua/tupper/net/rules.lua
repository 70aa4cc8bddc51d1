--- Network rules: what a sandbox may reach (docs/network.md).
--
--   network = "none" | "all" | { allow = { rule... }, deny = { rule... } }
--   rule    = host[:port]      "pypi.org", "pypi.org:443", "api.x.com:8000-8100"
--           | *.domain[:port]  any name below domain (not domain itself)
--           | address[/prefix][:port]   "10.1.2.0/24:5432", "[fd00::1]:443", "fd00::/8"
--
-- Deny wins over allow.  Names match names, addresses match addresses: a
-- name rule never lets the box reach an address it typed, and a CIDR rule
-- never makes the daemon resolve a name (so DNS cannot be used to leak
-- data through names no rule allows).  Special destinations (private,
-- loopback, link-local, metadata, multicast, documentation, NAT64, 6to4...)
-- are refused unless an allow rule with an address names them, also when
-- an allowed name resolves to them.
--
-- Every address given by the box is normalised first: inet_aton forms
-- (integer, octal, hex, short "127.1"), IPv6 with IPv4-mapped or -compatible
-- tails; an IPv4-mapped IPv6 address is its IPv4 address.
local M = {}

M.RULES_MAX = 256
M.NAME_MAX = 253

-- ------------------------------------------------------------ addresses

local function parse_v4_part(s)
  if s == "" then return nil end
  local v
  if s:match("^0[xX]%x*$") then
    v = #s == 2 and 0 or tonumber(s:sub(3), 16)
  elseif s:match("^0[0-7]+$") then
    v = tonumber(s, 8)
  elseif s:match("^%d+$") then
    if s:match("^0%d") then return nil end -- "08", "09": not octal, not decimal
    v = tonumber(s, 10)
  end
  if s:len() > 12 then return nil end
  return v
end

--- Parses an IPv4 address in any form inet_aton(3) takes ("127.0.0.1",
-- "2130706433", "0x7f.1", "0177.0.0.01").  Returns the 4-byte string or nil.
function M.parse_v4(s)
  if type(s) ~= "string" or #s == 0 or #s > 64 or not s:match("^[%dxXa-fA-F.]+$") then return nil end
  local parts = {}
  for p in (s .. "."):gmatch("([^.]*)%.") do parts[#parts + 1] = p end
  if #parts < 1 or #parts > 4 then return nil end
  local vals = {}
  for i, p in ipairs(parts) do
    vals[i] = parse_v4_part(p)
    if not vals[i] then return nil end
  end
  local n = #vals
  for i = 1, n - 1 do if vals[i] > 255 then return nil end end
  local last = vals[n]
  if last >= 1 << (8 * (5 - n)) then return nil end
  local b = {}
  for i = 1, n - 1 do b[i] = vals[i] end
  for i = n, 4 do b[i] = (last >> (8 * (4 - i))) & 0xff end
  return string.char(b[1], b[2], b[3], b[4])
end

-- Strict dotted quad (inside IPv6 and in rules' canonical form).
local function parse_quad(s)
  local a, b, c, d = s:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  if not a then return nil end
  local t = { tonumber(a), tonumber(b), tonumber(c), tonumber(d) }
  for _, x in ipairs(t) do if x > 255 then return nil end end
  for _, x in ipairs({ a, b, c, d }) do if #x > 1 and x:sub(1, 1) == "0" then return nil end end
  return string.char(t[1], t[2], t[3], t[4])
end

--- Parses an IPv6 address (no zone, no brackets).  Returns 16 bytes or nil.
function M.parse_v6(s)
  if type(s) ~= "string" or #s < 2 or #s > 64 or not s:match("^[%x:.]+$") then return nil end
  local tail4
  local head = s
  local v4 = s:match(":([%d.]+)$")
  if v4 and v4:find(".", 1, true) then
    tail4 = parse_quad(v4)
    if not tail4 then return nil end
    head = s:sub(1, #s - #v4)
    if head:sub(-2) ~= "::" then head = head:sub(1, -2) end
  end
  local want = tail4 and 6 or 8
  local left, right = head, nil
  local dc = head:find("::", 1, true)
  if dc then
    if head:find("::", dc + 1, true) then return nil end
    left, right = head:sub(1, dc - 1), head:sub(dc + 2)
  end
  local function groups(part)
    local g = {}
    if part == "" then return g end
    for x in (part .. ":"):gmatch("([^:]*):") do
      if not x:match("^%x%x?%x?%x?$") then return nil end
      g[#g + 1] = tonumber(x, 16)
    end
    return g
  end
  local lg, rg = groups(left), groups(right or "")
  if not lg or not rg then return nil end
  local all = {}
  if dc then
    if #lg + #rg >= want then return nil end
    for _, x in ipairs(lg) do all[#all + 1] = x end
    for _ = 1, want - #lg - #rg do all[#all + 1] = 0 end
    for _, x in ipairs(rg) do all[#all + 1] = x end
  else
    if #lg ~= want then return nil end
    all = lg
  end
  local out = {}
  for _, x in ipairs(all) do out[#out + 1] = string.char(x >> 8, x & 0xff) end
  return table.concat(out) .. (tail4 or "")
end

local V4_MAPPED = ("\0"):rep(10) .. "\255\255"
local V4_COMPAT = ("\0"):rep(12)

--- Normalises an address: a 16-byte IPv4-mapped (::ffff:a.b.c.d) or
-- IPv4-compatible (::a.b.c.d, not :: or ::1) address becomes its 4 bytes.
function M.canon(ip)
  if #ip == 16 then
    if ip:sub(1, 12) == V4_MAPPED then return ip:sub(13) end
    if ip:sub(1, 12) == V4_COMPAT and ip:sub(13) ~= "\0\0\0\0" and ip:sub(13) ~= "\0\0\0\1" then
      return ip:sub(13)
    end
  end
  return ip
end

--- An address literal as a box may write it ("1.2.3.4", "[::1]", "::1",
-- "2130706433"): its canonical bytes, or nil when it is not an address.
function M.parse_addr(s)
  if type(s) ~= "string" then return nil end
  local inner = s:match("^%[(.*)%]$")
  if inner then
    local ip = M.parse_v6(inner)
    return ip and M.canon(ip)
  end
  if s:find(":", 1, true) then
    local ip = M.parse_v6(s)
    return ip and M.canon(ip)
  end
  return M.parse_v4(s)
end

--- Text form of 4 or 16 address bytes.
function M.format(ip)
  if #ip == 4 then return ("%d.%d.%d.%d"):format(ip:byte(1, 4)) end
  local g = {}
  for i = 1, 16, 2 do g[#g + 1] = ("%x"):format(ip:byte(i) * 256 + ip:byte(i + 1)) end
  -- the longest run of zero groups (two or more) becomes "::"
  local best, bl, i = nil, 1, 1
  while i <= 8 do
    if g[i] == "0" then
      local j = i
      while j <= 8 and g[j] == "0" do j = j + 1 end
      if j - i > bl then best, bl = i, j - i end
      i = j
    else
      i = i + 1
    end
  end
  if not best then return table.concat(g, ":") end
  local l = table.concat(g, ":", 1, best - 1)
  local r = table.concat(g, ":", best + bl, 8)
  return l .. "::" .. r
end

-- Does ip lie in net/prefix (both byte strings of the same length)?
local function in_net(ip, net, prefix)
  if #ip ~= #net then return false end
  local full = prefix // 8
  if ip:sub(1, full) ~= net:sub(1, full) then return false end
  local rest = prefix % 8
  if rest == 0 then return true end
  local mask = (0xff << (8 - rest)) & 0xff
  return (ip:byte(full + 1) & mask) == (net:byte(full + 1) & mask)
end
M.in_net = in_net

local function cidr(text)
  local a, p = text:match("^(.-)/(%d+)$")
  local ip = a:find(":", 1, true) and M.parse_v6(a) or parse_quad(a)
  return { net = ip, prefix = tonumber(p), text = text }
end

-- Destinations refused unless an allow rule with an address names them.
M.SPECIAL = {}
for _, t in ipairs({
  "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
  "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
  "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
  "::/128", "::1/128", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64",
  "2001::/32", "2001:db8::/32", "2002::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
}) do M.SPECIAL[#M.SPECIAL + 1] = cidr(t) end

--- The special range ip lies in ("169.254.0.0/16"), or nil for a public address.
function M.special(ip)
  for _, r in ipairs(M.SPECIAL) do
    if in_net(ip, r.net, r.prefix) then return r.text end
  end
  return nil
end

-- ----------------------------------------------------------------- names

--- A host name as the box gave it, checked and lowercased (a trailing dot
-- dropped), or nil, why.  Only LDH labels (and '_'): NUL, spaces, percent
-- or UTF-8 encodings, empty labels, over-long names are refused.
function M.check_name(s)
  if type(s) ~= "string" then return nil, "not a string" end
  if #s == 0 then return nil, "empty name" end
  if #s > M.NAME_MAX + 1 then return nil, "name longer than 253 bytes" end
  if s:find("[^%w%.%-_]") then return nil, "name has bytes other than letters, digits, '-', '_', '.'" end
  s = s:lower()
  if s:sub(-1) == "." then s = s:sub(1, -2) end
  if #s == 0 or #s > M.NAME_MAX then return nil, "bad name length" end
  for label in (s .. "."):gmatch("([^.]*)%.") do
    if #label == 0 then return nil, "empty label" end
    if #label > 63 then return nil, "label longer than 63 bytes" end
    if label:sub(1, 1) == "-" or label:sub(-1) == "-" then return nil, "label starts or ends with '-'" end
  end
  return s
end

--- What the box named: { ip = bytes } for any address form, or { name = n },
-- or nil, why.
function M.target(host)
  if type(host) ~= "string" then return nil, "no host" end
  local ip = M.parse_addr(host)
  if ip then return { ip = ip } end
  if host:find("[%[%]:]") then return nil, "malformed address" end
  local name, why = M.check_name(host)
  if not name then return nil, why end
  -- "1.2.3.4." and "010.1" that only look numeric: already addresses above;
  -- a name whose last label is all digits is no real name
  if name:match("%.%d+$") or name:match("^%d+$") then return nil, "numeric name that is no address" end
  return { name = name }
end

-- ----------------------------------------------------------------- rules

local function parse_ports(p)
  if p == nil or p == "*" then return nil end
  local lo, hi = p:match("^(%d+)%-(%d+)$")
  if not lo then lo = p:match("^(%d+)$"); hi = lo end
  if not lo or #lo > 5 or #hi > 5 then return false end
  lo, hi = tonumber(lo), tonumber(hi)
  if lo < 1 or hi > 65535 or lo > hi then return false end
  return { lo, hi }
end

--- Parses one rule string.  Returns the rule or nil, why.  "known:" before
-- a name rule makes it one whose names are never looked up upstream: the
-- daemon resolves them only from its hosts file (docs/network.md).
function M.parse_rule(s)
  if type(s) ~= "string" then return nil, "a rule is a string" end
  local known = s:match("^known:(.*)$")
  if known then
    local r, why = M.parse_rule(known)
    if not r then return nil, why end
    if r.kind ~= "name" then return nil, "'known:' takes a name rule, not an address" end
    if r.known then return nil, "'known:' twice" end
    r.known, r.text = true, s
    return r
  end
  if #s == 0 or #s > 300 or s:find("[%s%z]") then return nil, "empty, too long, or has spaces/NUL" end
  local hostpart, portpart
  local b, rest = s:match("^(%[[^%]]*%])(.*)$")
  if b then
    hostpart = b:sub(2, -2)
    if rest ~= "" then
      portpart = rest:match("^:(.+)$")
      if not portpart then
        local pre, pp = rest:match("^(/%d+)(.*)$")
        if not pre then return nil, "junk after ']'" end
        hostpart = hostpart .. pre
        portpart = pp ~= "" and pp:match("^:(.+)$") or nil
        if pp ~= "" and not portpart then return nil, "junk after prefix" end
      end
    end
  elseif select(2, s:gsub(":", "")) >= 2 then
    hostpart = s -- bare IPv6: no port
  else
    hostpart, portpart = s:match("^([^:]*):(.*)$")
    if not hostpart then hostpart = s end
  end
  local ports = parse_ports(portpart)
  if ports == false then return nil, ("bad port '%s' (1-65535, a range lo-hi, or *)"):format(portpart) end
  local rule = { text = s, ports = ports }
  local a, pfx = hostpart:match("^(.-)/(%d+)$")
  if a then
    local ip = a:find(":", 1, true) and M.parse_v6(a) or parse_quad(a)
    if not ip then return nil, "bad address in CIDR" end
    local n = tonumber(pfx)
    if #pfx > 3 or n > #ip * 8 then return nil, "bad prefix length" end
    rule.kind, rule.net, rule.prefix = "addr", ip, n
    if #ip == 16 and n >= 96 and ip:sub(1, 12) == V4_MAPPED then
      rule.net, rule.prefix = ip:sub(13), n - 96
    end
    return rule
  end
  local ip = hostpart:find(":", 1, true) and M.parse_v6(hostpart) or parse_quad(hostpart)
  if ip then
    ip = M.canon(ip)
    rule.kind, rule.net, rule.prefix = "addr", ip, #ip * 8
    return rule
  end
  if M.parse_v4(hostpart) then return nil, "write addresses as dotted quads" end
  local wild = hostpart:match("^%*%.(.+)$")
  local name, why = M.check_name(wild or hostpart)
  if not name then return nil, ("bad host '%s': %s"):format(hostpart, why) end
  rule.kind, rule.name, rule.wildcard = "name", name, wild ~= nil
  return rule
end

--- Validates and compiles a network value ("none", "all", or { allow, deny }).
-- Returns { all = bool, allow = {rules}, deny = {rules}, text = value } or nil, err.
function M.compile(v)
  if v == nil or v == "none" then return { all = false, allow = {}, deny = {}, spec = "none" } end
  if v == "all" then return { all = true, allow = {}, deny = {}, spec = "all" } end
  if type(v) ~= "table" then return nil, "network must be \"none\", \"all\" or { allow = [...], deny = [...] }" end
  local out = { all = false, allow = {}, deny = {}, spec = { allow = {}, deny = {} } }
  local n = 0
  for k, list in pairs(v) do
    if k ~= "allow" and k ~= "deny" then
      return nil, ("network: unknown field '%s' (expected allow, deny)"):format(tostring(k))
    end
    if type(list) ~= "table" then return nil, ("network.%s must be a list of rules"):format(k) end
    local len = #list
    for i in pairs(list) do
      if math.type(i) ~= "integer" or i < 1 or i > len then
        return nil, ("network.%s must be a list of rules"):format(k)
      end
    end
    for i = 1, len do
      n = n + 1
      if n > M.RULES_MAX then return nil, ("network: more than %d rules"):format(M.RULES_MAX) end
      local r, why = M.parse_rule(list[i])
      if not r then return nil, ("network.%s[%d] %q: %s"):format(k, i, tostring(list[i]):sub(1, 64), why) end
      out[k][#out[k] + 1] = r
      out.spec[k][#out.spec[k] + 1] = list[i]
    end
  end
  return out
end

local function port_ok(r, port)
  return r.ports == nil or port == nil or (port >= r.ports[1] and port <= r.ports[2])
end

local function name_match(r, name, port)
  if r.kind ~= "name" or not port_ok(r, port) then return false end
  if r.wildcard then
    return #name > #r.name + 1 and name:sub(-(#r.name + 1)) == "." .. r.name
  end
  return name == r.name
end

local function addr_match(r, ip, port)
  return r.kind == "addr" and port_ok(r, port) and in_net(ip, r.net, r.prefix)
end

local function first(list, f, a, port)
  for _, r in ipairs(list) do if f(r, a, port) then return r end end
end

-- One layer (a compiled rule set) judging a name.
local function layer_name(c, name, port)
  local d = first(c.deny, name_match, name, port)
  if d then return false, "denied by rule " .. d.text end
  if c.all then return true end
  if first(c.allow, name_match, name, port) then return true end
  return false, "no rule allows " .. name .. (port and ":" .. port or "")
end

-- One layer judging an address: explicit says the box typed it (else the
-- daemon resolved it from an allowed name).
local function layer_addr(c, ip, port)
  local d = first(c.deny, addr_match, ip, port)
  if d then return false, "denied by rule " .. d.text end
  if first(c.allow, addr_match, ip, port) then return true end
  local sp = M.special(ip)
  if sp then return false, ("%s is a special address (%s) no rule names"):format(M.format(ip), sp) end
  return nil
end

-- A rule set is one compiled layer, or { layers = {...} } (narrowed): every
-- layer must allow.
local function layers(rs)
  return rs.layers or { rs }
end

--- May the box connect to name:port?  (before resolution)  Returns true, or false, why.
function M.allow_name(rs, name, port)
  for _, c in ipairs(layers(rs)) do
    local ok, why = layer_name(c, name, port)
    if not ok then return false, why end
  end
  return true
end

--- May name:port (allowed by allow_name) be looked up upstream?  Not when
-- some layer allows it only by "known:" rules: then the daemon resolves it
-- from its hosts file alone, so a name the box made up below a known:
-- wildcard never leaves the host.  Returns true, or false and the rule.
function M.may_forward(rs, name, port)
  for _, c in ipairs(layers(rs)) do
    if not c.all then
      local only
      for _, r in ipairs(c.allow) do
        if name_match(r, name, port) then
          if not r.known then only = nil; break end
          only = only or r
        end
      end
      if only then return false, only end
    end
  end
  return true
end

--- May the box connect to ip:port?  typed: the box gave this address (else
-- the daemon resolved it from an allowed name).  Returns true, or false, why.
function M.allow_addr(rs, ip, port, typed)
  ip = M.canon(ip)
  for _, c in ipairs(layers(rs)) do
    local ok, why = layer_addr(c, ip, port)
    if ok == false then return false, why end
    if ok == nil and typed and not c.all then
      return false, ("no rule allows %s%s"):format(M.format(ip), port and ":" .. port or "")
    end
  end
  return true
end

--- Does the name resolve for the box (DNS)?  Some allow rule names it (any
-- port) and no deny rule covers it on every port.
function M.resolves(rs, name)
  for _, c in ipairs(layers(rs)) do
    local d = first(c.deny, function(r, n) return r.ports == nil and name_match(r, n) end, name)
    if d then return false, "denied by rule " .. d.text end
    if not c.all and not first(c.allow, name_match, name, nil) then
      return false, "no rule allows " .. name
    end
  end
  return true
end

--- Narrows client rules by policy rules: a destination is reachable only if
-- both allow it (deny in either wins).  Either may be a compiled set or a
-- raw value; returns the narrowed set or nil, err.
function M.narrow(client, policy)
  local function comp(x)
    if type(x) == "table" and (x.layers or x.allow and x.deny and x.all ~= nil) then return x end
    return M.compile(x)
  end
  local a, err = comp(client)
  if not a then return nil, err end
  local b, err2 = comp(policy)
  if not b then return nil, err2 end
  local out = { layers = {} }
  for _, l in ipairs(layers(a)) do out.layers[#out.layers + 1] = l end
  for _, l in ipairs(layers(b)) do out.layers[#out.layers + 1] = l end
  out.spec = a.spec
  return out
end

--- The rules a sandbox gets when a client asks for spec and policies
-- (their `network` values: "none" or { allow, deny }) bind it.  A policy
-- only narrows: "none" refuses any network, rules intersect with what the
-- client asked, and a client asking for "all" under a policy with rules is
-- refused.  Returns the compiled set or nil, err.
function M.with_policies(spec, policy_nets)
  local rs, err = M.compile(spec)
  if not rs then return nil, err end
  for _, pn in ipairs(policy_nets or {}) do
    if pn == "none" then
      if not M.is_none(rs) then return nil, "network: the policy allows no network" end
    else
      if spec == "all" then return nil, 'network: "all" is refused by the policy; name what the box may reach' end
      rs, err = M.narrow(rs, pn)
      if not rs then return nil, "network (policy): " .. err end
    end
  end
  return rs
end

--- Is the set "none" (nothing at all is reachable)?
function M.is_none(rs)
  for _, c in ipairs(layers(rs)) do
    if not c.all and #c.allow == 0 then return true end
  end
  return false
end

return M
