-- Network egress through the daemon, by rules (docs/network.md), against
-- real servers on the host's loopback: busybox httpd plays the HTTP hosts,
-- openssl s_server a TLS one, a name map (TUPPER_NET_HOSTS) points the
-- test names at them, and a fake upstream resolver in this process
-- (TUPPER_NET_RESOLVER) records every query the daemon makes.  Clients run
-- inside the box (busybox wget, nc, nslookup) or, for curl and openssl,
-- in the box's network namespace (nsenter --net): that is where the
-- proxy, SOCKS and DNS ports are, and nothing else is.
local uv = require("luv")
local h = require("helper")
local json = require("tupper.util.json")
local parse = require("tupper.net.parse")

local sh, free_port, wait_port = h.sh_status, h.free_port, h.wait_port

local function have(prog)
  return os.execute("command -v " .. prog .. " >/dev/null 2>&1")
end

describe("network", function()
  local dir, d, c, hp, tp, up_port, upstream, queries, servers, big_md5
  local sb -- a sandbox: allowed.test and tls.test, the loopback servers named explicitly

  local function run(id, cmd)
    return h.sync(h.run, c, id, { "/bin/sh", "-c", cmd })
  end
  local function agent_pid(id)
    local rec = json.decode(assert(h.read_file(d.state .. "/boxes/" .. id .. ".json")))
    return math.tointeger(rec.pid)
  end
  -- a command in the box's network namespace only (host binaries)
  local function in_netns(id, cmd)
    return sh(("nsenter --net=/proc/%d/ns/net sh -c '%s'"):format(agent_pid(id), cmd))
  end
  local function create(network)
    local r, err = h.call(c, "sandbox.create", { network = network })
    assert(r, err and err.message)
    return r.id
  end
  local function log_of(id)
    return assert(h.call(c, "sandbox.network_log", { id = id })).entries
  end
  local function logged(id, pattern)
    for _, e in ipairs(log_of(id)) do
      local line = table.concat({ e.action, e.via, tostring(e.host), tostring(e.reason) }, " ")
      if line:find(pattern) then return line end
    end
    return nil
  end

  setup(function()
    dir = h.tmpdir()
    hp, tp, up_port = free_port(), free_port(), free_port()
    -- the servers
    assert(os.execute("mkdir -p " .. dir .. "/www && echo hello-net > " .. dir .. "/www/index.html"))
    assert(os.execute("head -c 4000000 /dev/urandom > " .. dir .. "/www/big"))
    big_md5 = select(2, sh("md5sum < " .. dir .. "/www/big")):match("^(%x+)")
    assert(os.execute(("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes " ..
      "-keyout %s/k.pem -out %s/c.pem -subj /CN=tls.test -days 1 >/dev/null 2>&1"):format(dir, dir)))
    servers = {}
    local function spawn(bin, args)
      local hd, pid = uv.spawn(bin, { args = args, stdio = { nil, nil, nil } }, function() end)
      assert(hd, pid)
      servers[#servers + 1] = hd
    end
    spawn("/bin/busybox", { "httpd", "-f", "-p", "127.0.0.1:" .. hp, "-h", dir .. "/www" })
    spawn("/usr/bin/openssl", { "s_server", "-quiet", "-accept", "127.0.0.1:" .. tp, "-cert", dir .. "/c.pem",
                                "-key", dir .. "/k.pem", "-www" })
    wait_port(hp)
    wait_port(tp)
    -- the fake upstream resolver: records every question, answers 127.0.0.1
    queries = {}
    upstream = uv.new_udp()
    assert(upstream:bind("127.0.0.1", up_port))
    upstream:recv_start(function(err, data, addr)
      if err or not data then return end
      local q = parse.dns_query(data)
      if not q then return end
      queries[#queries + 1] = q.qname
      upstream:send(parse.dns_answer(q, 0, "\127\0\0\1"), addr.ip, addr.port, function() end)
    end)
    local hosts = dir .. "/hosts"
    local f = assert(io.open(hosts, "w"))
    f:write("127.0.0.1 allowed.test denied.test tls.test rebind.test www.allowed.test\n169.254.169.254 meta.test\n")
    f:close()
    -- this environment, plus the name map and the fake upstream
    local env = {}
    local pe = io.popen("env")
    for line in pe:lines() do if line:find("=", 1, true) then env[#env + 1] = line end end
    pe:close()
    env[#env + 1] = "TUPPER_NET_HOSTS=" .. hosts
    env[#env + 1] = "TUPPER_NET_RESOLVER=127.0.0.1:" .. up_port
    d = h.start_daemon(dir .. "/d", { env = env })
    c = d.connect()
    sb = create({ allow = { "allowed.test", "tls.test", "upstream.test", "127.0.0.1/32:" .. hp,
                            "127.0.0.1:" .. tp } })
  end)

  teardown(function()
    if c then
      for _, s in ipairs(assert(h.call(c, "sandbox.list", {})).sandboxes) do
        h.call(c, "sandbox.kill", { id = s.id })
      end
      c:close()
    end
    if d then d.stop() end
    for _, hd in ipairs(servers or {}) do
      uv.process_kill(hd, "sigterm")
      hd:close()
    end
    if upstream then upstream:close() end
    h.drain()
    h.rmrf(dir)
  end)

  it("gives processes proxy variables and a resolver; boxes without rules get none", function()
    local r = run(sb, "cat /etc/resolv.conf; env | sort | grep -i _proxy=")
    assert.matches("nameserver 127.0.0.1", r.stdout)
    assert.matches("HTTP_PROXY=http://127.0.0.1:3128", r.stdout, 1, true)
    assert.matches("ALL_PROXY=socks5h://127.0.0.1:1080", r.stdout, 1, true)
    assert.matches("no_proxy=localhost,127.0.0.1", r.stdout, 1, true)
    local plain = create(nil)
    r = run(plain, "env | grep -ci _proxy=; nslookup allowed.test 127.0.0.1")
    assert.matches("^0\n", r.stdout)
    assert.matches("NXDOMAIN", r.stdout)
    h.call(c, "sandbox.kill", { id = plain })
  end)

  it("lets allowed traffic through: wget via the proxy, curl via CONNECT+TLS and SOCKS5", function()
    local r = run(sb, "wget -q -O- http://allowed.test:" .. hp .. "/index.html")
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("hello-net\n", r.stdout)
    -- 4 MB through the relay's flow control, intact
    r = run(sb, "wget -q -O- http://allowed.test:" .. hp .. "/big | md5sum")
    assert.equal(big_md5, r.stdout:match("^(%x+)"))
    if have("curl") then
      local code, out = in_netns(sb, "curl -sS --cacert " .. dir .. "/c.pem -x http://127.0.0.1:3128 https://tls.test:" .. tp .. "/")
      assert.equal(0, code, out)
      assert.matches("s_server", out)
      code, out = in_netns(sb, "curl -sS --socks5-hostname 127.0.0.1:1080 http://allowed.test:" .. hp .. "/index.html")
      assert.equal(0, code, out)
      assert.equal("hello-net\n", out)
    end
    assert.truthy(logged(sb, "^allow http allowed%.test"))
  end)

  it("answers NXDOMAIN for names no rule allows and refuses their connections clearly", function()
    local r = run(sb, "nslookup allowed.test 127.0.0.1; nslookup denied.test 127.0.0.1")
    assert.matches("Address: 198%.18%.%d+%.%d+", r.stdout)
    assert.matches("can't find denied.test: NXDOMAIN", r.stdout, 1, true)
    r = run(sb, "wget -q -O- http://denied.test:" .. hp .. "/index.html")
    assert.not_equal(0, r.exit_code)
    assert.matches("403 Forbidden", r.stderr)
    r = run(sb, "printf 'CONNECT denied.test:" .. tp .. " HTTP/1.1\\r\\n\\r\\n' | nc -w 5 127.0.0.1 3128")
    assert.matches("^HTTP/1.1 403 Forbidden", r.stdout)
    assert.matches("no rule allows denied.test:" .. tp, r.stdout, 1, true)
    -- SOCKS5: greeting, CONNECT denied.test:hp -> reply 2 (not allowed by ruleset)
    r = run(sb, ("printf '\\005\\001\\000\\005\\001\\000\\003\\013denied.test\\%03o\\%03o' | nc -w 5 127.0.0.1 1080 | od -An -tx1")
      :format(hp >> 8, hp & 255))
    assert.matches("05 00 05 02", r.stdout)
    assert.truthy(logged(sb, "^deny socks denied%.test"))
    assert.truthy(logged(sb, "^deny dns denied%.test"))
  end)

  it("answers DNS over TCP too, several queries on one connection", function()
    if not have("python3") then return pending("no python3 on the host") end
    local f = assert(io.open(dir .. "/tcpdns.py", "w"))
    f:write([[
import socket, struct, sys
def q(i, name):
    m = struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0)
    for l in name.split("."): m += bytes([len(l)]) + l.encode()
    m += b"\0\0\1\0\1"
    return struct.pack(">H", len(m)) + m
s = socket.create_connection(("127.0.0.1", 53), timeout=5)
s.sendall(q(1, "allowed.test") + q(2, "denied.test"))
buf = b""
while len(buf) < 4 or len(buf) < 2 + struct.unpack(">H", buf[:2])[0] + 2:
    d = s.recv(4096)
    if not d: break
    buf += d
for _ in range(2):
    n = struct.unpack(">H", buf[:2])[0]
    m, buf = buf[2:2 + n], buf[2 + n:]
    i, flags, qd, an = struct.unpack(">HHHH", m[:8])
    print(i, flags & 15, an, ".".join(str(b) for b in m[-4:]) if an else "-")
]])
    f:close()
    local code, out = in_netns(sb, "python3 " .. dir .. "/tcpdns.py")
    assert.equal(0, code, out)
    assert.matches("^1 0 1 198%.18%.%d+%.%d+\n2 3 0 %-\n$", out)
  end)

  it("gives direct connections nowhere to go", function()
    -- (busybox wget -Y off crashes: nc makes the direct connections)
    local r = run(sb, "ip -o link; ip route; printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 3 127.0.0.1 " .. hp)
    assert.not_equal(0, r.exit_code)
    assert.not_matches("hello%-net", r.stdout)
    assert.not_matches("eth", r.stdout)
    assert.matches("refused", r.stderr)
    -- an address the box resolved itself (our synthetic one) reaches nothing directly
    r = run(sb, "printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 3 allowed.test " .. hp)
    assert.not_equal(0, r.exit_code)
    assert.matches("198%.18%.", r.stderr)
    assert.not_matches("hello%-net", r.stdout)
  end)

  it("refuses metadata and private addresses, behind allowed names (rebinding) and in numeric forms", function()
    local id = create({ allow = { "allowed.test", "rebind.test", "meta.test" } })
    local cases = {
      { "http://rebind.test:" .. hp .. "/", "rebind%.test resolves only to refused addresses" },
      { "http://meta.test/", "169%.254%.169%.254 is a special address" },
      { "http://169.254.169.254/latest/meta-data/", "169%.254%.169%.254 is a special address" },
      { "http://2130706433:" .. hp .. "/", "127%.0%.0%.1 is a special address" },
      { "http://0x7f.1:" .. hp .. "/", "127%.0%.0%.1 is a special address" },
      { "http://0177.0.0.1:" .. hp .. "/", "127%.0%.0%.1 is a special address" },
      { "http://[::ffff:127.0.0.1]:" .. hp .. "/", "127%.0%.0%.1 is a special address" },
      { "http://[::1]:" .. hp .. "/", "::1 is a special address" },
      { "http://10.1.2.3/", "10%.1%.2%.3 is a special address" },
      -- the name is allowed, but 127.0.0.1 is named by no rule of this box
      { "http://allowed.test:" .. hp .. "/index.html", "allowed%.test resolves only to refused" },
    }
    for _, case in ipairs(cases) do
      local r = run(id, "wget -q -O- '" .. case[1] .. "'")
      assert.not_equal(0, r.exit_code, case[1])
      assert.matches("403 Forbidden", r.stderr, 1, true)
      assert.truthy(logged(id, case[2]), case[1])
    end
    h.call(c, "sandbox.kill", { id = id })
  end)

  it("refuses a Host header that lies, a mismatched SNI and NUL bytes in names", function()
    local r = run(sb, "printf 'GET http://allowed.test:" .. hp .. "/index.html HTTP/1.1\\r\\nHost: denied.test\\r\\n\\r\\n'" ..
      " | nc -w 5 127.0.0.1 3128")
    assert.matches("^HTTP/1.1 400 Bad Request", r.stdout)
    assert.matches("Host header does not match", r.stdout)
    assert.not_matches("hello%-net", r.stdout)
    r = run(sb, ("printf '\\005\\001\\000\\005\\001\\000\\003\\022allowed.test\\000.evil\\%03o\\%03o' | nc -w 5 127.0.0.1 1080 | od -An -tx1")
      :format(hp >> 8, hp & 255))
    assert.matches("05 00 05 02", r.stdout)
    -- a huge name of high bytes: refused, and logged bounded and printable
    r = run(sb, "printf 'CONNECT %s:80 HTTP/1.1\\r\\n\\r\\n' $(head -c 9000 /dev/zero | tr '\\0' '\\377') | nc -w 5 127.0.0.1 3128")
    assert.matches("^HTTP/1.1 403", r.stdout)
    local entries = log_of(sb)
    local last = entries[#entries]
    assert.equal("deny", last.action)
    assert.is_true(#last.host <= 258)
    assert.is_nil(last.host:find("[^\32-\126]"))
    assert.matches("^%?%?%?.*%.%.%.$", last.host)
    if have("openssl") then
      local code, out = in_netns(sb, "openssl s_client -proxy 127.0.0.1:3128 -connect tls.test:" .. tp ..
        " -servername denied.test </dev/null")
      assert.matches("Cipher is (NONE)", out, 1, true)
      assert.truthy(logged(sb, "SNI denied%.test does not match tls%.test"), out)
      code, out = in_netns(sb, "openssl s_client -proxy 127.0.0.1:3128 -connect tls.test:" .. tp ..
        " -servername tls.test </dev/null")
      assert.equal(0, code, out)
      assert.matches("Cipher is TLS", out, 1, true)
    end
  end)

  it("never lets a DNS query reach the upstream for a name no rule allows", function()
    local long = ("a"):rep(63) .. "." .. ("b"):rep(63)
    queries = {}
    local r = run(sb, "nslookup " .. long .. ".exfil.test 127.0.0.1; nslookup secret." .. long ..
      ".allowed.test 127.0.0.1; wget -q -O- http://" .. long .. ".exfil.test/; nslookup -type=TXT t.exfil.test 127.0.0.1")
    assert.matches("NXDOMAIN", r.stdout)
    -- an allowed name outside the hosts map does reach it: the check can fail
    r = run(sb, "wget -q -O- http://upstream.test:" .. hp .. "/index.html")
    assert.equal("hello-net\n", r.stdout)
    assert.same({ "upstream.test" }, queries)
  end)

  it("forwards a name the box made up below a wildcard, and below a known: wildcard never", function()
    -- a plain wildcard: the box's name is looked up upstream at connect
    -- (docs/network.md says so): data in a label leaves the host
    -- (the address rule: the test servers are on the host's loopback)
    local wild = create({ allow = { "*.allowed.test:" .. hp, "127.0.0.1/32:" .. hp } })
    queries = {}
    run(wild, "wget -q -O- http://exfil-secret1.allowed.test:" .. hp .. "/index.html")
    assert.same({ "exfil-secret1.allowed.test" }, queries)
    h.call(c, "sandbox.kill", { id = wild })
    -- known: names come from the daemon's hosts file alone
    local known = create({ allow = { "known:*.allowed.test:" .. hp, "127.0.0.1/32:" .. hp } })
    queries = {}
    local r = run(known, "wget -q -O- http://www.allowed.test:" .. hp .. "/index.html")
    assert.equal("hello-net\n", r.stdout, r.stderr)
    r = run(known, "nslookup www.allowed.test 127.0.0.1; nslookup exfil-secret2.allowed.test 127.0.0.1")
    assert.matches("Address: 198%.18%.%d+%.%d+", r.stdout)
    assert.matches("can't find exfil-secret2.allowed.test: NXDOMAIN", r.stdout, 1, true)
    r = run(known, "printf 'CONNECT exfil-secret3.allowed.test:" .. hp .. " HTTP/1.1\\r\\n\\r\\n' | nc -w 5 127.0.0.1 3128")
    assert.matches("^HTTP/1.1 403 Forbidden", r.stdout)
    assert.matches("never looked up upstream", r.stdout, 1, true)
    r = run(known, "wget -q -O- http://exfil-secret4.allowed.test:" .. hp .. "/index.html")
    assert.not_equal(0, r.exit_code)
    r = run(known, ("printf '\\005\\001\\000\\005\\001\\000\\003\\032exfil-secret5.allowed.test\\%03o\\%03o' | nc -w 5 127.0.0.1 1080 | od -An -tx1")
      :format(hp >> 8, hp & 255))
    assert.matches("05 00 05 0[24]", r.stdout)
    assert.same({}, queries, "no query of a known: rule's name reached the upstream")
    assert.truthy(logged(known, "^deny dns exfil%-secret2"))
    -- known: is for names only
    local _, err = h.call(c, "sandbox.create", { network = { allow = { "known:10.0.0.1" } } })
    assert.matches("'known:' takes a name rule", err.message, 1, true)
    h.call(c, "sandbox.kill", { id = known })
  end)

  it("applies a live rule update to the next connection", function()
    local url = "http://denied.test:" .. hp .. "/index.html"
    assert.not_equal(0, run(sb, "wget -q -O- " .. url).exit_code)
    local r = assert(h.call(c, "sandbox.update_network", { id = sb, network = { allow = {
      "allowed.test", "denied.test", "127.0.0.1/32:" .. hp } } }))
    assert.same({ "allowed.test", "denied.test", "127.0.0.1/32:" .. hp }, r.network.allow)
    assert.equal("hello-net\n", run(sb, "wget -q -O- " .. url).stdout)
    assert(h.call(c, "sandbox.update_network", { id = sb, network = "none" }))
    local rr = run(sb, "wget -q -O- " .. url)
    assert.not_equal(0, rr.exit_code)
    local _, err = h.call(c, "sandbox.update_network", { id = sb, network = { allow = { "x.com:0" } } })
    assert.matches("bad port", err.message)
    assert(h.call(c, "sandbox.update_network", { id = sb, network = { allow = {
      "allowed.test", "tls.test", "upstream.test", "127.0.0.1/32:" .. hp, "127.0.0.1:" .. tp } } }))
    local code, out = h.cli({ "--socket", d.socket, "logs", "--network", sb })
    assert.equal(0, code)
    assert.matches("allow http +denied%.test:" .. hp .. " %-> 127%.0%.0%.1", out)
    assert.matches("deny +http +denied%.test:" .. hp, out)
  end)

  it("is narrowed by the sandbox's policy file: its rules and its on_connect hook", function()
    local src = [[
return policy {
  network = { allow = { "allowed.test", "tls.test", "127.0.0.0/8" } },
  on_connect = function(host, port, addr)
    if host == "allowed.test" then return true end
    return false, "only allowed.test, not " .. host .. " (" .. addr .. ")"
  end,
}]]
    local r, err = h.call(c, "sandbox.create", { policy = { source = src, name = "p.lua" },
      network = { allow = { "allowed.test", "tls.test", "denied.test", "127.0.0.1/32:" .. hp } } })
    assert(r, err and err.message)
    local out = run(r.id, "wget -q -O- http://allowed.test:" .. hp .. "/index.html")
    assert.equal("hello-net\n", out.stdout)
    out = run(r.id, "wget -q -O- http://tls.test:" .. hp .. "/index.html")
    assert.matches("403 Forbidden", out.stderr)
    assert.truthy(logged(r.id, "deny http tls%.test policy p%.lua: on_connect refused: only allowed%.test, not tls%.test %(127%.0%.0%.1%)"))
    out = run(r.id, "wget -q -O- http://denied.test:" .. hp .. "/index.html")
    assert.matches("403 Forbidden", out.stderr)
    assert.truthy(logged(r.id, "deny http denied%.test no rule allows denied%.test"))
    -- the policy's rules narrow updates too; "all" is refused under them
    local _, uerr = h.call(c, "sandbox.update_network", { id = r.id, network = "all" })
    assert.matches('"all" is refused by the policy', uerr.message, 1, true)
    h.call(c, "sandbox.kill", { id = r.id })
    local _, cerr = h.call(c, "sandbox.create", { policy = { source = "return policy { network = 'none' }", name = "n.lua" },
      network = { allow = { "allowed.test" } } })
    assert.matches("the policy allows no network", cerr.message, 1, true)
  end)

  it("takes rules from the CLI: run --allow/--deny, --network", function()
    local code, out, err = h.cli({ "--socket", d.socket, "run", "--allow", "allowed.test", "--allow",
      "127.0.0.1/32:" .. hp, "--deny", "denied.test", "--", "sh", "-c",
      "wget -q -O- http://allowed.test:" .. hp .. "/index.html; wget -q -O- http://denied.test:" .. hp .. "/ || echo refused" })
    assert.equal(0, code, err)
    assert.equal("hello-net\nrefused\n", out)
    code, out = h.cli({ "--socket", d.socket, "run", "--", "sh", "-c", "echo \"[$HTTP_PROXY]\"" })
    assert.equal("[]\n", out)
    code, _, err = h.cli({ "--socket", d.socket, "run", "--network", "some", "--", "true" })
    assert.equal(125, code)
    assert.matches("--network wants all or none", err, 1, true)
  end)

  it("exposes a port of the box on the host's loopback, only when asked", function()
    local r = run(sb, "mkdir -p /srv && echo from-the-box > /srv/index.html && httpd -p 127.0.0.1:8000 -h /srv && echo up")
    assert.equal("up\n", r.stdout)
    local code, out = h.cli({ "--socket", d.socket, "port", sb, "8000" })
    assert.equal(0, code, out)
    local port = tonumber(out:match("^127%.0%.0%.1:(%d+)\n$"))
    assert.truthy(port)
    local body = h.sync(function()
      local async = require("tupper.util.async")
      local t = uv.new_tcp()
      local err = async.wait(function(cb) t:connect("127.0.0.1", port, function(e) cb(e) end) end)
      assert(not err, err)
      t:write("GET /index.html HTTP/1.0\r\n\r\n")
      local got = {}
      async.wait(function(cb)
        t:read_start(function(e, chunk) if chunk then got[#got + 1] = chunk else cb() end end)
      end)
      t:close()
      return table.concat(got)
    end)
    assert.matches("from%-the%-box", body)
    local again = assert(h.call(c, "sandbox.expose", { id = sb, port = 8000 }))
    assert.equal(port, math.tointeger(again.port))
  end)
end)
