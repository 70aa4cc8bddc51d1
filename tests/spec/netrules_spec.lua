-- Network rules and the parsers of what a box sends through the relay
-- (tupper.netrules, tupper.netparse): pure functions, fed hostile bytes.
local rules = require("tupper.net.rules")
local parse = require("tupper.net.parse")

local LOOP = "\127\0\0\1"

local function compile(v) return assert(rules.compile(v)) end

describe("address forms", function()
  it("normalises every inet_aton form of 127.0.0.1", function()
    for _, s in ipairs({ "127.0.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0x7f.1",
                         "0177.1", "127.0.1", "0x7F.0.0.0x1" }) do
      assert.equal(LOOP, rules.parse_addr(s), s)
    end
  end)
  it("normalises IPv6 forms, IPv4-mapped ones to IPv4", function()
    assert.equal(LOOP, rules.parse_addr("[::ffff:127.0.0.1]"))
    assert.equal(LOOP, rules.parse_addr("::ffff:7f00:1"))
    assert.equal("\169\254\169\254", rules.parse_addr("[::ffff:a9fe:a9fe]"))
    assert.equal(("\0"):rep(15) .. "\1", rules.parse_addr("[::1]"))
    assert.equal("::1", rules.format(rules.parse_addr("0:0:0:0:0:0:0:1")))
    assert.equal("fd00::1", rules.format(rules.parse_addr("fd00:0::1")))
  end)
  it("refuses what is no address", function()
    for _, s in ipairs({ "256.0.0.1", "1.2.3.4.5", "08.1.1.1", "", "1..2", "1.2.3.-4",
                         "::1::", "fe80::1%eth0", "[::1", "1:2:3:4:5:6:7:8:9", "4294967296",
                         "::ffff:1.2.3.256", "0x100000000" }) do
      assert.is_nil(rules.parse_addr(s), s)
    end
  end)
  it("classifies special destinations", function()
    for _, s in ipairs({ "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
                         "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "[::1]", "[fd00::1]",
                         "[fe80::1]", "[fd00:ec2::254]", "[64:ff9b::a9fe:a9fe]", "[2002:a9fe:a9fe::]" }) do
      assert.truthy(rules.special(rules.parse_addr(s)), s)
    end
    for _, s in ipairs({ "1.1.1.1", "151.101.0.223", "[2a04:4e42::223]" }) do
      assert.is_nil(rules.special(rules.parse_addr(s)), s)
    end
  end)
end)

describe("host names", function()
  it("lowercases and drops one trailing dot", function()
    assert.same({ name = "pypi.org" }, rules.target("PyPI.org."))
  end)
  it("refuses NUL, odd encodings, empty and over-long labels", function()
    for _, s in ipairs({ "a\0.b", "pypi.org\0.evil.com", "ex ample.com", "%70ypi.org", "p\195\188pi.org",
                         "a..b", ".a", "a.b..", ("a"):rep(64) .. ".com", ("a."):rep(127) .. "com",
                         "-a.com", "a-.com", "a/b", "a@b", "[::1", "1.2.3.4.5", "a.123" }) do
      assert.is_nil(rules.target(s), s)
    end
    -- short numeric forms are addresses, never names
    assert.same({ ip = "\1\2\0\3" }, rules.target("1.2.3"))
    assert.same({ ip = "\0\0\0\123" }, rules.target("123"))
  end)
end)

