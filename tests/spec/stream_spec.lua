-- The data plane end to end (docs/protocol.md, "Stream frames"): a real
-- daemon, a real box, file bytes in and out on a data connection, and the
-- bad inputs each answered without harm to anyone else.
local uv = require("luv")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local helper = require("helper")
local stream = require("tupper.wire.stream")

local T = stream.TYPES

-- A raw socket to the daemon, driven synchronously by the spec.
local function raw_connect(socket)
  local pipe = uv.new_pipe(false)
  local err = helper.sync(function() return async.wait(function(cb) pipe:connect(socket, function(e) cb(e) end) end) end)
  assert(not err, err)
  local r = { pipe = pipe, buf = "", eof = false }
  pipe:read_start(function(e, chunk)
    if e or not chunk then r.eof = true else r.buf = r.buf .. chunk end
  end)
  return r
end

-- Waits (up to 5 s) until cond(r) holds.
local function wait_for(r, cond)
  return helper.sync(function()
    local deadline = helper.now() + 5000
    while not cond(r) and helper.now() < deadline do async.sleep(5) end
    return cond(r)
  end)
end

local function raw_line(r)
  wait_for(r, function(x) return x.buf:find("\n", 1, true) or x.eof end)
  local nl = r.buf:find("\n", 1, true)
  if not nl then return nil end
  local line = r.buf:sub(1, nl - 1)
  r.buf = r.buf:sub(nl + 1)
  return json.decode(line)
end

local function raw_frame(r)
  wait_for(r, function(x)
    if x.eof then return true end
    if #x.buf < 12 then return false end
    return #x.buf >= 12 + string.unpack("<I4", x.buf)
  end)
  if #r.buf < 12 then return nil end
  local len, _, type_, _, sid = string.unpack("<I4BBI2I4", r.buf)
  if #r.buf < 12 + len then return nil end
  local payload = r.buf:sub(13, 12 + len)
  r.buf = r.buf:sub(13 + len)
  return { type = type_, sid = sid, payload = payload }
end

local function raw_close(r) if not r.pipe:is_closing() then r.pipe:close() end end

-- Attaches a raw data connection for client c.
local function raw_attach(d, c, window)
  local tok = assert(helper.call(c, "stream.channel", {}))
  local r = raw_connect(d.socket)
  r.pipe:write(json.encode({ jsonrpc = "2.0", id = 7, method = "stream.attach",
    params = { token = tok.token, window = window } }) .. "\n")
  local reply = raw_line(r)
  return r, reply
end

