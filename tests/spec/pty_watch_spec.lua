-- Integration specs for terminals (pty.*), watching (fs.watch), reattaching
-- to a process (process.connect) and running as an account of the box
-- (user): a real daemon, real sandboxes, hostile params refused.
local async = require("tupper.util.async")
local helper = require("helper")

local sync = helper.sync

-- Collects the fs.event lines ("<watch> <type> <name>") of sandbox id on
-- client c; returns seen(line), true once that line arrived (10 s at most),
-- and the list of lines so far.
local function watch_events_of(c, id)
  local events, waiter = {}, nil
  c:on("fs.event", function(p)
    if p.sandbox ~= id then return end
    events[#events + 1] = p.watch .. " " .. p.type .. " " .. p.name
    if waiter then local w = waiter; waiter = nil; w() end
  end)
  return function(line)
    return sync(function()
      local deadline = os.time() + 10
      while os.time() < deadline do
        for _, e in ipairs(events) do if e == line then return true end end
        local timer = require("luv").new_timer()
        async.wait(function(cb) waiter = cb; timer:start(200, 0, cb) end)
        timer:close()
      end
      return false
    end)
  end, events
end

describe("terminals, watches and reattaching", function()
  local d, c, id

  setup(function()
    d = helper.start_daemon()
    c = assert(d.connect())
    id = assert(helper.call(c, "sandbox.create", {})).id
  end)

  teardown(function()
    if id then helper.call(c, "sandbox.kill", { id = id }) end
    if c then c:close() end
    sync(function() async.sleep(1) end)
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  local function call(method, params) return helper.call(c, method, params) end

  -- Collects the output and exit of pid on connection conn.
  local function collect(conn)
    local t = { out = {}, exits = {}, waiters = {} }
    local function wake() local w = t.waiters; t.waiters = {}; for _, f in ipairs(w) do f() end end
    conn:on("process.output", function(p)
      if p.sandbox ~= id then return end
      local data = p.encoding == "utf8" and p.data or helper.b64decode(p.data)
      t.out[p.pid] = (t.out[p.pid] or "") .. data
      wake()
    end)
    conn:on("process.exit", function(p)
      if p.sandbox == id then t.exits[p.pid] = p; wake() end
    end)
    -- waits until pred() is true (at most 10 s)
    function t.until_(pred)
      return sync(function()
        local deadline = os.time() + 10
        while not pred() and os.time() < deadline do
          local timer = require("luv").new_timer()
          async.wait(function(cb)
            t.waiters[#t.waiters + 1] = cb
            timer:start(200, 0, cb)
          end)
          timer:close()
        end
        return pred()
      end)
    end
    return t
  end

  it("runs a shell on a terminal: echo, input, resize, exit", function()
    local t = collect(c)
    local r = assert(call("pty.create", { sandbox = id, cols = 100, rows = 30,
                                          argv = { "/bin/sh" }, env = { PS1 = "$ " } }))
    local pid = r.pid
    assert(call("process.stdin", { sandbox = id, pid = pid, data = "stty size; tty\n", encoding = "utf8" }))
    assert.is_true(t.until_(function() return (t.out[pid] or ""):find("30 100", 1, true) ~= nil end))
    assert.is_true(t.until_(function() return t.out[pid]:find("/dev/pts/", 1, true) ~= nil end))
    assert(call("pty.resize", { sandbox = id, pid = pid, cols = 132, rows = 43 }))
    assert(call("process.stdin", { sandbox = id, pid = pid, data = "stty size; exit 7\n", encoding = "utf8" }))
    assert.is_true(t.until_(function() return t.exits[pid] ~= nil end))
    assert.truthy(t.out[pid]:find("43 132", 1, true))
    assert.are.equal(7, t.exits[pid].exit_code)
  end)

  it("refuses hostile terminal params", function()
    for _, p in ipairs({ { cols = 0, rows = 24 }, { cols = 80, rows = 4097 }, { cols = 80 },
                         { cols = 1.5, rows = 2 }, { cols = "80", rows = 24 }, { cols = -1, rows = 24 } }) do
      p.sandbox = id
      local _, err = call("pty.create", p)
      assert.are.equal(-32602, err.code)
    end
    local plain = assert(call("process.start", { sandbox = id, cmd = "sleep 100" }))
    local _, err = call("pty.resize", { sandbox = id, pid = plain.pid, cols = 80, rows = 24 })
    assert.are.equal(-32003, err.code)
    assert.are.equal("ENOTTY", err.data.code)
    _, err = call("pty.resize", { sandbox = id, pid = plain.pid, cols = 80, rows = 0 })
    assert.are.equal(-32602, err.code)
    _, err = call("pty.resize", { sandbox = id, pid = 4000000, cols = 80, rows = 24 })
    assert.are.equal(-32000, err.code)
    assert(call("process.signal", { sandbox = id, pid = plain.pid }))
  end)

  it("streams watch events of a nested tree, and stops them with fs.unwatch", function()
    local seen = watch_events_of(c, id)
    assert(call("fs.mkdir", { sandbox = id, path = "/tmp/w/a", parents = true }))
    local w = assert(call("fs.watch", { sandbox = id, path = "/tmp/w", recursive = true })).watch
    local function sh(cmd)
      local r = sync(function() return helper.run(c, id, cmd, { cwd = "/tmp/w" }) end)
      assert.are.equal(0, r.exit_code, r.stderr)
    end
    sh("mkdir -p a/b/c")
    assert.is_true(seen(w .. " create a/b"))
    assert.is_true(seen(w .. " create a/b/c"))
    sh("echo hi > a/b/c/f")
    assert.is_true(seen(w .. " write a/b/c/f"))
    sh("mv a/b/c/f a/b/c/g")
    assert.is_true(seen(w .. " rename a/b/c/f"))
    assert.is_true(seen(w .. " create a/b/c/g"))
    sh("rm a/b/c/g")
    assert.is_true(seen(w .. " remove a/b/c/g"))
    assert(call("fs.unwatch", { sandbox = id, watch = w }))
    local _, err = call("fs.unwatch", { sandbox = id, watch = w })
    assert.are.equal(-32000, err.code)
    -- another connection cannot stop this one's watch
    local w2 = assert(call("fs.watch", { sandbox = id, path = "/tmp/w" })).watch
    local c2 = assert(d.connect())
    _, err = helper.call(c2, "fs.unwatch", { sandbox = id, watch = w2 })
    assert.are.equal(-32000, err.code)
    c2:close()
    -- the end of the directory ends the watch
    sh("rm -r /tmp/w")
    assert.is_true(seen(w2 .. " end "))
  end)

  it("refuses hostile watch params", function()
    local _, err = call("fs.watch", { sandbox = id, path = "/nonexistent" })
    assert.are.equal(-32002, err.code)
    assert.are.equal("ENOENT", err.data.code)
    _, err = call("fs.watch", { sandbox = id, path = "/etc/passwd" })
    assert.are.equal("ENOTDIR", err.data.code)
    _, err = call("fs.watch", { sandbox = id, path = "/", recursive = "yes" })
    assert.are.equal(-32602, err.code)
    _, err = call("fs.watch", { sandbox = id, path = string.rep("a", 5000) })
    assert.are.equal(-32602, err.code)
    _, err = call("fs.unwatch", { sandbox = id, watch = 0 })
    assert.are.equal(-32602, err.code)
    -- a recursive watch of the whole box hits the directory cap or works; either way it answers
    local r, e = call("fs.watch", { sandbox = id, path = "/", recursive = true })
    if r then assert(call("fs.unwatch", { sandbox = id, watch = r.watch }))
    else assert.are.equal(-32002, e.code) end
  end)

  it("watches as an account of the box, from its home", function()
    local seen, events = watch_events_of(c, id)
    local function sh(cmd, user)
      local r = sync(function() return helper.run(c, id, cmd, { user = user }) end)
      assert.are.equal(0, r.exit_code, r.stderr)
    end
    assert(call("fs.mkdir", { sandbox = id, user = "user", path = "wu" }))
    local w = assert(call("fs.watch", { sandbox = id, user = "user", path = "./wu", recursive = true })).watch
    sh("mkdir -p wu/a && echo x > wu/a/f", "user")
    assert.is_true(seen(w .. " create a/f"))
    -- a directory the account cannot read is not walked: an overflow event
    -- says so, and nothing inside it is ever reported
    -- (root's, through the API: a box's own root has no capabilities)
    assert(call("fs.mkdir", { sandbox = id, path = "/home/user/wu/hidden", mode = 448 }))
    assert(call("fs.write", { sandbox = id, path = "/home/user/wu/hidden/f", data = "s", encoding = "utf8" }))
    assert(call("fs.mkdir", { sandbox = id, path = "/home/user/wu/open" }))
    assert(call("fs.write", { sandbox = id, path = "/home/user/wu/open/f", data = "o", encoding = "utf8" }))
    assert.is_true(seen(w .. " overflow hidden"))
    assert.is_true(seen(w .. " create open/f"))
    for _, e in ipairs(events) do assert.are_not.equal(w .. " create hidden/f", e) end
    assert(call("fs.unwatch", { sandbox = id, watch = w }))
    local _, err = call("fs.watch", { sandbox = id, user = "user", path = "/root" })
    assert.are.equal(-32002, err.code)
    assert.are.equal("EACCES", err.data.code)
    _, err = call("fs.watch", { sandbox = id, user = "ghost", path = "/tmp" })
    assert.are.equal(-32002, err.code)
    assert.are.equal("ENOENT", err.data.code)
    -- the account a handler acts as comes from the daemon's lookup only
    _, err = call("fs.write", { sandbox = id, path = "/etc/x", data = "x", encoding = "utf8",
                                _account = { uid = 0, gid = 0, home = "/" } })
    assert.are.equal(-32602, err.code)
    _, err = call("fs.write", { sandbox = id, path = "/etc/x", data = "x", encoding = "utf8", user = "user" })
    assert.are.equal("EACCES", err.data.code)
    assert(call("fs.remove", { sandbox = id, path = "/home/user/wu", recursive = true }))
  end)

  it("drops the watches of a connection that goes away", function()
    -- c2 takes every watch the agent allows; once it is gone, they are free again
    local c2 = assert(d.connect())
    local n, err = 0, nil
    repeat
      local r
      r, err = helper.call(c2, "fs.watch", { sandbox = id, path = "/tmp" })
      if r then n = n + 1 end
    until not r or n > 200
    assert.are.equal("EMFILE", err and err.data and err.data.code)
    local _, e2 = call("fs.watch", { sandbox = id, path = "/tmp" })
    assert.are.equal("EMFILE", e2.data.code)
    c2:close()
    local w = sync(function()
      local r = helper.poll(function() return (c:call("fs.watch", { sandbox = id, path = "/tmp" })) end)
      return r and r.watch
    end)
    assert.truthy(w)
    assert(call("fs.unwatch", { sandbox = id, watch = w }))
  end)

  it("reattaches a second connection to a running process, with its recent output", function()
    local t = collect(c)
    local r = assert(call("process.start", { sandbox = id, cmd = "echo first; read x; echo second $x",
                                             stdin = true, encoding = "utf8" }))
    assert.is_true(t.until_(function() return (t.out[r.pid] or ""):find("first", 1, true) ~= nil end))
    local c2 = assert(d.connect())
    local t2 = collect(c2)
    local att = assert(helper.call(c2, "process.connect", { sandbox = id, pid = r.pid, encoding = "utf8" }))
    assert.are.equal(r.pid, att.pid)
    assert.are.equal("first\n", att.output[1].data)
    assert.are.equal("stdout", att.output[1].stream)
    assert.are.equal(0, att.dropped)
    assert(helper.call(c2, "process.stdin", { sandbox = id, pid = r.pid, data = "again\n", encoding = "utf8" }))
    assert.is_true(t2.until_(function() return t2.exits[r.pid] ~= nil end))
    assert.are.equal("second again\n", t2.out[r.pid])
    assert.is_true(t.until_(function() return t.exits[r.pid] ~= nil end))
    c2:close()
    local _, err = call("process.connect", { sandbox = id, pid = r.pid })
    assert.are.equal(-32000, err.code)
  end)

  it("keeps the box's last 16 exited processes for process.connect and process.list (exited = true)", function()
    local first = sync(function() return helper.run(c, id, "echo out-0; echo err-0 >&2; exit 3") end)
    assert.are.equal(3, first.exit_code)
    -- without the flag an exited process is gone, as before (the SDKs' calls)
    local _, err = call("process.connect", { sandbox = id, pid = first.pid })
    assert.are.equal(-32000, err.code)
    local l = assert(call("process.list", { sandbox = id }))
    for _, p in ipairs(l.processes) do assert.are_not.equal(first.pid, p.pid) end
    local att = assert(call("process.connect", { sandbox = id, pid = first.pid, exited = true, encoding = "utf8" }))
    assert.are.equal(first.pid, att.pid)
    local text = {}
    for _, o in ipairs(att.output) do text[#text + 1] = o.stream .. ":" .. o.data end
    table.sort(text)
    assert.are.same({ "stderr:err-0\n", "stdout:out-0\n" }, text)
    assert.are.equal(3, att.exit.exit_code)
    assert.are.equal(0, att.exit.signal)
    assert.truthy(tostring(att.exit.ended_at):match("^%d%d%d%d%-%d%d%-%d%dT"))
    l = assert(call("process.list", { sandbox = id, exited = true }))
    local found
    for _, p in ipairs(l.processes) do if p.pid == first.pid then found = p end end
    assert.truthy(found, "the exited process is not listed")
    assert.are.equal(3, found.exit.exit_code)
    assert.are.equal("/bin/sh", found.argv[1])
    -- a killed one says its signal
    local r = assert(call("process.start", { sandbox = id, cmd = "sleep 100" }))
    assert(call("process.signal", { sandbox = id, pid = r.pid }))
    att = sync(function()
      return helper.poll(function()
        local a = c:call("process.connect", { sandbox = id, pid = r.pid, exited = true })
        return a and a.exit and a
      end)
    end)
    assert.are.equal(9, att.exit.signal)
    -- 16 more: the first is no longer kept, the last 16 are
    local pids = {}
    for i = 1, 16 do
      pids[i] = sync(function() return helper.run(c, id, "echo n" .. i) end).pid
    end
    _, err = call("process.connect", { sandbox = id, pid = first.pid, exited = true })
    assert.are.equal(-32000, err.code)
    l = assert(call("process.list", { sandbox = id, exited = true }))
    local exited = {}
    for _, p in ipairs(l.processes) do if p.exit then exited[#exited + 1] = p.pid end end
    assert.are.same(pids, exited)
    att = assert(call("process.connect", { sandbox = id, pid = pids[16], exited = true, encoding = "utf8" }))
    assert.are.equal("n16\n", att.output[1].data)
    _, err = call("process.list", { sandbox = id, exited = "yes" })
    assert.are.equal(-32602, err.code)
  end)

  it("keeps only the last 64 KiB of a process's output for a late connection", function()
    local t = collect(c)
    local r = assert(call("process.start", { sandbox = id, cmd = "head -c 200000 /dev/zero | tr '\\0' x; echo; echo END; sleep 100" }))
    assert.is_true(t.until_(function() return (t.out[r.pid] or ""):find("END", 1, true) ~= nil end))
    local att = assert(call("process.connect", { sandbox = id, pid = r.pid }))
    local total = 0
    for _, o in ipairs(att.output) do total = total + #helper.b64decode(o.data) end
    assert.are.equal(65536, total)
    assert.are.equal(200001 + 4 - 65536, att.dropped)
    assert.truthy(helper.b64decode(att.output[#att.output].data):find("END\n$"))
    assert(call("process.signal", { sandbox = id, pid = r.pid }))
  end)

  it("runs a command as an account of the box, in its home", function()
    local r = sync(function() return helper.run(c, id, "id -u; id -g; pwd; echo $HOME $USER", { user = "user" }) end)
    assert.are.equal("1000\n1000\n/home/user\n/home/user user\n", r.stdout)
    -- process.list has the account and where it started (the home, from
    -- the agent's reply when the agent looked the account up)
    local p1 = assert(call("process.start", { sandbox = id, cmd = "sleep 30", user = "user" })).pid
    local p2 = assert(call("process.start", { sandbox = id, cmd = "sleep 30", user = "user", cwd = "/tmp" })).pid
    local seen = {}
    for _, e in ipairs(assert(call("process.list", { sandbox = id })).processes) do seen[e.pid] = e end
    assert.are.same({ "user", "/home/user" }, { seen[p1].user, seen[p1].cwd })
    assert.are.same({ "user", "/tmp" }, { seen[p2].user, seen[p2].cwd })
    assert(call("process.signal", { sandbox = id, pid = p1, signal = 9 }))
    assert(call("process.signal", { sandbox = id, pid = p2, signal = 9 }))
    local _, err = call("process.start", { sandbox = id, cmd = "true", user = "nosuch" })
    assert.are.equal(-32003, err.code)
    assert.are.equal("ENOENT", err.data.code)
    _, err = call("process.start", { sandbox = id, cmd = "true", user = "bad name" })
    assert.are.equal(-32602, err.code)
    _, err = call("process.start", { sandbox = id, cmd = "true", user = string.rep("u", 33) })
    assert.are.equal(-32602, err.code)
    -- an account with ids the box cannot map is refused, not clamped
    assert(call("fs.write", { sandbox = id, path = "/etc/passwd", append = true,
                              data = "big:x:70000:70000::/:/bin/sh\n", encoding = "utf8" }))
    _, err = call("process.start", { sandbox = id, cmd = "true", user = "big" })
    assert.are.equal(-32003, err.code)
  end)
end)
