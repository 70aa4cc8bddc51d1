-- The network relay's data path in C (runtime/host/netrelay.c,
-- docs/network.md): once the daemon has judged and connected a stream, its
-- bytes move without Lua.  Against real peers on the host's loopback
-- (busybox httpd, and tests/spec/netrelay_peer.py for an upstream that
-- stops reading and one that closes mid-stream): bulk downloads byte-exact
-- through the HTTP proxy and SOCKS5, a stalled upstream that blocks the
-- box's writer while the daemon's memory stays put, an upstream and a box
-- that end mid-stream, with the daemon's descriptors back where they were
-- and the other connections unharmed; the box's socket itself taken from
-- the agent by the daemon.
local uv = require("luv")
local h = require("helper")
local json = require("tupper.util.json")

local PEER = (os.getenv("TUPPER_ROOT") or ".") .. "/tests/spec/netrelay_peer.py"
local BIG = 32 * 1024 * 1024

local sh, free_port, wait_port = h.sh_status, h.free_port, h.wait_port

describe("network relay in C", function()
  local dir, d, c, sb, hp, stall_port, cut_port, servers, big_sha

  local function run(cmd)
    return h.sync(h.run, c, sb, { "/bin/sh", "-c", cmd })
  end
  local function in_netns(cmd)
    local rec = json.decode(assert(h.read_file(d.state .. "/boxes/" .. sb .. ".json")))
    return sh(("nsenter --net=/proc/%d/ns/net %s"):format(math.tointeger(rec.pid), cmd))
  end
  local function daemon_fds()
    local _, out = sh("ls /proc/" .. d.pid .. "/fd | wc -l")
    return tonumber(out:match("%d+"))
  end
  local function daemon_rss_kib()
    local s = assert(h.read_file("/proc/" .. d.pid .. "/status"))
    return tonumber(s:match("VmRSS:%s*(%d+)"))
  end
  -- the daemon's descriptors come back to n: every relayed stream's
  -- upstream socket is closed (the box's side ends in the agent first)
  local function fds_back_to(n)
    return h.sync(function()
      if h.poll(function() return daemon_fds() <= n end, nil, 20) then return true end
      return false, daemon_fds()
    end)
  end

  setup(function()
    dir = h.tmpdir()
    hp, stall_port, cut_port = free_port(), free_port(), free_port()
    assert(os.execute("mkdir -p " .. dir .. "/www && head -c " .. BIG .. " /dev/urandom > " .. dir .. "/www/big"))
    big_sha = select(2, sh("sha256sum < " .. dir .. "/www/big")):match("^(%x+)")
    servers = {}
    local function spawn(bin, args)
      local hd, pid = uv.spawn(bin, { args = args, stdio = { nil, nil, 2 } }, function() end)
      assert(hd, pid)
      servers[#servers + 1] = hd
    end
    spawn("/bin/busybox", { "httpd", "-f", "-p", "127.0.0.1:" .. hp, "-h", dir .. "/www" })
    spawn("/usr/bin/python3", { PEER, "stall", tostring(stall_port) })
    spawn("/usr/bin/python3", { PEER, "cut", tostring(cut_port), "300000" })
    wait_port(hp)
    wait_port(stall_port)
    wait_port(cut_port)
    local hosts = dir .. "/hosts"
    local f = assert(io.open(hosts, "w"))
    f:write("127.0.0.1 bulk.test stall.test cut.test\n")
    f:close()
    local env = {}
    local pe = io.popen("env")
    for line in pe:lines() do if line:find("=", 1, true) then env[#env + 1] = line end end
    pe:close()
    env[#env + 1] = "TUPPER_NET_HOSTS=" .. hosts
    d = h.start_daemon(dir .. "/d", { env = env })
    c = d.connect()
    local r, err = h.call(c, "sandbox.create", { network = { allow = { "bulk.test", "stall.test", "cut.test",
      "127.0.0.1/32" } } })
    assert(r, err and err.message)
    sb = r.id
  end)

  teardown(function()
    if c then
      h.call(c, "sandbox.kill", { id = sb })
      c:close()
    end
    if d then d.stop() end
    for _, hd in ipairs(servers or {}) do
      uv.process_kill(hd, "sigterm")
      hd:close()
    end
    h.drain()
    h.rmrf(dir)
  end)

  it("relays 32 MiB byte-exact through the HTTP proxy and through SOCKS5", function()
    local r = run("wget -q -O- http://bulk.test:" .. hp .. "/big | sha256sum")
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal(big_sha, r.stdout:match("^(%x+)"))
    local code, out = in_netns("python3 " .. PEER .. " socks-get http://bulk.test:" .. hp .. "/big")
    assert.equal(0, code, out)
    assert.equal(big_sha .. " " .. BIG .. "\n", out)
    -- and the bytes went through C, not the Lua fallback (which says so)
    assert.is_nil(h.read_file(d.log):find("relaying in Lua", 1, true))
  end)

  it("takes the box's socket from the agent: the daemon holds it, the agent no longer", function()
    -- a download whose reader takes 4 MiB (more than a window: the relay
    -- asks for the box's socket) and then waits: meanwhile the box's end
    -- of it (found by its inode in the box's namespace) is one of the
    -- daemon's descriptors and none of the agent's (NET_GIVE,
    -- docs/network.md)
    local rec = json.decode(assert(h.read_file(d.state .. "/boxes/" .. sb .. ".json")))
    local script = ([[
go=%s/give.go
curl -s -x http://127.0.0.1:3128 http://bulk.test:%d/big |
  (head -c 4194304 > /dev/null; while [ ! -e $go ]; do sleep 0.05; done; wc -c) &
i=0; ino=; dn=0
while [ $i -lt 200 ]; do
  ino=$(ss -tnHe state established '( sport = :3128 )' | grep -o 'ino:[0-9]*' | head -n 1 | cut -d: -f2)
  if [ -n "$ino" ]; then dn=$(ls -l /proc/%d/fd | grep -c "socket:\[$ino\]"); fi
  if [ "$dn" = 1 ]; then break; fi
  sleep 0.05; i=$((i + 1))
done
echo "daemon $dn agent $(ls -l /proc/%d/fd | grep -c "socket:\[$ino\]")"
touch $go
wait]]):format(dir, hp, d.pid, math.tointeger(rec.pid))
    local f = assert(io.open(dir .. "/give.sh", "w"))
    f:write(script)
    f:close()
    local code, out = in_netns("sh " .. dir .. "/give.sh")
    assert.equal(0, code, out)
    assert.matches("daemon 1 agent 0\n%s*" .. (BIG - 4194304) .. "\n", out)
  end)

  it("blocks the box's writer when the upstream stops reading, the daemon's memory bounded", function()
    local fds, rss = daemon_fds(), daemon_rss_kib()
    local code, out = in_netns("python3 " .. PEER .. " socks-push stall.test " .. stall_port .. " 2")
    assert.equal(0, code, out)
    local sent, idle = out:match("^(%d+) ([%d.]+)")
    sent, idle = tonumber(sent), tonumber(idle)
    -- the writer blocked: for its last half second nothing more was taken
    assert.is_true(idle >= 0.5, out)
    -- what it got rid of sits in socket buffers and two windows, not in the daemon
    assert.is_true(sent < 64 * 1024 * 1024, out)
    assert.is_true(daemon_rss_kib() - rss < 16 * 1024, "daemon RSS grew by "
      .. (daemon_rss_kib() - rss) .. " KiB")
    -- the box's writer is gone, but a full window of its bytes waits (in
    -- the daemon, which took the box's socket; in the agent, where it
    -- could not), so the stream waits for the upstream: when that goes away
    -- (closing with unread bytes: a reset), the stream ends and its socket
    -- with it
    uv.process_kill(servers[2], "sigterm")
    assert.is_true(fds_back_to(fds))
  end)

  it("ends cleanly when the upstream closes mid-stream or the box does, others unharmed", function()
    local fds = daemon_fds()
    -- the upstream promises 600000 bytes, sends 300000 and closes: the box
    -- gets exactly those, then the end
    local r = run("wget -q -O /tmp/cut http://cut.test:" .. cut_port .. "/x; wc -c < /tmp/cut")
    assert.matches("^%s*300000\n", r.stdout)
    -- a box reader that quits early while another download runs beside it
    r = run(("(wget -q -O- http://bulk.test:%d/big | sha256sum > /tmp/whole) & " ..
             "wget -q -O- http://bulk.test:%d/big | head -c 100000 | wc -c; wait; cat /tmp/whole"):format(hp, hp))
    assert.matches("^%s*100000\n", r.stdout)
    assert.equal(big_sha, r.stdout:match("\n(%x+)"))
    assert.is_true(fds_back_to(fds))
    -- and the relay still serves new connections
    r = run("wget -q -O- http://bulk.test:" .. hp .. "/big | wc -c")
    assert.matches("^%s*" .. BIG .. "\n", r.stdout)
  end)
end)
