--- The daemon's half of a box's network relay (docs/network.md): the agent
-- hands over what box processes send to its proxy, SOCKS and DNS ports as
-- streams (proto.h NET_*); here the requests are parsed, judged by the
-- sandbox's rules (tupper.netrules), resolved on the host, connected, and
-- the bytes relayed with per-stream flow control.  Every decision is
-- logged in a bounded ring.  Policy is checked here once per connection;
-- an allowed, established stream is then handed to the C relay
-- (core.netrelay, runtime/host/netrelay.c), which moves its bytes without
-- a Lua callback per chunk.
local uv = require("luv")
local core = require("tupper.core")
local rules = require("tupper.net.rules")
local parse = require("tupper.net.parse")
local lazy = require("tupper.util.lazy")

local MSG, NET = core.MSG, core.NET
local M = {}

M.LOG_MAX = 1000              -- decisions kept per sandbox
M.SYNTH_MAX = 4096            -- names with a synthetic address per sandbox
M.CONNECT_TIMEOUT_MS = 10000
M.RESOLVE_TIMEOUT_MS = 5000
M.SYNTH_BASE = "\198\18"      -- 198.18.0.0/15: synthetic addresses handed out by our DNS

-- ------------------------------------------------------------ resolution

-- Set once by the daemon (M.configure), from its own environment: never
-- from a client.
local config = { hosts = nil, upstream = nil }