describe("rules", function()
  it("parses names, wildcards, addresses, prefixes and ports", function()
    local r = assert(rules.parse_rule("*.pythonhosted.org:443"))
    assert.same({ "name", "pythonhosted.org", true, { 443, 443 } }, { r.kind, r.name, r.wildcard, r.ports })
    r = assert(rules.parse_rule("10.1.2.0/24:5432"))
    assert.same({ "addr", 24, { 5432, 5432 } }, { r.kind, r.prefix, r.ports })
    r = assert(rules.parse_rule("[fd00::1]:8000-8100"))
    assert.same({ "addr", 128, { 8000, 8100 } }, { r.kind, r.prefix, r.ports })
    assert.equal(8, assert(rules.parse_rule("fd00::/8")).prefix)
    assert.is_nil(assert(rules.parse_rule("pypi.org")).ports)
  end)
  it("refuses malformed rules", function()
    for _, s in ipairs({ "", "pypi.org:0", "pypi.org:65536", "pypi.org:2-1", "a b", "x:y", "*", "*.",
                         "10.0.0.0/33", "1.2.3.4/", "[::1]x", "2130706433", "a\0b", "**.x.com" }) do
      assert.is_nil(rules.parse_rule(s), s)
    end
    assert.is_nil(rules.compile({ allow = { "ok.com" }, other = {} }))
    assert.is_nil(rules.compile({ allow = "pypi.org" }))
    assert.is_nil(rules.compile("some"))
  end)
  it("lets deny win, matches wildcards below the domain only, and checks ports", function()
    local rs = compile({ allow = { "pypi.org", "*.pythonhosted.org:443", "api.x.com:8000-8100" },
                         deny = { "evil.pythonhosted.org" } })
    assert.is_true(rules.allow_name(rs, "pypi.org", 443))
    assert.is_true(rules.allow_name(rs, "files.pythonhosted.org", 443))
    assert.is_false(rules.allow_name(rs, "files.pythonhosted.org", 80))
    assert.is_false(rules.allow_name(rs, "pythonhosted.org", 443))
    assert.is_false(rules.allow_name(rs, "xpythonhosted.org", 443))
    local ok, why = rules.allow_name(rs, "evil.pythonhosted.org", 443)
    assert.is_false(ok)
    assert.matches("denied by rule evil", why)
    assert.is_true(rules.allow_name(rs, "api.x.com", 8050))
    assert.is_false(rules.allow_name(rs, "api.x.com", 8101))
    assert.is_false(rules.allow_name(rs, "other.com", 443))
  end)
  it("refuses special addresses unless a rule names them, typed or resolved (rebinding)", function()
    local rs = compile({ allow = { "pypi.org", "10.1.2.0/24:5432" } })
    -- resolved from an allowed name
    assert.is_true(rules.allow_addr(rs, "\151\101\0\223", 443, false))
    assert.is_false(rules.allow_addr(rs, LOOP, 443, false))
    assert.is_false(rules.allow_addr(rs, "\169\254\169\254", 80, false))
    assert.is_false(rules.allow_addr(rs, "\10\1\2\3", 80, false))
    assert.is_true(rules.allow_addr(rs, "\10\1\2\3", 5432, false))
    -- typed by the box: only address rules allow
    assert.is_false(rules.allow_addr(rs, "\151\101\0\223", 443, true))
    assert.is_true(rules.allow_addr(rs, "\10\1\2\9", 5432, true))
    -- an IPv4-mapped IPv6 form is its IPv4 address
    assert.is_false(rules.allow_addr(rs, assert(rules.parse_v6("::ffff:169.254.169.254")), 80, true))
    -- "all" reaches public addresses, never special ones
    local all = compile("all")
    assert.is_true(rules.allow_addr(all, "\1\1\1\1", 53, true))
    assert.is_false(rules.allow_addr(all, "\169\254\169\254", 80, true))
    assert.is_false(rules.allow_addr(all, LOOP, 80, false))
    assert.is_false(rules.allow_name(compile("none"), "pypi.org", 443))
  end)
  it("resolves names for the box only where a rule allows them", function()
    local rs = compile({ allow = { "pypi.org:443", "*.x.com" }, deny = { "bad.x.com", "p.x.com:22" } })
    assert.is_true(rules.resolves(rs, "pypi.org"))
    assert.is_true(rules.resolves(rs, "a.x.com"))
    assert.is_true(rules.resolves(rs, "p.x.com"))   -- denied on one port only
    assert.is_false(rules.resolves(rs, "bad.x.com"))
    assert.is_false(rules.resolves(rs, "x.com"))
    assert.is_false(rules.resolves(rs, ("a"):rep(60) .. ".exfil.com"))
  end)
  it("forwards no name that only known: rules allow, in any layer", function()
    local r = assert(rules.parse_rule("known:*.x.test:443"))
    assert.is_true(r.known and r.wildcard)
    assert.same({ 443, 443 }, r.ports)
    assert.is_nil((rules.parse_rule("known:10.0.0.1")))
    assert.is_nil((rules.parse_rule("known:known:a.test")))
    assert.is_nil((rules.parse_rule("known:")))
    local rs = compile({ allow = { "known:*.x.test", "api.x.test", "*.y.test" } })
    assert.is_true(rules.allow_name(rs, "made-up.x.test", 443))
    assert.is_false((rules.may_forward(rs, "made-up.x.test", 443)))
    assert.is_true(rules.may_forward(rs, "api.x.test", 443)) -- an exact rule names it too
    assert.is_true(rules.may_forward(rs, "made-up.y.test", 443)) -- a plain wildcard forwards
    -- a policy layer of known: rules binds a client's plain wildcard
    local narrowed = assert(rules.narrow(compile({ allow = { "*.y.test" } }), { allow = { "known:*.y.test" } }))
    assert.is_true(rules.allow_name(narrowed, "made-up.y.test", 80))
    assert.is_false((rules.may_forward(narrowed, "made-up.y.test", 80)))
  end)
  it("narrows by policy: both must allow, none forbids, all is refused under rules", function()
    local rs = assert(rules.with_policies({ allow = { "pypi.org", "github.com" } },
                                          { { allow = { "pypi.org" } } }))
    assert.is_true(rules.allow_name(rs, "pypi.org", 443))
    assert.is_false(rules.allow_name(rs, "github.com", 443))
    assert.is_nil(rules.with_policies("all", { { allow = { "pypi.org" } } }))
    assert.is_nil(rules.with_policies({ allow = { "pypi.org" } }, { "none" }))
    assert.truthy(rules.with_policies("none", { "none" }))
    local n = assert(rules.narrow({ allow = { "*.x.com" } }, { deny = { "a.x.com" }, allow = { "*.x.com" } }))
    assert.is_false(rules.allow_name(n, "a.x.com", 80))
    assert.is_true(rules.allow_name(n, "b.x.com", 80))
  end)
end)

