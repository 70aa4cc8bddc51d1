--- Harness of fuzz_net.c: returns a function that takes one fuzz input and
-- feeds it to every parser of the network relay (tupper.netparse) and to
-- the rule and address code (tupper.netrules).  Checked, beyond "no Lua
-- error": what a parser accepts is well-formed (ports in range, names that
-- pass the name check, rewritten heads with no NUL that end the head), a
-- DNS answer built for a parsed query parses back to its address, an
-- NXDOMAIN to nothing, and addresses survive format -> parse unchanged.
local parse = require("tupper.net.parse")
local rules = require("tupper.net.rules")

local SYNTH = "\198\18\0\1"

local function port_ok(p) return math.type(p) == "integer" and p >= 1 and p <= 65535 end

local function check_target(host)
  local t = rules.target(host)
  if t and t.name then
    assert(rules.check_name(t.name) == t.name, "a checked name checks again to itself")
    assert(not t.name:find("[^%w%.%-_]"), "a name of LDH bytes only")
  elseif t and t.ip then
    assert(#t.ip == 4 or #t.ip == 16)
  end
end

return function(s)
  -- HTTP proxy heads
  local req, a, b = parse.http_head(s)
  if req then
    assert(type(req.host) == "string" and #req.host > 0 and port_ok(req.port))
    assert(type(a) == "string")
    if not req.connect then
      assert(req.head:sub(-4) == "\r\n\r\n" and not req.head:find("%z"))
      assert(req.head:find("\r\nConnection: close\r\n\r\n$"))
    end
    check_target(req.host)
  elseif req == false then
    assert(math.type(a) == "integer" and type(b) == "string")
    assert(parse.http_error(a, b):find("^HTTP/1%.1 %d%d%d "))
  end
  -- SOCKS5, with and without the greeting answered
  for _, greeted in ipairs({ false, true }) do
    local r, x = parse.socks(s, greeted)
    if r then
      assert(port_ok(r.port))
      check_target(r.host)
    elseif r == false then
      assert(type(x) == "string")
    end
  end
  -- DNS
  local q = parse.dns_query(s)
  if q then
    local list = assert(parse.dns_parse_answer(parse.dns_answer(q, parse.DNS_NOERROR, SYNTH), q.id))
    assert(#list == 1 and list[1] == SYNTH, "an answer parses back to its address")
    assert(parse.dns_parse_answer(parse.dns_answer(q, parse.DNS_NXDOMAIN), q.id) == nil)
    local name = rules.check_name(q.qname)
    if name then assert(rules.check_name(name) == name) end
  end
  parse.dns_parse_answer(s, 0x1234)
  -- TLS
  local h = parse.client_hello(s)
  if h and h.sni then assert(type(h.sni) == "string") end
  -- rules and addresses
  local r = rules.parse_rule(s)
  if r then
    assert(r.kind == "name" or r.kind == "addr")
    if r.ports then assert(port_ok(r.ports[1]) and port_ok(r.ports[2]) and r.ports[1] <= r.ports[2]) end
  end
  local ip = rules.parse_addr(s)
  if ip then
    assert(#ip == 4 or #ip == 16)
    assert(rules.parse_addr(rules.format(ip)) == ip, "format then parse gives the address back")
    rules.special(ip)
  end
  check_target(s)
end