--- Reads a hosts file ("ADDR NAME..." lines) into a name -> {addr} map.
function M.read_hosts(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local map = {}
  for line in f:lines() do
    line = line:gsub("#.*", "")
    local fields = {}
    for w in line:gmatch("%S+") do fields[#fields + 1] = w end
    local ip = fields[1] and rules.parse_addr(fields[1])
    if ip then
      for i = 2, #fields do
        local name = rules.check_name(fields[i])
        if name then
          map[name] = map[name] or {}
          table.insert(map[name], ip)
        end
      end
    end
  end
  f:close()
  return map
end

--- opts: hosts (a hosts file consulted before anything else), resolver
-- ("ip:port" of the DNS server the daemon asks instead of getaddrinfo).
-- Both exist for tests and for hosts with a split view; see docs/network.md.
function M.configure(opts)
  config = { hosts = nil, upstream = nil }
  if opts.hosts and opts.hosts ~= "" then
    local map, err = M.read_hosts(opts.hosts)
    if not map then return nil, "network hosts file: " .. tostring(err) end
    config.hosts = map
  end
  if opts.resolver and opts.resolver ~= "" then
    local ip, port = opts.resolver:match("^([%d.]+):(%d+)$")
    if not ip or not rules.parse_v4(ip) then return nil, "network resolver must be IPv4:PORT" end
    config.upstream = { ip = ip, port = tonumber(port) }
  end
  return true
end

local function once(cb)
  local done = false
  return function(...)
    if done then return end
    done = true
    cb(...)
  end
end

-- Asks the configured upstream for A records of name.
local function upstream_lookup(name, cb)
  cb = once(cb)
  local udp = uv.new_udp()
  local id = math.random(0, 0xffff)
  local timer = uv.new_timer()
  local function finish(list, err)
    if not udp:is_closing() then udp:close() end
    if not timer:is_closing() then timer:close() end
    cb(list, err)
  end
  timer:start(M.RESOLVE_TIMEOUT_MS, 0, function() finish(nil, "resolver timed out") end)
  udp:recv_start(function(err, data)
    if err then return finish(nil, err) end
    if not data then return end
    local list, why = parse.dns_parse_answer(data, id)
    if list then finish(list) elseif why ~= "not our answer" then finish(nil, why) end
  end)
  local ok, err = pcall(udp.send, udp, parse.dns_make_query(id, name, parse.QTYPE_A),
                        config.upstream.ip, config.upstream.port, function() end)
  if not ok then finish(nil, tostring(err)) end
end

--- Resolves a name (already allowed by the rules) on the host: cb(addrs) or
-- cb(nil, err); addrs are canonical address bytes.
function M.resolve(name, cb)
  if config.hosts then
    local list = config.hosts[name]
    if list then return cb(list) end
  end
  if config.upstream then return upstream_lookup(name, cb) end
  local ok, err = pcall(uv.getaddrinfo, name, nil, { socktype = "stream" }, function(gerr, res)
    if gerr or not res then return cb(nil, tostring(gerr or "no address")) end
    local out = {}
    for _, r in ipairs(res) do
      local ip = r.addr and rules.parse_addr(r.addr)
      if ip then out[#out + 1] = ip end
    end
    cb(out)
  end)
  if not ok then cb(nil, tostring(err)) end
end

--- The addresses of name in the daemon's hosts file, or nil: the only
-- lookup of a name that only "known:" rules allow.
function M.known(name)
  return config.hosts and config.hosts[name] or nil
end

-- ------------------------------------------------------------------ relay

-- A relay's tables are made on their first use and its counters start
-- from these defaults, so that the relay of a box that never used the
-- network is one small table (every idle box has one: docs/benchmarks.md,
-- "Loop").  A box without rules shares the one compiled "none".
local Net = { nstreams = 0, log_next = 1, synth_next = 1, next_host_sid = 0x80000000,
              rules = rules.compile("none") }
Net.__index = lazy.index(Net, { "streams", "log", "synth_by_name", "synth_by_ip", "exposed" })

local function now_iso()
  return os.date("!%Y-%m-%dT%H:%M:%SZ")
end

--- A relay for sandbox sb (sb.box:send carries its frames).
function M.new(sb)
  return setmetatable({ sb = sb }, Net)
end

--- Replaces the rules (a compiled set): new connections and DNS queries
-- are judged by them; open connections stay.
function Net:set_rules(rs)
  self.rules = rs
end

-- What the box sent, fit for the log and for JSON: printable ASCII only,
-- bounded (a box must not fill the daemon's memory through its log).
local function clean(s, max)
  if type(s) ~= "string" then return s end
  if #s > max then s = s:sub(1, max) .. "..." end
  return (s:gsub("[^\32-\126]", "?"))
end

--- Appends one decision to the ring.
function Net:record(action, via, host, port, reason, addr)
  local e = { time = now_iso(), action = action, via = via, host = clean(host, 255), port = port,
              reason = clean(reason, 512), addr = addr and rules.format(addr) or nil }
  self.log[self.log_next] = e
  self.log_next = self.log_next % M.LOG_MAX + 1
end

--- The decisions, oldest first.
function Net:entries()
  local out = {}
  for i = 0, M.LOG_MAX - 1 do
    local e = self.log[(self.log_next - 1 + i) % M.LOG_MAX + 1]
    if e then out[#out + 1] = e end
  end
  return out
end

function Net:_send(t, fields)
  if self.sb.state ~= "running" and self.sb.state ~= "paused" then return end
  self.sb.box:send(t, 0, fields)
end

-- A synthetic address standing for name (198.18.0.0/15).
function Net:synth(name)
  local ip = self.synth_by_name[name]
  if ip then return ip end
  local i = self.synth_next
  self.synth_next = i % M.SYNTH_MAX + 1
  ip = M.SYNTH_BASE .. string.char((i >> 8) & 0xff, i & 0xff)
  local old = self.synth_by_ip[ip]
  if old then self.synth_by_name[old] = nil end
  self.synth_by_ip[ip], self.synth_by_name[name] = name, ip
  return ip
end

-- ----------------------------------------------------------------- streams

local Stream = {}
Stream.__index = Stream

function Net:_stream_close(s, notify)
  if s.closed then return end
  s.closed = true
  self.streams[s.sid] = nil
  self.nstreams = self.nstreams - 1
  if s.c then -- relayed in C: it ends the stream there and tells the box
    s.c = nil
    if self.crelay then self.crelay:drop(s.sid, notify) end
    notify = false
  end
  if s.timer and not s.timer:is_closing() then s.timer:close() end
  if s.tcp and not s.tcp:is_closing() then s.tcp:close() end
  if notify then self:_send(MSG.NET_CLOSE, { sid = s.sid }) end
  if s.on_close then s.on_close() end
end

-- Data for the box: sent as the host's window (Net:_wdown) allows,
-- the rest queued (at most one upstream read beyond the window, since
-- reading stops at the window).
function Net:_to_box(s, data)
  local wdown = self:_wdown()
  if data and #data > 0 then s.outq[#s.outq + 1] = data end
  while #s.outq > 0 and s.out_unacked < wdown and not s.closed do
    local d = table.remove(s.outq, 1)
    local room = math.min(wdown - s.out_unacked, NET.CHUNK)
    if #d > room then
      table.insert(s.outq, 1, d:sub(room + 1))
      d = d:sub(1, room)
    end
    s.out_unacked = s.out_unacked + #d
    self:_send(MSG.NET_DATA, { sid = s.sid, data = d })
  end
  if #s.outq == 0 and s.eof_pending and not s.eof_sent then
    s.eof_sent = true
    self:_send(MSG.NET_EOF, { sid = s.sid })
  end
  if s.tcp and not s.reading and not s.up_eof and s.out_unacked < wdown and #s.outq == 0
     and not s.closed then
    s.reading = true
    s.tcp:read_start(function(err, chunk) self:_upstream_read(s, err, chunk) end)
  end
end

function Net:_upstream_read(s, err, chunk)
  if s.closed then return end
  if err then return self:_stream_close(s, true) end
  if not chunk then
    s.up_eof, s.eof_pending = true, true
    s.reading = false
    s.tcp:read_stop()
    return self:_to_box(s)
  end
  self:_to_box(s, chunk)
  if s.out_unacked >= self:_wdown() or #s.outq > 0 then
    s.reading = false
    s.tcp:read_stop()
  end
end

-- Acknowledges n bytes of the box's data (delivered or consumed).
function Net:_ack(s, n)
  if n <= 0 or s.closed then return end
  s.in_unacked = s.in_unacked - n
  self:_send(MSG.NET_ACK, { sid = s.sid, size = n })
end

-- Bytes from the box towards the upstream connection.
function Net:_upstream_write(s, data)
  if #data == 0 then return end
  s.writing = s.writing + 1
  local n = #data
  s.tcp:write(data, function(err)
    s.writing = s.writing - 1
    if s.closed then return end
    if err then return self:_stream_close(s, true) end
    self:_ack(s, n)
    self:_maybe_shut(s)
  end)
end

-- Answers the box and ends its side (a refusal): what the box still sends
-- is read and dropped.
function Net:_refuse(s, reply)
  s.state = "refused"
  if reply and #reply > 0 then self:_to_box(s, reply) end
  s.eof_pending = true
  self:_to_box(s)
end

-- ---------------------------------------------------------------- deciding

--- Judges host:port as the box named it.  cb(ok, why, addr, name): addr is
-- the exact address to connect to, name the host name checked (nil for an
-- address).  Resolution happens on the host and only for allowed names.
function Net:decide(host, port, via, cb)
  local t, why = rules.target(host)
  if not t then
    self:record("deny", via, host, port, why)
    return cb(false, why)
  end
  local rs = self.rules
  local function hook(name, addr)
    local h = self.on_connect
    if h then
      local ok, hok, hwhy = pcall(h, name or rules.format(addr), port, rules.format(addr))
      if not ok then return false, "on_connect hook failed: " .. tostring(hok) end
      if hok ~= true then return false, hwhy or "refused by the policy's on_connect" end
    end
    return true
  end
  if t.ip and self.synth_by_ip[t.ip] then
    t = { name = self.synth_by_ip[t.ip] } -- an address our DNS handed out
  elseif t.ip and rules.in_net(t.ip, M.SYNTH_BASE .. "\0\0", 15) then
    why = rules.format(t.ip) .. " is no address this box's DNS handed out"
    self:record("deny", via, host, port, why)
    return cb(false, why)
  end
  if t.ip then
    local ok, awhy = rules.allow_addr(rs, t.ip, port, true)
    if ok then ok, awhy = hook(nil, t.ip) end
    self:record(ok and "allow" or "deny", via, host, port, awhy, t.ip)
    return cb(ok, awhy, t.ip)
  end
  local ok, nwhy = rules.allow_name(rs, t.name, port)
  if not ok then
    self:record("deny", via, t.name, port, nwhy)
    return cb(false, nwhy)
  end
  local resolve = M.resolve
  local fwd, krule = rules.may_forward(rs, t.name, port)
  if not fwd then
    resolve = function(name, rcb)
      local list = M.known(name)
      if list then return rcb(list) end
      rcb(nil, ("only rule %s allows it, and the daemon's hosts file does not list it " ..
        "(a known: rule's names are never looked up upstream)"):format(krule.text))
    end
  end
  resolve(t.name, function(addrs, rerr)
    if not addrs or #addrs == 0 then
      local w = ("cannot resolve %s: %s"):format(t.name, tostring(rerr or "no address"))
      self:record("deny", via, t.name, port, w)
      return cb(false, w)
    end
    -- rebinding: every address is judged; the first acceptable one is
    -- the one connected to, exactly
    local last
    for _, ip in ipairs(addrs) do
      ip = rules.canon(ip)
      local aok, awhy = rules.allow_addr(self.rules, ip, port, false)
      if aok then
        local hok, hwhy = hook(t.name, ip)
        self:record(hok and "allow" or "deny", via, t.name, port, hwhy, ip)
        return cb(hok, hwhy, ip, t.name)
      end
      last = awhy
    end
    local w = ("%s resolves only to refused addresses (%s)"):format(t.name, last)
    self:record("deny", via, t.name, port, w)
    cb(false, w)
  end)
end

-- Connects s to addr:port; cb(ok, err).
function Net:_connect(s, addr, port, cb)
  cb = once(cb)
  local tcp = uv.new_tcp()
  s.tcp = tcp
  s.timer = uv.new_timer()
  s.timer:start(M.CONNECT_TIMEOUT_MS, 0, function() cb(false, "connect timed out") end)
  local ok, err = pcall(tcp.connect, tcp, rules.format(addr), port, function(cerr)
    if s.timer and not s.timer:is_closing() then s.timer:close() end
    s.timer = nil
    if s.closed then return end
    if cerr then return cb(false, tostring(cerr)) end
    tcp:nodelay(true)
    cb(true)
  end)
  if not ok then cb(false, tostring(err)) end
end

-- The tunnel is up: the first bytes may be a TLS ClientHello, whose SNI
-- must name the host the box asked for.
function Net:_opened(s, rest)
  s.state = "sni"
  s.buf = rest or ""
  self:_to_box(s) -- the server may speak first (SSH, SMTP): its bytes flow meanwhile
  self:_sni(s)
end

-- The box ended its side and everything it sent is written: so does the
-- upstream connection.
function Net:_maybe_shut(s)
  if s.box_eof and s.writing == 0 and not s.shut and s.tcp and not s.closed then
    s.shut = true
    s.tcp:shutdown()
  end
end

-- What a stream may have unacknowledged towards the box: the download
-- window where the box's agent said it takes it (READY's FLAGS), else the
-- window of older agents (a box re-adopted across an upgrade).
function Net:_wdown()
  return self.sb.net_window_down and NET.WINDOW_DOWN or NET.WINDOW
end

-- The C relay of this box, made at its first use; nil if it cannot be.
function Net:_crelay()
  if self.crelay == nil and self.sb.box then
    -- a microVM's box is a wrapper: its channel's own box is .core
    local nr, err = core.netrelay(self.sb.box.core or self.sb.box, function(sid, to_up, to_box, e)
      self:_c_ended(sid, to_up, to_box, e)
    end, self:_wdown(), self.sb.net_give)
    if not nr then
      io.stderr:write("tupper: network relay in C unavailable, relaying in Lua: " .. tostring(err) .. "\n")
      self.crelay = false
    else
      self.crelay = nr
    end
  end
  return self.crelay or nil
end

-- A stream relayed in C ended by its peers (the box closed it, the
-- upstream failed, a frame broke the protocol): C told the box already.
function Net:_c_ended(sid, to_up, to_box, err)
  local s = self.streams[sid]
  if not s then return end
  s.c = nil
  s.to_up, s.to_box, s.err = to_up, to_box, err
  self:_stream_close(s, false)
end

-- The stream is judged and connected: its bytes move from here on.  head
-- is the daemon's own first bytes for the upstream (a rewritten request
-- head), data the box's bytes received so far, all unacknowledged.  The C
-- relay takes the stream with its window state; where it cannot (no
-- relay), the bytes go on through Lua as before.
function Net:_relay(s, head, data)
  s.state = "open"
  local nr = self:_crelay()
  if nr and s.tcp and s.writing == 0 and s.in_unacked == #data then
    if s.reading then s.tcp:read_stop(); s.reading = false end
    s.c = true
    local ok, err = nr:take({ sid = s.sid, fd = s.tcp:fileno(), up = head .. data, up_head = #head,
                              down = table.concat(s.outq), out_unacked = s.out_unacked,
                              box_eof = s.box_eof, up_eof = s.up_eof, eof_sent = s.eof_sent })
    if ok then
      s.outq = {}
      if not s.tcp:is_closing() then s.tcp:close() end -- C holds its own descriptor
      s.tcp = nil
      return
    end
    s.c = nil
    io.stderr:write("tupper: network relay in C refused a stream, relaying in Lua: " .. tostring(err) .. "\n")
    if s.closed then return end
  end
  if #head > 0 then s.tcp:write(head) end
  self:_upstream_write(s, data)
  self:_maybe_shut(s)
  self:_to_box(s)
end

function Net:_sni(s)
  local h, why = parse.client_hello(s.buf)
  if h == nil then
    if #s.buf >= parse.HELLO_MAX then why = "ClientHello too large" else return end
  end
  if h and h.tls and s.name then
    local sni = h.sni and rules.check_name(h.sni)
    if not sni then
      why = h.sni and "SNI is no valid host name" or "TLS without SNI to a named host"
    elseif sni ~= s.name then
      why = ("SNI %s does not match %s"):format(sni, s.name)
    end
  elseif h and h.tls and h.sni and not s.name then
    -- an address target: the SNI is a name no rule was asked about
    local sni = rules.check_name(h.sni)
    if not sni then why = "SNI is no valid host name"
    else
      local ok, nwhy = rules.allow_name(self.rules, sni, s.port)
      if not ok then why = ("SNI %s: %s"):format(sni, nwhy) end
    end
  end
  if why then
    self:record("deny", s.via .. "/tls", s.name or s.host, s.port, why)
    return self:_stream_close(s, true)
  end
  local data = s.buf
  s.buf = nil
  self:_relay(s, "", data)
end

function Net:_http(s)
  local req, a, b = parse.http_head(s.buf)
  if req == nil then return end
  local consumed = #s.buf
  if req == false then
    self:record("deny", "http", nil, nil, b)
    self:_ack(s, consumed)
    return self:_refuse(s, parse.http_error(a, b))
  end
  local rest = a
  s.state = "deciding"
  s.buf = nil
  s.via = req.connect and "connect" or "http"
  s.host, s.port = req.host, req.port
  -- the head is consumed; what follows it stays unacknowledged until written
  self:_ack(s, consumed - #rest)
  self:decide(req.host, req.port, s.via, function(ok, why, addr, name)
    if s.closed then return end
    if not ok then return self:_refuse(s, parse.http_error(403, why)) end
    s.name = name
    self:_connect(s, addr, req.port, function(cok, cerr)
      if s.closed then return end
      if not cok then
        self:record("fail", s.via, name or req.host, req.port, cerr, addr)
        return self:_refuse(s, parse.http_error(502, "cannot connect: " .. cerr))
      end
      if req.connect then
        self:_to_box(s, "HTTP/1.1 200 Connection established\r\n\r\n")
        return self:_opened(s, rest .. (s.buf_after or ""))
      end
      local later = rest .. (s.buf_after or "")
      s.buf_after = nil
      self:_relay(s, req.head, later)
    end)
  end)
end

function Net:_socks(s)
  local req, a, b = parse.socks(s.buf, s.greeted)
  if req == nil then
    if a then s.greeted = true; self:_to_box(s, a) end
    return
  end
  local consumed = #s.buf
  if req == false then
    self:record("deny", "socks", nil, nil, b)
    self:_ack(s, consumed)
    return self:_refuse(s, a)
  end
  local rest, choice = a, b
  if choice then s.greeted = true; self:_to_box(s, choice) end
  s.state = "deciding"
  s.buf = nil
  s.via = "socks"
  s.host, s.port = req.host, req.port
  self:_ack(s, consumed - #rest)
  self:decide(req.host, req.port, "socks", function(ok, why, addr, name)
    if s.closed then return end
    if not ok then return self:_refuse(s, parse.socks_reply(parse.SOCKS_RULESET)) end
    s.name = name
    self:_connect(s, addr, req.port, function(cok, cerr)
      if s.closed then return end
      if not cok then
        self:record("fail", "socks", name or req.host, req.port, cerr, addr)
        return self:_refuse(s, parse.socks_reply(parse.SOCKS_REFUSED))
      end
      self:_to_box(s, parse.socks_reply(parse.SOCKS_OK))
      self:_opened(s, rest .. (s.buf_after or ""))
    end)
  end)
end

-- A box's DNS queries, at most M.DNS_RATE a second after a burst of
-- M.DNS_BURST (a token bucket): a flood costs the daemon's loop a frame
-- each, not a parse, a rule check and an answer.  What is over is dropped
-- (resolvers retry) and said in the box's network log once a second.
M.DNS_RATE, M.DNS_BURST = 200, 400

--- Whether one more DNS query of the box is within its rate.
function Net:dns_allowed()
  local now, b = uv.now(), self.dns_bucket
  if not b then
    b = { tokens = M.DNS_BURST, at = now, dropped = 0, said = nil }
    self.dns_bucket = b
  end
  b.tokens = math.min(M.DNS_BURST, b.tokens + (now - b.at) * M.DNS_RATE / 1000)
  b.at = now
  if b.tokens >= 1 then
    b.tokens = b.tokens - 1
    return true
  end
  b.dropped = b.dropped + 1
  if not b.said or now - b.said >= 1000 then
    self:record("deny", "dns", "(rate limit)", nil,
                ("over %d queries/s: %d dropped"):format(M.DNS_RATE, b.dropped))
    b.said, b.dropped = now, 0
  end
  return false
end

--- The answer to one DNS query from the box (raw message), or nil to drop it.
function Net:dns(msg)
  if not self:dns_allowed() then return nil end
  local q, why, id = parse.dns_query(msg)
  if not q then
    if id then return parse.dns_error(id, parse.DNS_FORMERR) end
    return nil
  end
  local name, nwhy = rules.check_name(q.qname)
  local ok, rwhy = false, nwhy
  if name then ok, rwhy = rules.resolves(self.rules, name) end
  if ok and not M.known(name) then
    -- a name only known: rules allow resolves only if the hosts file has it
    -- (on any port: the box's DNS query carries none)
    local fwd, krule = rules.may_forward(self.rules, name, nil)
    if not fwd then ok, rwhy = false, ("only rule %s allows it, and the daemon's hosts file does not list it"):format(krule.text) end
  end
  if q.qclass ~= 1 then ok, rwhy = false, "not class IN" end
  self:record(ok and "allow" or "deny", "dns", name or ("(%d bytes)"):format(#q.qname), nil,
              ok and nil or rwhy)
  if not ok then return parse.dns_answer(q, parse.DNS_NXDOMAIN) end
  if q.qtype == parse.QTYPE_A then return parse.dns_answer(q, parse.DNS_NOERROR, self:synth(name)) end
  return parse.dns_answer(q, parse.DNS_NOERROR) -- AAAA and the rest: no data (clients use IPv4)
end

function Net:_dns_tcp(s)
  while #s.buf >= 2 do
    local n = s.buf:byte(1) * 256 + s.buf:byte(2)
    if #s.buf < 2 + n then
      if n > NET.DNS_MAX then return self:_stream_close(s, true) end
      return
    end
    local msg = s.buf:sub(3, 2 + n)
    s.buf = s.buf:sub(3 + n)
    self:_ack(s, 2 + n)
    local ans = self:dns(msg)
    if ans then self:_to_box(s, string.char(#ans >> 8, #ans & 0xff) .. ans) end
  end
end

-- ------------------------------------------------------------- the frames

--- One NET_* frame from the agent.  A frame that breaks the protocol
-- (window overrun, a stream id reused) closes that stream.
function Net:frame(t, f)
  local sid = math.tointeger(f.sid)
  if not sid or sid <= 0 then return end
  if t == MSG.NET_DNS then
    if type(f.data) ~= "string" then return end
    local ans = self:dns(f.data)
    if ans then self:_send(MSG.NET_DNS, { sid = sid, data = ans }) end
    return
  end
  local s = self.streams[sid]
  if t == MSG.NET_OPEN then
    local kind = math.tointeger(f.kind)
    if kind == NET.CONNECTED then
      if s and s.state == "connecting-in" then s.state = "open"; if s.on_open then s.on_open() end end
      return
    end
    if s or sid >= 0x80000000 or (kind ~= NET.HTTP and kind ~= NET.SOCKS and kind ~= NET.DNS_TCP)
       or self.nstreams >= NET.STREAMS_MAX then
      return self:_send(MSG.NET_CLOSE, { sid = sid })
    end
    self.streams[sid] = setmetatable({ sid = sid, kind = kind, state = "head", buf = "", outq = {},
      out_unacked = 0, in_unacked = 0, writing = 0 }, Stream)
    self.nstreams = self.nstreams + 1
    return
  end
  if not s then return end
  if t == MSG.NET_DATA then
    local data = f.data
    if type(data) ~= "string" or s.in_unacked + #data > NET.WINDOW then
      self:record("deny", s.via or "stream", s.host, s.port, "flow control violated")
      return self:_stream_close(s, true)
    end
    s.in_unacked = s.in_unacked + #data
    if s.state == "head" then
      s.buf = s.buf .. data
      if s.kind == NET.HTTP then self:_http(s)
      elseif s.kind == NET.SOCKS then self:_socks(s)
      else self:_dns_tcp(s) end
    elseif s.state == "deciding" then
      s.buf_after = (s.buf_after or "") .. data
    elseif s.state == "sni" then
      s.buf = s.buf .. data
      self:_sni(s)
    elseif s.state == "open" then
      if s.inbound then return self:_inbound_data(s, data) end
      self:_upstream_write(s, data)
    else -- refused: dropped
      self:_ack(s, #data)
    end
  elseif t == MSG.NET_ACK then
    local n = math.tointeger(f.size)
    if not n or n < 0 or n > s.out_unacked then
      return self:_stream_close(s, true)
    end
    s.out_unacked = s.out_unacked - n
    self:_to_box(s)
  elseif t == MSG.NET_EOF then
    s.box_eof = true
    if s.inbound then return self:_inbound_eof(s) end
    if s.state == "open" then self:_maybe_shut(s) end
  elseif t == MSG.NET_CLOSE then
    self:_stream_close(s, false)
  end
end

--- The box is gone: every stream and forwarder ends.
function Net:close_all()
  for _, s in pairs(self.streams) do self:_stream_close(s, false) end
  if self.crelay then self.crelay:close() end
  self.crelay = nil
  for port, e in pairs(self.exposed) do
    if not e.server:is_closing() then e.server:close() end
    self.exposed[port] = nil
  end
end

-- ------------------------------------------------------------- inbound

-- Bytes from the box for a host client of a forwarded port.
function Net:_inbound_data(s, data)
  s.client:write(data, function(err)
    if s.closed then return end
    if err then return self:_stream_close(s, true) end
    self:_ack(s, #data)
  end)
end

function Net:_inbound_eof(s)
  if not s.client:is_closing() then s.client:shutdown() end
end

--- Forwards 127.0.0.1:<random port> on the host to port inside the box.
-- Returns the host port, or nil, err.
function Net:expose(port)
  if self.exposed[port] then return self.exposed[port].host_port end
  local server = uv.new_tcp()
  local ok, err = server:bind("127.0.0.1", 0)
  if not ok then server:close(); return nil, err end
  ok, err = server:listen(64, function(lerr)
    if lerr then return end
    local client = uv.new_tcp()
    if not server:accept(client) then client:close(); return end
    if self.nstreams >= NET.STREAMS_MAX then client:close(); return end
    local sid = self.next_host_sid
    self.next_host_sid = sid >= 0xfffffff0 and 0x80000000 or sid + 1
    local s = setmetatable({ sid = sid, kind = NET.CONNECTED, state = "connecting-in", outq = {},
      out_unacked = 0, in_unacked = 0, writing = 0, inbound = true, client = client,
      host = "127.0.0.1", port = port, via = "inbound" }, Stream)
    s.tcp = client -- reading the host client follows the same window as an upstream
    self.streams[sid] = s
    self.nstreams = self.nstreams + 1
    s.on_close = function() if not client:is_closing() then client:close() end end
    s.on_open = function() self:_to_box(s) end
    self:record("allow", "inbound", "127.0.0.1", port, nil)
    self:_send(MSG.NET_CONNECT, { sid = sid, port = port })
  end)
  if not ok then server:close(); return nil, err end
  local name = server:getsockname()
  self.exposed[port] = { server = server, host_port = name.port }
  return name.port
end

return M