describe("HTTP proxy heads", function()
  it("rewrites a plain request to origin form, one request per connection", function()
    local req, rest = parse.http_head("GET http://allowed.test:8080/a?b HTTP/1.1\r\nHost: allowed.test:8080\r\n" ..
      "Proxy-Connection: keep-alive\r\nAccept: */*\r\n\r\nBODY")
    assert.same({ "allowed.test", 8080, "BODY" }, { req.host, req.port, rest })
    assert.equal("GET /a?b HTTP/1.1\r\nHost: allowed.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n", req.head)
  end)
  it("reads CONNECT targets", function()
    local req = parse.http_head("CONNECT [::1]:443 HTTP/1.1\r\n\r\n")
    assert.same({ "[::1]", 443, true }, { req.host, req.port, req.connect })
    assert.is_nil(parse.http_head("CONNECT a.com:443 HTTP/1.1\r\n"))
  end)
  it("refuses lies and malformed heads", function()
    local cases = {
      { "GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n", "does not match" },
      { "GET http://a.test/ HTTP/1.1\r\nHost: a.test:81\r\n\r\n", "does not match" },
      { "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", "more than one Host" },
      { "GET http://a.test/ HTTP/1.1\r\n\r\n", "no Host" },
      { "CONNECT a.test:443 HTTP/1.1\r\nHost: b.test:443\r\n\r\n", "does not match" },
      { "CONNECT a.test HTTP/1.1\r\n\r\n", "CONNECT target" },
      { "GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "only http://" },
      { "GET /local HTTP/1.1\r\nHost: a.test\r\n\r\n", "absolute" },
      { "GET http://u:p@a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "userinfo" },
      { "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: 1\r\n  folded\r\n\r\n", "folding" },
      { "GET http://a.te\0st/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "NUL" },
      { "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: a\1b\r\n\r\n", "control" },
      { "get http://a.test/ HTTP/1.1\r\n\r\n", "request line" },
      { "GET http://a.test:99999/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "bad port" },
    }
    for _, c in ipairs(cases) do
      local ok, status, why = parse.http_head(c[1])
      assert.is_false(ok, c[1])
      assert.equal(400, status, c[1])
      assert.matches(c[2], why, 1, true)
    end
    local ok, status = parse.http_head(("A"):rep(parse.HEAD_MAX + 1))
    assert.same({ false, 431 }, { ok, status })
  end)
end)

describe("SOCKS5", function()
  local function req(atyp, addr, port)
    return "\5\1\0\5\1\0" .. string.char(atyp) .. addr .. string.char(port >> 8, port & 255)
  end
  it("reads a domain CONNECT sent with the greeting", function()
    local r, rest, choice = parse.socks(req(3, "\12allowed.test", 80) .. "GET")
    assert.same({ "allowed.test", 80, "GET", "\5\0" }, { r.host, r.port, rest, choice })
    r = parse.socks(req(1, "\1\2\3\4", 443))
    assert.equal("1.2.3.4", r.host)
  end)
  it("waits for more bytes, answering the greeting", function()
    local r, choice = parse.socks("\5\1\0\5\1")
    assert.is_nil(r)
    assert.equal("\5\0", choice)
    assert.is_nil((parse.socks("\5\1\0\5\1\0\3\12allowed", true)))
    assert.is_nil((parse.socks("\5\1\0\5\1\0\3"))) -- name length not there yet (fuzz_net)
  end)
  it("refuses NUL and odd bytes in names, other commands and methods", function()
    local ok, reply, why = parse.socks(req(3, "\12allowed\0test", 80))
    assert.is_false(ok)
    assert.equal(parse.SOCKS_RULESET, reply:byte(4))
    assert.matches("LDH", why)
    ok, reply = parse.socks("\5\1\0\5\2\0\1\1\2\3\4\0\80") -- BIND
    assert.is_false(ok)
    assert.equal(parse.SOCKS_CMD, reply:byte(4))
    ok, reply = parse.socks("\5\1\0\5\1\0\9\1\2\3\4\0\80")
    assert.equal(parse.SOCKS_ATYP, reply:byte(4))
    ok, reply = parse.socks("\5\1\2")
    assert.same({ false, "\5\255" }, { ok, reply })
    assert.is_false((parse.socks("\4\1\0\80\1\2\3\4\0")))
    assert.is_false((parse.socks(req(3, "\0", 80))))
  end)
end)

describe("DNS", function()
  local function query(name, qtype, id)
    return parse.dns_make_query(id or 0x1234, name, qtype or 1)
  end
  it("reads a query and answers it", function()
    local q = assert(parse.dns_query(query("pypi.org")))
    assert.same({ 0x1234, "pypi.org", 1, 1 }, { q.id, q.qname, q.qtype, q.qclass })
    local ans = parse.dns_answer(q, 0, "\198\18\0\1")
    assert.same({ "\198\18\0\1" }, parse.dns_parse_answer(ans, 0x1234))
    local nx = parse.dns_answer(q, parse.DNS_NXDOMAIN)
    assert.equal(3, nx:byte(4) & 0xf)
    assert.is_nil(parse.dns_parse_answer(nx, 0x1234))
  end)
  it("refuses hostile queries", function()
    local base = query("a.com")
    assert.is_nil(parse.dns_query(base:sub(1, 11)))
    local q, why, id = parse.dns_query(base:sub(1, 12) .. "\192\12\0\1\0\1") -- compression pointer
    assert.is_nil(q)
    assert.equal(0x1234, id)
    assert.matches("compressed", why)
    assert.is_nil(parse.dns_query(base:sub(1, 5) .. "\2" .. base:sub(7))) -- two questions
    assert.is_nil(parse.dns_query(base:sub(1, 2) .. "\128\0" .. base:sub(5))) -- a response
    assert.is_nil(parse.dns_query(base:sub(1, 14))) -- truncated label
    local long = {}
    for i = 1, 5 do long[i] = ("x"):rep(63) end
    assert.is_nil(parse.dns_query(query(table.concat(long, "."))))
  end)
end)

describe("TLS ClientHello", function()
  -- a minimal ClientHello with the given server_name (or none)
  local function hello(sni)
    local function u16(n) return string.char(n >> 8, n & 255) end
    local ext = ""
    if sni then
      local entry = "\0" .. u16(#sni) .. sni
      ext = "\0\0" .. u16(#entry + 2) .. u16(#entry) .. entry
    end
    local body = "\3\3" .. ("r"):rep(32) .. "\0" .. u16(2) .. "\19\1" .. "\1\0" .. u16(#ext) .. ext
    local hs = "\1" .. string.char(0) .. u16(#body) .. body
    return "\22\3\1" .. u16(#hs) .. hs
  end
  it("finds the SNI, or says it is no TLS", function()
    assert.same({ tls = true, sni = "tls.test" }, parse.client_hello(hello("tls.test")))
    assert.same({ tls = true }, parse.client_hello(hello(nil)))
    assert.same({ tls = false }, parse.client_hello("GET / HTTP/1.1\r\n"))
    assert.is_nil(parse.client_hello(hello("tls.test"):sub(1, 20)))
  end)
  it("refuses ClientHellos it cannot judge", function()
    local h = hello("tls.test")
    assert.is_false((parse.client_hello(h:sub(1, 5) .. "\2" .. h:sub(7))))
    -- the handshake claims more than its record holds
    assert.is_false((parse.client_hello(h:sub(1, 6) .. "\1" .. h:sub(8))))
    -- a server_name entry cut after its type byte (fuzz_net)
    local f = assert(io.open((os.getenv("TUPPER_ROOT") or ".") .. "/tests/fuzz/corpus/fuzz_net/crash-sni-entry-cut", "rb"))
    local cut = f:read("a")
    f:close()
    assert.is_false((parse.client_hello(cut)))
  end)
end)

describe("hostile bytes", function()
  it("never make a parser fail", function()
    math.randomseed(7)
    local seeds = { "\5\1\0\5\1\0\3", "GET http://", "CONNECT ", "\22\3\1\0\80\1", "\18\52\1\0\0\1" }
    for i = 1, 3000 do
      local n = math.random(0, 300)
      local t = {}
      for k = 1, n do t[k] = string.char(math.random(0, 255)) end
      local s = seeds[i % #seeds + 1] .. table.concat(t)
      for _, f in ipairs({ parse.http_head, parse.socks, parse.dns_query, parse.client_hello,
                           rules.target, rules.parse_rule, rules.parse_addr }) do
        local ok, err = pcall(f, s)
        assert(ok, err)
        ok, err = pcall(f, table.concat(t))
        assert(ok, err)
      end
      local ok, err = pcall(parse.dns_parse_answer, s, 0x1234)
      assert(ok, err)
    end
  end)
end)