describe("the data plane", function()
  local d, c, box

  setup(function()
    d = helper.start_daemon()
    c = d.connect()
    box = assert(helper.call(c, "sandbox.create", {})).id
  end)

  teardown(function()
    if c then pcall(function() helper.call(c, "sandbox.kill", { id = box }) end); c:close() end
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  it("hello says which version of the frames the daemon speaks", function()
    assert.are.equal(1, c.server.streams)
  end)

  it("writes and reads back 24 MiB byte for byte, and an empty file", function()
    local parts = {}
    for i = 1, 24 do parts[i] = string.rep(string.char(i % 256, (i * 7) % 256, 0, 255), 262144) end
    local want = table.concat(parts)
    local dc = assert(helper.sync(stream.open, c))
    local i = 0
    local n, err = helper.sync(function()
      return dc:write_file(c, { sandbox = box, path = "/tmp/big" }, function()
        i = i + 1
        return parts[i]
      end)
    end)
    assert.is_nil(err)
    assert.are.equal(#want, n)
    local st = assert(helper.call(c, "fs.stat", { sandbox = box, path = "/tmp/big" }))
    assert.are.equal(#want, st.size)
    local got = {}
    local rn, rerr, size = helper.sync(function()
      return dc:read_file(c, { sandbox = box, path = "/tmp/big" }, function(chunk)
        got[#got + 1] = chunk
        return true
      end)
    end)
    assert.is_nil(rerr)
    assert.are.equal(#want, rn)
    assert.are.equal(#want, size)
    assert.is_true(table.concat(got) == want, "the bytes read back differ")
    -- a range
    got = {}
    rn = helper.sync(function()
      return dc:read_file(c, { sandbox = box, path = "/tmp/big", offset = 1048575, length = 3 },
        function(chunk) got[#got + 1] = chunk; return true end)
    end)
    assert.are.equal(3, rn)
    assert.are.equal(want:sub(1048576, 1048578), table.concat(got))
    -- empty: created, then truncated to nothing
    n = helper.sync(function() return dc:write_file(c, { sandbox = box, path = "/tmp/big" }, function() end) end)
    assert.are.equal(0, n)
    assert.are.equal(0, assert(helper.call(c, "fs.stat", { sandbox = box, path = "/tmp/big" })).size)
    dc:close()
  end)

  it("reads three streams and writes one at once on one connection, one reader slow, every byte in place", function()
    local a = {}
    for i = 1, 6 do a[i] = string.rep(string.char(i, 255 - i, 7, i * 3 % 256), 262144 + 3) end
    local wa = table.concat(a)
    local wb = string.rep("0123456789abcdef", 65536 * 3 + 5) -- 3 MiB and a bit
    local dc = assert(helper.sync(stream.open, c))
    for _, f in ipairs({ { "/tmp/cc_a", wa }, { "/tmp/cc_b", wb } }) do
      local once = false
      local n = helper.sync(function()
        return dc:write_file(c, { sandbox = box, path = f[1] }, function()
          if once then return nil end
          once = true
          return f[2]
        end)
      end)
      assert.are.equal(#f[2], n)
    end
    local got_a, got_b, got_b2 = {}, {}, {}
    local ra, rb, rb2, wc
    local i = 0
    helper.sync(function()
      async.all({
        function()
          -- a slow reader: the socket fills, and the others' frames wait their turn behind its
          ra = { dc:read_file(c, { sandbox = box, path = "/tmp/cc_a", offset = 5 }, function(chunk)
            got_a[#got_a + 1] = chunk
            async.sleep(3)
            return true
          end) }
        end,
        function()
          rb = { dc:read_file(c, { sandbox = box, path = "/tmp/cc_b" }, function(chunk)
            got_b[#got_b + 1] = chunk
            return true
          end) }
        end,
        function()
          rb2 = { dc:read_file(c, { sandbox = box, path = "/tmp/cc_b", offset = 3 }, function(chunk)
            got_b2[#got_b2 + 1] = chunk
            return true
          end) }
        end,
        function()
          wc = { dc:write_file(c, { sandbox = box, path = "/tmp/cc_c" }, function()
            i = i + 1
            return a[i]
          end) }
        end,
      })
    end)
    assert.is_nil(ra[2])
    assert.is_nil(rb[2])
    assert.is_nil(wc[2])
    assert.are.equal(#wa - 5, ra[1])
    assert.is_true(table.concat(got_a) == wa:sub(6), "the first file's bytes differ (from offset 5)")
    assert.is_true(table.concat(got_b) == wb, "the second file's bytes differ")
    assert.is_nil(rb2[2])
    assert.is_true(table.concat(got_b2) == wb:sub(4), "the second file's bytes differ (from offset 3)")
    assert.are.equal(#wa, wc[1])
    local back = {}
    helper.sync(function()
      return dc:read_file(c, { sandbox = box, path = "/tmp/cc_c" }, function(chunk)
        back[#back + 1] = chunk
        return true
      end)
    end)
    assert.is_true(table.concat(back) == wa, "the file written alongside differs")
    dc:close()
  end)

  it("writes frames of every size in order: small ones gathered, large ones as they come", function()
    -- sizes around the daemon's 256 KiB cut (tp__sfs_on_data) and its 1 MiB piece
    local sizes = { 1, 262143, 262144, 5, 1048576, 100000, 300000, 1048575, 2, 700000 }
    local parts = {}
    for i, n in ipairs(sizes) do parts[i] = string.rep(string.char(i, 255 - i, i * 3 % 256), n // 3 + 1):sub(1, n) end
    local want = table.concat(parts)
    local dc = assert(helper.sync(stream.open, c))
    local n, err = helper.sync(function()
      local w = assert(dc:writer(c, { sandbox = box, path = "/tmp/mixed" }))
      for _, part in ipairs(parts) do assert(w:write(part)) end
      return w:finish()
    end)
    assert.is_nil(err)
    assert.are.equal(#want, n)
    local got = {}
    helper.sync(function()
      return dc:read_file(c, { sandbox = box, path = "/tmp/mixed" }, function(chunk) got[#got + 1] = chunk; return true end)
    end)
    assert.is_true(table.concat(got) == want, "the bytes read back differ")
    dc:close()
  end)

  it("answers a missing file and a refused write with the file's errno", function()
    local dc = assert(helper.sync(stream.open, c))
    local n, err = helper.sync(function()
      return dc:read_file(c, { sandbox = box, path = "/nope" }, function() return true end)
    end)
    assert.is_nil(n)
    assert.are.equal(-32002, err.code)
    n, err = helper.sync(function()
      local sent = false
      return dc:write_file(c, { sandbox = box, path = "/proc/version" }, function()
        if sent then return nil end
        sent = true
        return "x"
      end)
    end)
    assert.is_nil(n)
    assert.truthy(err.message ~= nil)
    dc:close()
  end)

  it("refuses streams without a data connection, and a bad or used token", function()
    local c2 = d.connect()
    local r, err = helper.call(c2, "fs.read_stream", { sandbox = box, path = "/etc/passwd" })
    assert.is_nil(r)
    assert.truthy(err.message:find("no data connection", 1, true))
    local raw = raw_connect(d.socket)
    raw.pipe:write(json.encode({ jsonrpc = "2.0", id = 1, method = "stream.attach",
      params = { token = string.rep("0", 32) } }) .. "\n")
    local reply = raw_line(raw)
    assert.are.equal(-32602, reply.error.code)
    raw_close(raw)
    local tok = assert(helper.call(c2, "stream.channel", {}))
    local a = raw_connect(d.socket)
    a.pipe:write(json.encode({ jsonrpc = "2.0", id = 1, method = "stream.attach", params = { token = tok.token } }) .. "\n")
    assert.are.equal(1, raw_line(a).result.protocol)
    local b = raw_connect(d.socket)
    b.pipe:write(json.encode({ jsonrpc = "2.0", id = 1, method = "stream.attach", params = { token = tok.token } }) .. "\n")
    assert.are.equal(-32602, raw_line(b).error.code, "a token is single use")
    -- one data connection a control connection: a second attach is refused
    local tok2 = assert(helper.call(c2, "stream.channel", {}))
    local b2 = raw_connect(d.socket)
    b2.pipe:write(json.encode({ jsonrpc = "2.0", id = 1, method = "stream.attach", params = { token = tok2.token } }) .. "\n")
    local second = raw_line(b2)
    assert.are.equal(-32600, second.error.code)
    assert.truthy(second.error.message:find("has a data connection already", 1, true))
    raw_close(b2)
    raw_close(a)
    raw_close(b)
    -- unused tokens are capped per connection
    local busy
    for _ = 1, 17 do
      local t, terr = helper.call(c2, "stream.channel", {})
      if not t then busy = terr; break end
    end
    assert.truthy(busy, "the 17th unused token is refused")
    assert.are.equal(-32004, busy.code)
    c2:close()
  end)

  it("closes a data connection that sends a wrong length, after saying why; nothing else is hurt", function()
    local c2 = d.connect()
    local r, reply = raw_attach(d, c2)
    assert.are.equal(7, reply.id)
    r.pipe:write(string.pack("<I4BBI2I4", 1048577, 1, T.DATA, 0, 1))
    local f = raw_frame(r)
    assert.are.equal(T.ERROR, f.type)
    assert.are.equal(0, f.sid)
    assert.are.equal(71, string.unpack("<I4", f.payload)) -- EPROTO
    assert.truthy(f.payload:find("over 1048576", 1, true))
    assert.is_true(wait_for(r, function(x) return x.eof end), "the daemon closed it")
    raw_close(r)
    -- the control connection and the other client go on
    assert.truthy(helper.call(c2, "fs.stat", { sandbox = box, path = "/" }))
    assert.truthy(helper.call(c, "fs.stat", { sandbox = box, path = "/" }))
    c2:close()
  end)

  it("answers an unknown id and another client's stream with ENOENT", function()
    -- client A's write stream, left open
    local ra = raw_attach(d, c)
    local w = assert(helper.call(c, "fs.write_stream", { sandbox = box, path = "/tmp/a" }))
    local open = raw_frame(ra)
    assert.are.equal(T.OPEN, open.type)
    assert.are.equal(w.stream, open.sid)
    -- client B writes on A's stream id on its own data connection
    local c2 = d.connect()
    local rb = raw_attach(d, c2)
    rb.pipe:write(stream.frame(T.DATA, w.stream, "intruder"))
    local f = raw_frame(rb)
    assert.are.equal(T.ERROR, f.type)
    assert.are.equal(w.stream, f.sid)
    assert.are.equal(2, string.unpack("<I4", f.payload))
    assert.truthy(f.payload:find("no such stream", 1, true))
    -- A's stream is untouched: its bytes land, END gives the size
    ra.pipe:write(stream.frame(T.DATA, w.stream, "mine") .. stream.frame(T.END, w.stream))
    local e = raw_frame(ra)
    assert.are.equal(T.END, e.type)
    assert.are.equal(4, string.unpack("<I8", e.payload))
    local rd = assert(helper.call(c, "fs.read", { sandbox = box, path = "/tmp/a", encoding = "utf8" }))
    assert.are.equal("mine", rd.data)
    raw_close(ra)
    raw_close(rb)
    c2:close()
  end)

  it("survives a half-written frame and a disconnect, and keeps no stream of it (small and large frames)", function()
    local function nfds()
      local n, h = 0, uv.fs_scandir("/proc/" .. d.pid .. "/fd")
      while h and uv.fs_scandir_next(h) do n = n + 1 end
      return n
    end
    -- the connections the last test closed may not have reached the
    -- daemon's loop yet: count once the daemon's fds stay put for 100 ms
    local fds_before = nfds()
    helper.sync(function()
      local deadline = helper.now() + 3000
      repeat
        async.sleep(100)
        local n = nfds()
        local settled = n == fds_before
        fds_before = n
      until settled or helper.now() > deadline
    end)
    local c2 = d.connect()
    -- a small frame cut short, and a large one (its payload read straight
    -- into the write's batch in a linux box) cut short in its payload
    for _, cut in ipairs({ { 1000, 10 }, { 524288, 102400 } }) do
      local r = raw_attach(d, c2)
      local w = assert(helper.call(c2, "fs.write_stream", { sandbox = box, path = "/tmp/half" }))
      raw_frame(r) -- OPEN
      r.pipe:write(string.pack("<I4BBI2I4", cut[1], 1, T.DATA, 0, w.stream) .. string.rep("z", cut[2]))
      helper.sync(function() async.sleep(50) end)
      raw_close(r)
      helper.sync(function() async.sleep(100) end)
    end
    -- a new data connection of the same client works, the half frame wrote nothing
    local dc = assert(helper.sync(stream.open, c2))
    local st, serr = helper.call(c2, "fs.stat", { sandbox = box, path = "/tmp/half" })
    if st then -- a linux box's file is opened (created) with the stream: docs/protocol.md, fs.write_stream
      assert.are.equal(0, st.size, "nothing of the half frame was written")
    else
      assert.are.equal("ENOENT", serr.data.code, "nothing of the half frame was written")
    end
    local n = helper.sync(function()
      local once = false
      return dc:write_file(c2, { sandbox = box, path = "/tmp/half" }, function()
        if once then return nil end
        once = true
        return "ok"
      end)
    end)
    assert.are.equal(2, n)
    dc:close()
    c2:close()
    -- no descriptor of the box's file (a linux box's stream holds one) outlives its streams
    helper.sync(function()
      local deadline = helper.now() + 5000
      while nfds() ~= fds_before and helper.now() < deadline do async.sleep(20) end
    end)
    assert.are.equal(fds_before, nfds())
  end)

  it("holds a read stream to the window of a client that does not read", function()
    local c2 = d.connect()
    local r = raw_attach(d, c2, 65536)
    -- make a 4 MiB file with the JSON path, then read it with credit never given
    for i = 0, 3 do
      assert(helper.call(c2, "fs.write", { sandbox = box, path = "/tmp/four4", offset = i * 1048576,
        data = string.rep("q", 1048576), encoding = "utf8" }))
    end
    local rs = assert(helper.call(c2, "fs.read_stream", { sandbox = box, path = "/tmp/four4" }))
    assert.are.equal(4194304, rs.size)
    local got = 0
    wait_for(r, function(x)
      while true do
        if #x.buf < 12 then return false end
        local len, _, type_ = string.unpack("<I4BBI2I4", x.buf)
        if #x.buf < 12 + len then return false end
        if type_ == T.DATA then got = got + len end
        x.buf = x.buf:sub(13 + len)
      end
    end)
    assert.are.equal(65536, got, "no more than the window came")
    -- credit for it: exactly that much more comes
    r.pipe:write(stream.frame(T.CREDIT, rs.stream, string.pack("<I4", 65536)))
    wait_for(r, function(x)
      while #x.buf >= 12 do
        local len, _, type_ = string.unpack("<I4BBI2I4", x.buf)
        if #x.buf < 12 + len then return false end
        if type_ == T.DATA then got = got + len end
        x.buf = x.buf:sub(13 + len)
      end
      return got >= 131072
    end)
    helper.sync(function() async.sleep(100) end)
    assert.are.equal(131072, got)
    raw_close(r)
    c2:close()
  end)

  it("holds a connection to 256 open streams: the next is busy (-32004, EMFILE), and free again once one ends", function()
    local c2 = d.connect()
    local r, reply = raw_attach(d, c2, 65536)
    assert(reply and reply.result, json.encode(reply))
    assert(helper.call(c2, "fs.write", { sandbox = box, path = "/tmp/cap8k", data = string.rep("c", 131072),
      encoding = "utf8" }))
    -- the daemon's pipes: a read stream of a box's file splices through one
    -- of its own, 16 in the daemon at most (stream_fs.c: the kernel's
    -- per-user pipe pages are the whole host's root's)
    local function pipes()
      local n, h = 0, uv.fs_scandir("/proc/" .. d.pid .. "/fd")
      while h do
        local name = uv.fs_scandir_next(h)
        if not name then break end
        local l = uv.fs_readlink("/proc/" .. d.pid .. "/fd/" .. name)
        if l and l:sub(1, 5) == "pipe:" then n = n + 1 end
      end
      return n
    end
    local pipes_before = pipes()
    -- 256 reads of 128 KiB with a 64 KiB window: each stays open, waiting for credit
    local first
    for i = 1, 256 do
      local rs = assert(helper.call(c2, "fs.read_stream", { sandbox = box, path = "/tmp/cap8k" }))
      first = first or rs.stream
    end
    -- each pipe's two ends, and a frame in flight's dup of one
    local grew = pipes() - pipes_before
    assert.is_true(grew <= 3 * 16, "the daemon holds " .. grew .. " more pipe ends for 256 read streams")
    local _, err = helper.call(c2, "fs.read_stream", { sandbox = box, path = "/tmp/cap8k" })
    assert.are.equal(-32004, err and err.code, json.encode(err))
    assert.are.same({ "EMFILE", "streams", 256 }, { err.data.code, err.data.cap, err.data.value })
    _, err = helper.call(c2, "fs.write_stream", { sandbox = box, path = "/tmp/cap-w" })
    assert.are.equal(-32004, err and err.code, json.encode(err))
    -- the first stream read to its end (credit for the rest) frees a place
    r.pipe:write(stream.frame(T.CREDIT, first, string.pack("<I4", 65536)))
    local ok = helper.sync(function()
      local deadline = helper.now() + 5000
      while helper.now() < deadline do
        local rs = helper.call(c2, "fs.read_stream", { sandbox = box, path = "/tmp/cap8k" })
        if rs then return true end
        async.sleep(20)
      end
    end)
    assert.is_true(ok, "a place came free")
    raw_close(r)
    c2:close()
  end)

  it("gives a connection's write streams 64 MiB of windows in all: later ones get what is left, at least 64 KiB", function()
    local c2 = d.connect()
    local r, reply = raw_attach(d, c2, 65536)
    assert(reply and reply.result, json.encode(reply))
    local sids = {}
    for i = 1, 14 do
      local ws = assert(helper.call(c2, "fs.write_stream", { sandbox = box, path = "/tmp/budget" .. i }))
      sids[#sids + 1] = ws.stream
    end
    local wins = {}
    wait_for(r, function(x)
      while #x.buf >= 12 do
        local len, _, type_, _, sid = string.unpack("<I4BBI2I4", x.buf)
        if #x.buf < 12 + len then return false end
        if type_ == T.OPEN then wins[sid] = select(2, string.unpack("<I4I4", x.buf:sub(13, 12 + len))) end
        x.buf = x.buf:sub(13 + len)
      end
      for _, sid in ipairs(sids) do if not wins[sid] then return false end end
      return true
    end)
    local sum = 0
    for _, sid in ipairs(sids) do
      assert.truthy(wins[sid], "an OPEN for stream " .. sid)
      assert.truthy(wins[sid] >= 65536, wins[sid])
      sum = sum + wins[sid]
    end
    assert.truthy(sum <= 64 * 1048576 + 14 * 65536, sum)
    assert.are.equal(wins[sids[1]], 6 * 1048576, "the first gets the full window")
    assert.are.equal(65536, wins[sids[#sids]], "the last gets the least")
    raw_close(r)
    c2:close()
  end)

  -- ---- process streams (docs/protocol.md, "Process streams") ------------------

  -- Reads frames of r until cond(frames) holds or 5 s pass; returns the frames.
  local function frames_until(r, cond)
    local got = {}
    wait_for(r, function(x)
      while #x.buf >= 12 do
        local len, _, type_, _, sid = string.unpack("<I4BBI2I4", x.buf)
        if #x.buf < 12 + len then break end
        got[#got + 1] = { type = type_, sid = sid, payload = x.buf:sub(13, 12 + len) }
        x.buf = x.buf:sub(13 + len)
      end
      return cond(got) or x.eof
    end)
    return got
  end
  local function data_of(frames, sid)
    local n, parts = 0, {}
    for _, f in ipairs(frames) do
      if f.sid == sid and f.type == T.DATA then n = n + #f.payload; parts[#parts + 1] = f.payload end
    end
    return n, table.concat(parts)
  end
  local function has(frames, sid, type_)
    for _, f in ipairs(frames) do if f.sid == sid and f.type == type_ then return f end end
  end

  it("hello says the daemon binds process streams", function()
    assert.are.equal(1, c.server.process_streams)
  end)

  it("takes a token the client chose, and an attach that comes before its stream.channel", function()
    local c2 = d.connect()
    local hex = {}
    for i = 1, 16 do hex[i] = ("%02x"):format(math.random(0, 255)) end
    local tok = table.concat(hex)
    -- the attach first: it waits for the channel that names its token
    local r = raw_connect(d.socket)
    r.pipe:write(json.encode({ jsonrpc = "2.0", id = 7, method = "stream.attach", params = { token = tok } }) .. "\n")
    helper.sync(function() async.sleep(200) end)
    assert.are.equal("", r.buf, "answered before the channel")
    local ch = assert(helper.call(c2, "stream.channel", { token = tok }))
    assert.are.equal(tok, ch.token)
    assert.truthy(raw_line(r).result)
    local st = assert(helper.call(c2, "process.start", { sandbox = box, streams = true, argv = { "echo", "own" } }))
    local frames = frames_until(r, function(fs) return has(fs, st.streams.stdout, T.END) end)
    assert.are.equal("own\n", select(2, data_of(frames, st.streams.stdout)))
    -- a token in use, or not lowercase hex, is refused
    local c3 = d.connect()
    local tok2 = tok:sub(1, 31) .. (tok:sub(32) == "a" and "b" or "a")
    assert(helper.call(c3, "stream.channel", { token = tok2 }))
    local res, err = helper.call(c2, "stream.channel", { token = tok2 })
    assert.is_nil(res)
    assert.truthy(tostring(err.message):find("in use", 1, true))
    res, err = helper.call(c2, "stream.channel", { token = tok:upper() })
    assert.is_nil(res)
    assert.truthy(tostring(err.message):find("hex", 1, true))
    -- an attach whose channel never comes is refused after a second
    local r2 = raw_connect(d.socket)
    local t0 = helper.now()
    r2.pipe:write(json.encode({ jsonrpc = "2.0", id = 7, method = "stream.attach",
      params = { token = ("f"):rep(32) } }) .. "\n")
    local reply = raw_line(r2)
    local took = helper.now() - t0
    assert.truthy(reply and reply.error)
    assert.is_true(took >= 900 and took < 4000, ("waited %d ms"):format(took))
    raw_close(r2)
    raw_close(r)
    c3:close()
    c2:close()
  end)

  it("answers the calls of one write in order, and what came before an attach before the attach's reply", function()
    -- hello, a channel and a bad call in one write: the replies held for
    -- one write (rpc.lua's hold_replies) arrive, all of them, in order
    local r = raw_connect(d.socket)
    local lines = {
      json.encode({ jsonrpc = "2.0", id = 1, method = "hello", params = { protocol = 1 } }),
      json.encode({ jsonrpc = "2.0", id = 2, method = "stream.channel", params = {} }),
      json.encode({ jsonrpc = "2.0", id = 3, method = "no.such.method", params = {} }),
    }
    r.pipe:write(table.concat(lines, "\n") .. "\n")
    local a, b, e = raw_line(r), raw_line(r), raw_line(r)
    assert.are.equal(1, a.id)
    assert.are.equal("tupper", a.result.server)
    assert.are.equal(2, b.id)
    assert.are.equal(32, #b.result.token)
    assert.are.equal(3, e.id)
    assert.are.equal(-32601, e.error.code)
    -- 300 calls in one write answer with more than the 64 KiB a read's
    -- replies are held to: all of them, in order
    local many = {}
    for i = 1, 300 do
      many[i] = json.encode({ jsonrpc = "2.0", id = 100 + i, method = "hello", params = { protocol = 1 } })
    end
    r.pipe:write(table.concat(many, "\n") .. "\n")
    local in_order = 0
    for i = 1, 300 do
      local m = raw_line(r)
      if m and m.id == 100 + i and m.result and m.result.server == "tupper" then in_order = in_order + 1 end
    end
    assert.are.equal(300, in_order)
    -- a hello then the attach with that token, in one write on a second
    -- connection: hello's reply first, then the attach's, then frames
    local r2 = raw_connect(d.socket)
    r2.pipe:write(json.encode({ jsonrpc = "2.0", id = 4, method = "hello", params = { protocol = 1 } }) .. "\n" ..
      json.encode({ jsonrpc = "2.0", id = 5, method = "stream.attach", params = { token = b.result.token } }) .. "\n")
    local h, at = raw_line(r2), raw_line(r2)
    assert.are.equal(4, h.id)
    assert.are.equal("tupper", h.result.server)
    assert.are.equal(5, at.id)
    assert.truthy(at.result and at.result.window)
    raw_close(r2)
    raw_close(r)
  end)

  it("bounds attaches waiting for their stream.channel per connection: one client's take no other's place", function()
    -- one connection sends 80 attaches of tokens nobody named
    local hostile = raw_connect(d.socket)
    local lines = {}
    for i = 1, 80 do
      lines[i] = json.encode({ jsonrpc = "2.0", id = i, method = "stream.attach",
        params = { token = ("%032x"):format(i) } })
    end
    hostile.pipe:write(table.concat(lines, "\n") .. "\n")
    -- (refused at once: 79 with the cap a connection, 16 past the 64 of the old global one)
    wait_for(hostile, function(x) return select(2, x.buf:gsub("\n", "")) >= 16 or x.eof end)
    -- another client's attach before its channel still waits for it
    local c2 = d.connect()
    local hex = {}
    for i = 1, 16 do hex[i] = ("%02x"):format(math.random(0, 255)) end
    local tok = table.concat(hex)
    local r = raw_connect(d.socket)
    r.pipe:write(json.encode({ jsonrpc = "2.0", id = 7, method = "stream.attach", params = { token = tok } }) .. "\n")
    helper.sync(function() async.sleep(200) end)
    assert.are.equal("", r.buf, "the other client's attach was answered before its channel")
    assert(helper.call(c2, "stream.channel", { token = tok }))
    local ok = raw_line(r)
    assert.truthy(ok and ok.result, json.encode(ok))
    -- the first of the 80 waited; the 79 others were refused at once, clearly
    local busy, waited = 0, nil
    for _ = 1, 80 do
      local reply = raw_line(hostile)
      assert.truthy(reply and reply.error)
      if reply.error.code == -32004 then
        busy = busy + 1
        assert.are.equal("early_attaches", reply.error.data.cap)
        assert.truthy(reply.error.message:find("attaches once", 1, true), reply.error.message)
      else
        assert.are.equal(-32602, reply.error.code)
        waited = reply.id
      end
    end
    assert.are.equal(79, busy)
    assert.are.equal(1, waited)
    raw_close(hostile)
    raw_close(r)
    c2:close()
  end)

  it("takes a process.start sent before its attach: it waits for the attach, and at most attach_wait", function()
    assert.are.equal(5000, c.server.attach_wait)
    local c2 = d.connect()
    local tok = assert(helper.call(c2, "stream.channel", {}))
    local st, serr
    async.spawn(function()
      st, serr = c2:call("process.start", { sandbox = box, streams = true, argv = { "echo", "early" } })
    end)
    helper.sync(function() async.sleep(300) end)
    assert.is_nil(st, "answered before the attach")
    assert.is_nil(serr)
    local r = raw_connect(d.socket)
    r.pipe:write(json.encode({ jsonrpc = "2.0", id = 7, method = "stream.attach",
      params = { token = tok.token } }) .. "\n")
    assert.truthy(raw_line(r).result)
    helper.sync(function()
      local deadline = helper.now() + 5000
      while not st and not serr and helper.now() < deadline do async.sleep(5) end
    end)
    assert.is_nil(serr)
    local sid = st.streams.stdout
    local frames = frames_until(r, function(fs) return has(fs, sid, T.END) end)
    assert.are.equal("early\n", select(2, data_of(frames, sid)))
    raw_close(r)
    c2:close()
    -- a token that is never attached: the start fails once attach_wait is up
    local c3 = d.connect()
    assert(helper.call(c3, "stream.channel", {}))
    local t0 = helper.now()
    local res, err = helper.call(c3, "process.start", { sandbox = box, streams = true, argv = { "true" } })
    local took = helper.now() - t0
    assert.is_nil(res)
    assert.matches("no data connection", tostring(err and err.message or err))
    assert.is_true(took >= 4900 and took < 8000, ("waited %d ms"):format(took))
    c3:close()
  end)

  it("carries 80 MiB of `tupper exec` stdout byte for byte count", function()
    local cmd = ("%s --socket %s exec %s -- head -c 83886080 /dev/zero | wc -c"):format(helper.BIN, d.socket, box)
    local t0 = helper.now()
    local p = io.popen(cmd)
    local out = p:read("a")
    local ok = p:close()
    print(("\n# 80 MiB through tupper exec: %d ms"):format(helper.now() - t0))
    assert.is_true(ok)
    assert.are.equal("83886080", out:match("%d+"))
    -- and the old JSON path still serves a client that asks for no streams
    local res = helper.sync(function() return helper.run(c, box, { "sh", "-c", "printf abc; printf err >&2" }) end)
    assert.are.equal("abc", res.stdout)
    assert.are.equal("err", res.stderr)
  end)

  it("blocks a writer whose reader gives no credit, then delivers every byte", function()
    local c2 = d.connect()
    local r = raw_attach(d, c2, 65536)
    local exit
    c2:on("process.exit", function(p) exit = p end)
    local st = assert(helper.call(c2, "process.start", { sandbox = box, streams = true,
      argv = { "sh", "-c", "head -c 4194304 /dev/urandom | tee /tmp/sent >/dev/null; cat /tmp/sent; echo done >/tmp/finished" } }))
    local sids = st.streams
    assert.truthy(sids.stdout and sids.stderr and sids.stdout ~= sids.stderr)
    local frames = frames_until(r, function(fs) return data_of(fs, sids.stdout) >= 65536 end)
    helper.sync(function() async.sleep(400) end)
    frames_until(r, function() return false end) -- nothing more may come
    assert.are.equal(65536, data_of(frames, sids.stdout), "no more than the window came")
    -- the writer is blocked: cat has not finished
    local fin = helper.call(c2, "fs.stat", { sandbox = box, path = "/tmp/finished" })
    assert.is_nil(fin, "the process was not held back")
    assert.is_nil(exit)
    -- credit as the bytes come: all of them, then END with the size
    local total, parts, ended = 0, {}, nil
    helper.sync(function()
      local deadline = helper.now() + 20000
      local pending = frames
      while not ended and helper.now() < deadline do
        for _, f in ipairs(pending) do
          if f.sid == sids.stdout and f.type == T.DATA then
            total = total + #f.payload
            parts[#parts + 1] = f.payload
            r.pipe:write(stream.frame(T.CREDIT, f.sid, string.pack("<I4", #f.payload)))
          elseif f.sid == sids.stdout and f.type == T.END then
            ended = string.unpack("<I8", f.payload)
          end
        end
        pending = {}
        while #r.buf >= 12 do
          local len, _, type_, _, sid = string.unpack("<I4BBI2I4", r.buf)
          if #r.buf < 12 + len then break end
          pending[#pending + 1] = { type = type_, sid = sid, payload = r.buf:sub(13, 12 + len) }
          r.buf = r.buf:sub(13 + len)
        end
        if #pending == 0 then async.sleep(2) end
      end
    end)
    assert.are.equal(4194304, ended)
    assert.are.equal(4194304, total)
    local sent = {}
    for i = 0, 3 do
      local rd = assert(helper.call(c2, "fs.read", { sandbox = box, path = "/tmp/sent", offset = i * 1048576,
        length = 1048576 }))
      sent[#sent + 1] = helper.b64decode(rd.data)
    end
    assert.is_true(table.concat(sent) == table.concat(parts), "the bytes differ")
    helper.sync(function() helper.poll(function() return exit end, nil, 5) end)
    assert.are.equal(0, exit and exit.exit_code)
    raw_close(r)
    c2:close()
  end)

  it("takes stdin on its stream, and refuses another client's stream and process", function()
    local c2 = d.connect()
    local ra = raw_attach(d, c2)
    local st = assert(helper.call(c2, "process.start", { sandbox = box, streams = true, stdin = true,
      argv = { "cat" } }))
    local sids = st.streams
    assert.truthy(sids.stdin)
    local opens = frames_until(ra, function(fs) return has(fs, sids.stdin, T.OPEN) end)
    assert.truthy(has(opens, sids.stdin, T.OPEN))
    -- client B: its data connection knows none of A's ids, and A's process
    -- cannot be taken over while A reads it
    local c3 = d.connect()
    local rb = raw_attach(d, c3)
    rb.pipe:write(stream.frame(T.DATA, sids.stdin, "intruder"))
    local f = raw_frame(rb)
    assert.are.equal(T.ERROR, f.type)
    assert.are.equal(sids.stdin, f.sid)
    assert.are.equal(2, string.unpack("<I4", f.payload)) -- ENOENT
    local taken, terr = helper.call(c3, "process.connect", { sandbox = box, pid = st.pid, streams = true })
    assert.is_nil(taken)
    assert.are.equal(-32004, terr.code)
    assert.are.equal("EBUSY", terr.data.code)
    -- a process started without streams cannot be bound
    local plain = assert(helper.call(c3, "process.start", { sandbox = box, argv = { "sleep", "5" } }))
    local pb, perr = helper.call(c3, "process.connect", { sandbox = box, pid = plain.pid, streams = true })
    assert.is_nil(pb)
    assert.are.equal(-32003, perr.code)
    assert(helper.call(c3, "process.signal", { sandbox = box, pid = plain.pid, signal = "KILL" }))
    -- A's stdin goes on: "ping" comes back on stdout, END ends it
    ra.pipe:write(stream.frame(T.DATA, sids.stdin, "ping\n") .. stream.frame(T.END, sids.stdin))
    local got = frames_until(ra, function(fs) return has(fs, sids.stdout, T.END) end)
    assert.are.equal("ping\n", select(2, data_of(got, sids.stdout)))
    assert.are.equal(5, string.unpack("<I8", has(got, sids.stdout, T.END).payload))
    raw_close(ra)
    raw_close(rb)
    c2:close()
    c3:close()
  end)

  it("drops a half frame and a reader that left; the process goes on and can be read again", function()
    local c2 = d.connect()
    local r = raw_attach(d, c2)
    local st = assert(helper.call(c2, "process.start", { sandbox = box, streams = true, stdin = true,
      argv = { "sh", "-c", "cat; echo tail" } }))
    frames_until(r, function(fs) return has(fs, st.streams.stdin, T.OPEN) end)
    r.pipe:write(string.pack("<I4BBI2I4", 1000, 1, T.DATA, 0, st.streams.stdin) .. string.rep("z", 10))
    helper.sync(function() async.sleep(50) end)
    raw_close(r)
    helper.sync(function() async.sleep(100) end)
    -- the process still runs; a new data connection of another client takes it over
    local list = assert(helper.call(c, "process.list", { sandbox = box }))
    local alive = false
    for _, p in ipairs(list.processes) do if p.pid == st.pid then alive = true end end
    assert.is_true(alive, "the process went with its reader")
    local c3 = d.connect()
    local r3 = raw_attach(d, c3)
    local exit
    c3:on("process.exit", function(p) if p.pid == st.pid then exit = p end end)
    local cn = assert(helper.call(c3, "process.connect", { sandbox = box, pid = st.pid, streams = true }))
    r3.pipe:write(stream.frame(T.DATA, cn.streams.stdin, "ok\n") .. stream.frame(T.END, cn.streams.stdin))
    local got = frames_until(r3, function(fs) return has(fs, cn.streams.stdout, T.END) end)
    assert.are.equal("ok\ntail\n", select(2, data_of(got, cn.streams.stdout)), "nothing of the half frame")
    helper.sync(function() helper.poll(function() return exit end, nil, 5) end)
    assert.are.equal(0, exit and exit.exit_code)
    raw_close(r3)
    c2:close()
    c3:close()
  end)

  it("lets its owner follow it as JSON once its streams went: the output after, the exit once", function()
    local c2 = d.connect()
    local r = raw_attach(d, c2)
    local st = assert(helper.call(c2, "process.start", { sandbox = box, streams = true,
      argv = { "sh", "-c", "echo early; sleep 1; echo late" } }))
    frames_until(r, function(fs) return (select(2, data_of(fs, st.streams.stdout)) or ""):find("early") end)
    raw_close(r)
    local out, exits = {}, 0
    c2:on("process.output", function(p)
      if p.pid == st.pid then out[#out + 1] = helper.b64decode(p.data) end
    end)
    c2:on("process.exit", function(p) if p.pid == st.pid then exits = exits + 1 end end)
    helper.sync(function() async.sleep(100) end)
    assert(helper.call(c2, "process.connect", { sandbox = box, pid = st.pid }))
    helper.sync(function()
      local deadline = helper.now() + 10000
      while exits == 0 and helper.now() < deadline do async.sleep(10) end
      async.sleep(100) -- a second exit would come now
    end)
    assert.are.equal("late\n", table.concat(out))
    assert.are.equal(1, exits)
    c2:close()
  end)

  it("holds a reader that never reads to its window; others are not slowed; closing it frees the process", function()
    local c2 = d.connect()
    local r = raw_attach(d, c2, 65536)
    local exit
    c2:on("process.exit", function(p) exit = p end)
    local st = assert(helper.call(c2, "process.start", { sandbox = box, streams = true,
      argv = { "sh", "-c", "head -c 8388608 /dev/zero; echo gone >/tmp/nr" } }))
    frames_until(r, function(fs) return data_of(fs, st.streams.stdout) >= 65536 end)
    -- another client's process runs meanwhile, through its own streams
    local dc = assert(helper.sync(stream.open, c))
    local other = assert(helper.call(c, "process.start", { sandbox = box, streams = true,
      argv = { "sh", "-c", "head -c 3145728 /dev/zero" } }))
    local n = helper.sync(function() return dc:drain(other.streams.stdout, function() return true end) end)
    assert.are.equal(3145728, n)
    dc:close()
    assert.is_nil(exit, "the unread process is held")
    -- its reader goes: nobody reads, so its output is dropped and it ends
    raw_close(r)
    helper.sync(function()
      local deadline = helper.now() + 10000
      while not exit and helper.now() < deadline do async.sleep(10) end
    end)
    assert.are.equal(0, exit and exit.exit_code)
    c2:close()
  end)
end)
