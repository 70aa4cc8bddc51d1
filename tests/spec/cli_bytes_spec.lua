-- The CLI's byte paths (issue 19): the filter that keeps a box's escapes
-- off the operator's terminal, exec/run -t/-it on a real pty (driven by
-- tests/spec/pty_driver.py), cp of files and trees both ways (modes,
-- times, symlinks, tar streams, temp names), the host extraction's
-- denials, and logs ID [PID].  The filter and the tar/extraction code are
-- unit-tested here; the rest runs build/tupper against a real daemon.
local uv = require("luv")
local json = require("tupper.util.json")
local async = require("tupper.util.async")
local helper = require("helper")
local cli_tty = require("tupper.client.cli_tty")
local cli_cp = require("tupper.client.cli_cp")

local function write(path, data, mode)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
  if mode then assert(uv.fs_chmod(path, mode)) end
end

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok and 0 or code, out
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- ---- unit: the terminal filter ------------------------------------------------

describe("cli_tty.escape", function()
  local esc = function(s) local st = cli_tty.new_state(); return cli_tty.escape(s, st) .. cli_tty.flush(st) end

  it("shows OSC (title, clipboard), DCS, APC, PM and SOS as text", function()
    assert.are.equal("a\\x1b]0;PWNED\\x07b", esc("a\27]0;PWNED\7b"))
    assert.are.equal("\\x1b]52;c;aGk=\\x1b\\", esc("\27]52;c;aGk=\27\\"))
    for _, intro in ipairs({ "P", "_", "^", "X" }) do
      local out = esc("\27" .. intro .. "payload\27\\")
      assert.is_nil(out:find("\27", 1, true), intro)
    end
  end)
  it("passes colours, cursor moves and erases, and plain text with UTF-8", function()
    for _, s in ipairs({ "\27[1;31mred\27[0m", "\27[38;5;208mx\27[m", "\27[38:2:1:2:3mx", "\27[2K\27[1G",
      "\27[10;20H", "\27[J", "\27[3A\27[B", "tab\there\r\nback\8", "héllo wörld ✓ 🎉" }) do
      assert.are.equal(s, esc(s))
    end
  end)
  it("escapes private modes, queries the terminal would answer, resets and other controls", function()
    for _, s in ipairs({ "\27[?1049h", "\27[?1000h", "\27[?2004h", "\27[6n", "\27[c", "\27[>c", "\27[21t",
      "\27c", "\27(0", "\27[1 q", "\7", "\0", "\127", "\1" }) do
      local out = esc(s)
      assert.is_nil(out:find("[%z\1-\8\11\12\14-\31\127]"), ("%q -> %q"):format(s, out))
    end
  end)
  it("escapes C1 controls, raw and UTF-8 encoded, but not other bytes of UTF-8", function()
    assert.are.equal("\\x9b6n", esc("\1556n"))
    assert.are.equal("\\xc2\\x9b6n", esc("\194\1556n"))
    assert.are.equal("\\xc2\\x90x", esc("\194\144x"))
    assert.are.equal("\194\160", esc("\194\160")) -- NBSP is text
    assert.are.equal("\\xe2x", esc("\226x"))      -- a cut character shows as its bytes
  end)
  it("keeps a sequence cut between chunks whole, and bounds a CSI", function()
    local st = cli_tty.new_state()
    local out = cli_tty.escape("x\27", st) .. cli_tty.escape("]0;t\7", st) .. cli_tty.escape("\27[3", st)
      .. cli_tty.escape("1mr\27[?", st) .. cli_tty.escape("25l", st) .. cli_tty.escape("\226\156", st)
      .. cli_tty.escape("\147", st) .. cli_tty.flush(st)
    assert.are.equal("x\\x1b]0;t\\x07\27[31mr\\x1b[?25l✓", out)
    local long = "\27[" .. ("1;"):rep(40) .. "m"
    assert.are.equal("\\x1b", esc(long):sub(1, 4))
    assert.are.equal("\\x1b", esc("\27"))
  end)
end)

describe("cli_tty detach keys", function()
  it("parses docker's syntax and refuses what is not a key", function()
    assert.are.equal("\16\17", cli_tty.parse_detach_keys("ctrl-p,ctrl-q"))
    assert.are.equal("\29", cli_tty.parse_detach_keys("ctrl-]"))
    assert.are.equal("\1x", cli_tty.parse_detach_keys("ctrl-a,x"))
    assert.are.equal("", cli_tty.parse_detach_keys(""))
    assert.is_nil((cli_tty.parse_detach_keys("ctrl-1")))
    assert.is_nil((cli_tty.parse_detach_keys("alt-x")))
  end)
  it("holds a partial match, forwards it on a mismatch, and stops on the whole sequence", function()
    local feed = cli_tty.detacher("\16\17")
    assert.are.same({ "ab", false }, { feed("ab\16") })
    assert.are.same({ "\16c", false }, { feed("c") })
    assert.are.same({ "\16", false }, { feed("\16\16") })
    local rest, done = feed("\17x")
    assert.are.equal("", rest)
    assert.is_true(done)
    local f2 = cli_tty.detacher("\29")
    local out, hit = f2("ls\r\29rest")
    assert.are.equal("ls\r", out)
    assert.is_true(hit)
  end)
end)

-- ---- unit: tar and the host extraction ----------------------------------------

-- entries as a source would make them
local function file(path, data, mode, mtime)
  return { path = path, type = "file", mode = mode or 420, mtime = mtime or 1000000000, size = #data,
           copy = function(w) if #data > 0 then w(data) end end }
end

local function extract(dest, entries, opts)
  local warnings = {}
  local real = io.stderr
  -- the sink warns on stderr: catch it for the asserts
  local fake = { write = function(_, ...) for _, s in ipairs({ ... }) do warnings[#warnings + 1] = s end end }
  io.stderr = fake
  local ok, err = pcall(function()
    local sink = cli_cp.host_sink(dest, opts)
    for _, e in ipairs(entries) do sink.put(e) end
    return sink.finish()
  end)
  io.stderr = real
  return ok, err, table.concat(warnings)
end

local function ls(dir)
  local _, out = sh("cd " .. q(dir) .. " && find . | sort")
  return out
end

describe("host extraction of hostile entries", function()
  local tmp, dest, outside
  before_each(function()
    tmp = helper.tmpdir()
    dest, outside = tmp .. "/dest", tmp .. "/outside"
    assert(uv.fs_mkdir(outside, 493))
  end)
  after_each(function() helper.rmrf(tmp) end)

  it("refuses '..', absolute and overlong names and writes nothing outside", function()
    local ok, err, warn = extract(dest, {
      { path = "", type = "dir", mode = 493 },
      file("../outside/evil", "x"), file("a/../../outside/evil2", "x"), file("/abs", "x"),
      file(("n"):rep(256), "x"), file(("d/"):rep(2100) .. "f", "x"), file("ok", "fine"),
    })
    assert.is_true(ok, err)
    assert.are.equal(".\n./ok\n", ls(dest))
    assert.are.equal(".\n", ls(outside))
    assert.truthy(warn:find("'..'", 1, true))
    assert.truthy(warn:find("absolute", 1, true))
    assert.truthy(warn:find("longer than 255", 1, true))
    assert.truthy(warn:find("longer than 4096", 1, true))
  end)

  it("never writes through a symlink, and keeps only links that stay inside", function()
    local ok, err, warn = extract(dest, {
      { path = "", type = "dir", mode = 493 },
      { path = "out", type = "symlink", link = outside },
      { path = "up", type = "symlink", link = "../outside" },
      { path = "mid", type = "symlink", link = "sub/../.." },
      { path = "self", type = "symlink", link = "." },
      file("out/planted", "x"), file("self/../outside/p2", "x"), file("self/f", "x"),
      { path = "sub", type = "dir", mode = 493 },
      { path = "sub/lib", type = "symlink", link = "../ok" },
      file("ok", "fine"),
      { path = "self/x", type = "dir", mode = 493 },
    })
    assert.is_true(ok, err)
    assert.are.equal(".\n", ls(outside))
    -- "out" was refused, so out/ is a directory of the copy's own
    assert.are.equal(".\n./ok\n./out\n./out/planted\n./self\n./sub\n./sub/lib\n", ls(dest))
    assert.are.equal(".", uv.fs_readlink(dest .. "/self"))
    assert.are.equal("fine", helper.read_file(dest .. "/sub/lib"))
    assert.truthy(warn:find("outside the copy", 1, true))
    assert.truthy(warn:find("not a directory (a symlink is never followed)", 1, true))
  end)

  it("does not replace an existing symlink's target, nor a directory with a file", function()
    assert(uv.fs_mkdir(dest, 493))
    assert(uv.fs_symlink(outside .. "/victim", dest .. "/f"))
    write(outside .. "/victim", "keep")
    assert(uv.fs_mkdir(dest .. "/d", 493))
    local ok, err = extract(dest, { { path = "", type = "dir", mode = 493 }, file("f", "new") })
    assert.is_true(ok, err)
    assert.are.equal("keep", helper.read_file(outside .. "/victim")) -- the link was replaced, not followed
    assert.are.equal("new", helper.read_file(dest .. "/f"))
    assert.is_nil(uv.fs_readlink(dest .. "/f"))
    ok, err = extract(dest, { { path = "", type = "dir", mode = 493 }, file("d", "x") })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("a directory is in the way", 1, true))
  end)

  it("takes a hard link only to a file of this copy; skips devices, FIFOs and sockets", function()
    write(outside .. "/secret", "s")
    local ok, err, warn = extract(dest, {
      { path = "", type = "dir", mode = 493 },
      file("a", "data"),
      { path = "h1", type = "hardlink", link = "a" },
      { path = "h2", type = "hardlink", link = "../outside/secret" },
      { path = "h3", type = "hardlink", link = outside .. "/secret" },
      { path = "h4", type = "hardlink", link = "never" },
      { path = "dev", type = "other" },
    })
    assert.is_true(ok, err)
    assert.are.equal(".\n./a\n./h1\n", ls(dest))
    assert.are.equal(uv.fs_stat(dest .. "/a").ino, uv.fs_stat(dest .. "/h1").ino)
    assert.truthy(warn:find("not a file of this copy", 1, true))
    assert.truthy(warn:find("a device, FIFO or socket", 1, true))
  end)

  it("drops setuid and setgid, keeps modes and times, fills a read-only directory", function()
    local ok, err, warn = extract(dest, {
      { path = "", type = "dir", mode = 493 },
      { path = "ro", type = "dir", mode = 320, mtime = 1200000000 }, -- 0500
      file("ro/suid", "x", 3565, 1100000000), -- 06755
      file("ro/plain", "y", 416, 1100000001),
    })
    assert.is_true(ok, err)
    local st = uv.fs_stat(dest .. "/ro/suid")
    assert.are.equal(493, st.mode & 4095)
    assert.are.equal(1100000000, st.mtime.sec)
    assert.are.equal(416, uv.fs_stat(dest .. "/ro/plain").mode & 4095)
    local d = uv.fs_stat(dest .. "/ro")
    assert.are.equal(320, d.mode & 4095)
    assert.are.equal(1200000000, d.mtime.sec)
    assert.truthy(warn:find("setuid/setgid bits dropped", 1, true))
    assert(uv.fs_chmod(dest .. "/ro", 493))
    -- merged into, an existing directory keeps its own mode (not the box's 0777)
    assert(uv.fs_chmod(dest, 448))
    ok, err = extract(dest, { { path = "", type = "dir", mode = 511, mtime = 5 }, file("n", "z") })
    assert.is_true(ok, err)
    assert.are.equal(448, uv.fs_stat(dest).mode & 4095)
    assert.are_not.equal(5, uv.fs_stat(dest).mtime.sec)
  end)

  it("stops past its byte bound and when a file grows past its listed size, leaving no temp file", function()
    local ok, err = extract(dest, { { path = "", type = "dir", mode = 493 }, file("a", ("x"):rep(100)),
      file("b", ("x"):rep(100)) }, { max_bytes = 150 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("would pass 150 bytes", 1, true))
    local liar = file("c", "abc")
    liar.copy = function(w) w("abc"); w("more") end
    ok, err = extract(dest, { { path = "", type = "dir", mode = 493 }, liar })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("grew past its listed size", 1, true))
    assert.are.equal(".\n./a\n", ls(dest))
  end)
end)

describe("tar streams", function()
  local tmp
  before_each(function() tmp = helper.tmpdir() end)
  after_each(function() helper.rmrf(tmp) end)

  local function read_tar(data)
    local pos, out = 1, {}
    cli_cp.tar_reader(function(n)
      local s = data:sub(pos, pos + n - 1)
      pos = pos + #s
      return #s > 0 and s or nil
    end)(function(e)
      local parts = {}
      if e.copy then e.copy(function(d) parts[#parts + 1] = d end) end
      e.data = table.concat(parts)
      out[#out + 1] = e
    end)
    return out
  end

  it("writes what GNU tar reads: long names, symlinks, modes, times", function()
    local long = ("x"):rep(150)
    local parts = {}
    local w = cli_cp.tar_writer(function(d) parts[#parts + 1] = d end)
    w.add({ path = "t", type = "dir", mode = 448, mtime = 1500000000 })
    w.add(file("t/" .. long, "hello\n", 420, 1500000001))
    w.add({ path = "t/l", type = "symlink", link = ("y/"):rep(60) .. "z", mode = 511, mtime = 1500000002 })
    w.add(file("t/empty", "", 384, 1500000003))
    w.finish()
    write(tmp .. "/a.tar", table.concat(parts))
    local code, out = sh("tar --numeric-owner -tvf " .. q(tmp .. "/a.tar"))
    assert.are.equal(0, code, out)
    assert.truthy(out:find("drwx------ 0/0", 1, true), out)
    assert.truthy(out:find("t/" .. long, 1, true), out)
    assert.truthy(out:find("t/l -> " .. ("y/"):rep(60) .. "z", 1, true), out)
    assert(uv.fs_mkdir(tmp .. "/x", 493))
    code, out = sh("tar -xf " .. q(tmp .. "/a.tar") .. " -C " .. q(tmp .. "/x"))
    assert.are.equal(0, code, out)
    assert.are.equal("hello\n", helper.read_file(tmp .. "/x/t/" .. long))
    assert.are.equal(1500000001, uv.fs_stat(tmp .. "/x/t/" .. long).mtime.sec)
  end)

  it("reads what GNU tar writes (gnu and pax), hard links and FIFOs included", function()
    local src = tmp .. "/src"
    assert(uv.fs_mkdir(src, 493))
    local long = ("n"):rep(130)
    write(src .. "/" .. long, "data", 416)
    assert(uv.fs_link(src .. "/" .. long, src .. "/hard"))
    assert(uv.fs_symlink(long, src .. "/sym"))
    assert.are.equal(0, (sh("mkfifo " .. q(src .. "/fifo"))))
    for _, fmt in ipairs({ "gnu", "pax" }) do
      local code, out = sh("tar --format=" .. fmt .. " -cf " .. q(tmp .. "/" .. fmt .. ".tar") .. " -C " .. q(tmp) .. " src")
      assert.are.equal(0, code, out)
      local ents = read_tar(helper.read_file(tmp .. "/" .. fmt .. ".tar"))
      local by = {}
      for _, e in ipairs(ents) do by[e.path] = e end
      assert.are.equal("dir", by["src"].type, fmt)
      -- one of the two names is the file, the other a hard link to it
      local f, h = by["src/" .. long], by["src/hard"]
      if f.type ~= "file" then f, h = h, f end
      assert.are.equal("data", f.data, fmt)
      assert.are.equal(416, f.mode, fmt)
      assert.are.equal("hardlink", h.type, fmt)
      assert.are.equal(f.path, h.link, fmt)
      assert.are.equal("symlink", by["src/sym"].type, fmt)
      assert.are.equal(long, by["src/sym"].link, fmt)
      assert.are.equal("other", by["src/fifo"].type, fmt)
    end
  end)

  it("refuses a bad checksum and a truncated stream, and round-trips its own output", function()
    local parts = {}
    local w = cli_cp.tar_writer(function(d) parts[#parts + 1] = d end)
    w.add(file("f", ("z"):rep(1000), 420, 1234567890))
    w.finish()
    local good = table.concat(parts)
    local ents = read_tar(good)
    assert.are.equal(1, #ents)
    assert.are.equal(("z"):rep(1000), ents[1].data)
    assert.are.equal(1234567890, ents[1].mtime)
    local bad = good:sub(1, 10) .. "X" .. good:sub(12)
    assert.has_error(function() read_tar(bad) end, "tar: a header's checksum is wrong")
    assert.has_error(function() read_tar(good:sub(1, 700)) end, "tar: the stream ends inside an entry")
  end)

  it("through the host extraction: a tar that plants a symlink and then a file through it", function()
    local dest, outside = tmp .. "/dest", tmp .. "/outside"
    assert(uv.fs_mkdir(outside, 493))
    local parts = {}
    local w = cli_cp.tar_writer(function(d) parts[#parts + 1] = d end)
    w.add({ path = "l", type = "symlink", link = outside, mode = 511, mtime = 1 })
    w.add(file("l/planted", "x"))
    w.add({ path = "sub", type = "dir", mode = 493 })
    w.add({ path = "sub/up", type = "symlink", link = "..", mode = 511 })
    w.add(file("sub/up/planted2", "x"))
    w.add(file("../escape", "x"))
    w.add(file("fine", "ok"))
    w.finish()
    local data, pos = table.concat(parts), 1
    local warnings = {}
    local real = io.stderr
    io.stderr = { write = function(_, ...) for _, s in ipairs({ ... }) do warnings[#warnings + 1] = s end end }
    local ok, err = pcall(function()
      local sink = cli_cp.host_sink(dest)
      sink.put({ path = "", type = "dir", mode = 493 })
      cli_cp.tar_reader(function(n)
        local s = data:sub(pos, pos + n - 1)
        pos = pos + #s
        return #s > 0 and s or nil
      end)(sink.put)
      sink.finish()
    end)
    io.stderr = real
    assert.is_true(ok, err)
    assert.are.equal(".\n", ls(outside))
    -- l was refused, so l/ became a directory of the copy; sub/up was kept
    -- (it points inside) but is never gone through
    assert.are.equal(".\n./fine\n./l\n./l/planted\n./sub\n./sub/up\n", ls(dest))
    assert.truthy(table.concat(warnings):find("outside the copy", 1, true))
    assert.truthy(table.concat(warnings):find("a symlink is never followed", 1, true))
  end)
end)

-- ---- the CLI against a daemon ---------------------------------------------------

describe("tupper CLI byte paths", function()
  local d, tmp, id
  local DRIVER = helper.ROOT .. "/tests/spec/pty_driver.py"

  local function cli(args, opts)
    local full = { "--socket", d.socket }
    for _, a in ipairs(args) do full[#full + 1] = a end
    return helper.cli(full, opts)
  end
  local function box(cmd)
    local code, out, err = cli({ "exec", id, "--", "sh", "-c", cmd })
    assert.are.equal(0, code, err)
    return out
  end
  -- the CLI on a real terminal: steps as for pty_driver.py
  local function on_pty(args, steps)
    local sf = tmp .. "/steps.json"
    write(sf, json.encode(json.array(steps or {})))
    local cmd = { "timeout", "90", "python3", q(DRIVER), q(sf), q(helper.BIN), "--socket", q(d.socket) }
    for _, a in ipairs(args) do cmd[#cmd + 1] = q(a) end
    local _, out = sh(table.concat(cmd, " "))
    local line = out:match("([^\n]*)\n?$")
    local r = json.decode(line)
    assert(r, "pty driver: " .. out)
    return r
  end

  setup(function()
    tmp = helper.tmpdir()
    d = helper.start_daemon(nil, { pool = 0 })
    local code, out, err = cli({ "create", "--timeout", "15m" })
    assert.are.equal(0, code, err)
    id = out:match("%S+")
  end)
  teardown(function()
    if id then cli({ "kill", id }) end
    if d then d.stop() end
    helper.rmrf(tmp)
    helper.drain()
  end)

  describe("terminal safety", function()
    local PRINT = "printf 'a\\033]0;PWNED\\007b\\033]52;c;aGk=\\007\\033[31mred\\033[0m\\n'; printf 'e\\033[?1049h\\n' >&2"
    it("escapes a box's OSC and private modes on a terminal, colours pass", function()
      local r = on_pty({ "exec", id, "sh", "-c", PRINT })
      assert.are.equal(0, r.exit, r.out)
      assert.truthy(r.out:find("a\\x1b]0;PWNED\\x07b\\x1b]52;c;aGk=\\x07\27[31mred\27[0m", 1, true), r.out)
      assert.truthy(r.out:find("e\\x1b[?1049h", 1, true), r.out)
      assert.is_nil(r.out:find("\27]", 1, true))
    end)
    it("passes the bytes untouched with -t and through a pipe", function()
      local r = on_pty({ "exec", "-t", id, "sh", "-c", PRINT })
      assert.are.equal(0, r.exit, r.out)
      assert.truthy(r.out:find("a\27]0;PWNED\7b", 1, true), r.out)
      local code, out, err = cli({ "exec", id, "sh", "-c", PRINT })
      assert.are.equal(0, code)
      assert.truthy(out:find("a\27]0;PWNED\7b\27]52;c;aGk=\7", 1, true))
      assert.are.equal("e\27[?1049h\n", err)
    end)
  end)

  describe("a terminal of the box", function()
    it("exec -it: a pty of our size, resized on SIGWINCH, raw keys, ^] detaches and the process runs on", function()
      local r = on_pty({ "exec", "-it", id, "/bin/sh" }, {
        { "expect", "# " },
        { "send", "tty; stty size; echo M$((6*7))\r" },
        { "expect", "/dev/pts/" }, { "expect", "24 80" }, { "expect", "M42" },
        { "resize", 40, 100 }, { "sleep", 0.5 },
        { "send", "stty size\r" }, { "expect", "40 100" },
        { "send", "sleep 120; echo never\r" }, { "sleep", 0.3 },
        { "send", "\3" }, { "expect", "# " }, -- ^C reaches the box's terminal, not us
        { "send", "echo still-here-$((1+1)); sleep 300\r" }, { "expect", "still-here-2" }, { "sleep", 0.3 },
        { "send", "\29" }, { "expect", "detached; process " },
      })
      assert.is_true(r.ok, json.encode(r.failed) .. r.out)
      assert.are.equal(0, r.exit, r.out)
      -- raw output: the box's CR LF is not made CR CR LF on our side
      assert.truthy(r.out:find("M42\r\n", 1, true), r.out)
      assert.is_nil(r.out:find("M42\r\r\n", 1, true), r.out)
      local pid = r.out:match("detached; process (%d+)")
      -- it keeps running: listed, and its output is there
      local code, out = cli({ "logs", id })
      assert.are.equal(0, code)
      assert.truthy(out:find("\n" .. pid .. " +yes", 1, false), out)
      code, out = cli({ "logs", id, pid })
      assert.are.equal(0, code)
      assert.truthy(out:find("still-here-2", 1, true), out)
      -- and attach takes us back: what it showed, then input again
      r = on_pty({ "attach", id, pid }, {
        { "expect", "still-here-2" }, { "send", "\3" }, { "expect", "# " },
        { "send", "stty size; echo back-$((2+3))\r" }, { "expect", "24 80" }, { "expect", "back-5" },
        { "send", "\29" }, { "expect", "detached; process " .. pid },
      })
      assert.is_true(r.ok, json.encode(r.failed) .. r.out)
      assert.are.equal(0, r.exit, r.out)
      assert.are.equal(0, (cli({ "exec", id, "kill", "-9", pid })))
      -- the kill's own exit can come before the killed process's: until the
      -- daemon has it, an attach would follow the process to its end (137)
      local function running()
        local _, list = cli({ "logs", id })
        local line = list:match("\n" .. pid .. " [^\n]*") or ""
        return line:find(" running ", 1, true) ~= nil, list
      end
      local deadline = helper.now() + 10000
      while running() and helper.now() < deadline do uv.sleep(20) end
      local still, list = running()
      assert.is_false(still, list)
      local err
      code, _, err = cli({ "attach", id, pid })
      assert.are.equal(125, code)
      assert.truthy(err:find("no process", 1, true), err)
    end)
    it("attach with stdin on /dev/null follows the program to its end", function()
      -- /dev/null (or a regular file) is no stream epoll takes: it is read
      -- with file reads, its end is the end of input, the program goes on
      local r = on_pty({ "exec", "-it", id, "sh", "-c", "echo start-$((1+1)); sleep 1.5; echo fin-$((3+4)); exit 5" },
        { { "expect", "start-2" }, { "send", "\29" }, { "expect", "detached; process " } })
      assert.is_true(r.ok, json.encode(r.failed) .. r.out)
      local pid = r.out:match("detached; process (%d+)")
      local code, out, err = cli({ "attach", id, pid })
      assert.are.equal(5, code, out .. err)
      assert.truthy(out:find("fin-7", 1, true), out)
    end)
    it("exec -it --detach-keys and a program that ends: its exit code", function()
      -- ^] is a key like any other now; a held ^P goes on when x follows
      local r = on_pty({ "exec", "-it", "--detach-keys", "ctrl-p,ctrl-q", id, "sh", "-c",
        "head -c 3 | od -An -tx1; exit 7" }, { { "sleep", 0.5 }, { "send", "\29\16x\r" }, { "expect", "1d 10 78" } })
      assert.is_true(r.ok, r.out)
      assert.are.equal(7, r.exit, r.out)
      assert.is_nil(r.out:find("detached", 1, true))
      local code, _, err = cli({ "exec", "-it", "--detach-keys", "alt-x", id, "true" })
      assert.are.equal(125, code)
      assert.truthy(err:find("detach-keys", 1, true))
    end)
    it("attach refuses a process without a terminal", function()
      local child = {}
      child.handle, child.pid = uv.spawn(helper.BIN, { args = { "--socket", d.socket, "exec", id, "--", "sleep", "30" } },
        function(c, s) child.exit_code = s ~= 0 and 128 + s or c end)
      helper.track(child, "exec")
      local pid
      local deadline = helper.now() + 10000
      while not pid and helper.now() < deadline do
        local _, out = cli({ "logs", "--json", id })
        for _, p in ipairs(json.decode(out) or {}) do if p.argv[1] == "sleep" and not p.exit then pid = math.tointeger(p.pid) end end
      end
      assert.truthy(pid)
      local code, _, err = cli({ "attach", id, tostring(pid) })
      assert.are.equal(125, code)
      assert.truthy(err:find("has no terminal", 1, true), err)
      local kcode, kout, kerr = cli({ "exec", id, "kill", tostring(pid) })
      assert.are.equal(0, kcode, kout .. kerr)
      helper.sync(function() while not child.exit_code do async.sleep(5) end end)
      child.handle:close()
    end)
    it("exec -t alone and run -it", function()
      local r = on_pty({ "exec", "-t", id, "sh", "-c", "tty; exit 3" })
      assert.are.equal(3, r.exit, r.out)
      assert.truthy(r.out:find("/dev/pts/", 1, true), r.out)
      r = on_pty({ "run", "-it", "--", "/bin/sh" }, { { "expect", "# " }, { "send", "tty; exit 5\r" },
        { "expect", "/dev/pts/" } })
      assert.is_true(r.ok, r.out)
      assert.are.equal(5, r.exit, r.out)
    end)
  end)

  describe("cp", function()
    local src
    before_each(function()
      src = tmp .. "/src"
      helper.rmrf(src)
      assert.are.equal(0, (sh(table.concat({ "mkdir -p", q(src .. "/sub"), "&& echo hello >", q(src .. "/a.txt"),
        "&& echo b >", q(src .. "/sub/b"), "&& ln -s a.txt", q(src .. "/link"),
        "&& chmod 640", q(src .. "/a.txt"), "&& chmod 750", q(src .. "/sub"),
        "&& touch -h -d @1300000000", q(src .. "/a.txt"), q(src .. "/sub/b"),
        "&& touch -d @1300000001", q(src .. "/sub") }, " "))))
      box("rm -rf /tmp/cp && mkdir /tmp/cp")
    end)

    it("FILE ID:/dir/ goes into that directory; into a missing one it is refused", function()
      local code, _, err = cli({ "cp", src .. "/a.txt", id .. ":/tmp/cp/" })
      assert.are.equal(0, code, err)
      assert.are.equal("hello\n640 1300000000\n", box("cat /tmp/cp/a.txt; stat -c '%a %Y' /tmp/cp/a.txt"))
      -- setuid/setgid go into a box only with -a
      assert(uv.fs_chmod(src .. "/a.txt", 3565))
      code, _, err = cli({ "cp", src .. "/a.txt", id .. ":/tmp/cp/plain" })
      assert.are.equal(0, code, err)
      code, _, err = cli({ "cp", "-a", src .. "/a.txt", id .. ":/tmp/cp/kept" })
      assert.are.equal(0, code, err)
      assert.are.equal("755\n6755\n", box("stat -c %a /tmp/cp/plain /tmp/cp/kept"))
      code, _, err = cli({ "cp", src .. "/a.txt", id .. ":/tmp/cp/nodir/" })
      assert.are.equal(125, code)
      assert.truthy(err:find("not a directory", 1, true), err)
    end)

    it("a directory wants -r; -r makes the target or goes into an existing directory (docker cp)", function()
      local code, _, err = cli({ "cp", src, id .. ":/tmp/cp/x" })
      assert.are.equal(125, code)
      assert.truthy(err:find("use -r", 1, true), err)
      assert.are.equal("", box("ls /tmp/cp"))
      code, _, err = cli({ "cp", "-r", src, id .. ":/tmp/cp/x" })
      assert.are.equal(0, code, err)
      assert.are.equal("a.txt\nlink\nsub\n", box("ls /tmp/cp/x"))
      code, _, err = cli({ "cp", "-r", src, id .. ":/tmp/cp/x" })
      assert.are.equal(0, code, err)
      assert.are.equal("a.txt\nlink\nsrc\nsub\n", box("ls /tmp/cp/x"))
      assert.are.equal("640 1300000000\n750 1300000001\n644 1300000000\na.txt\n",
        box("cd /tmp/cp/x/src && stat -c '%a %Y' a.txt sub sub/b && readlink link"))
      assert.are.equal("", box("ls -a /tmp/cp/x | grep tupper- || true"))
    end)

    it("out of the box: -r both semantics, modes and times, and a tar stream", function()
      box("mkdir -p /tmp/cp/t/d && echo one > /tmp/cp/t/d/f && chmod 600 /tmp/cp/t/d/f && " ..
        "touch -d @1400000000 /tmp/cp/t/d/f && chmod 700 /tmp/cp/t/d && touch -d @1400000001 /tmp/cp/t/d && " ..
        "ln -s d/f /tmp/cp/t/rel")
      local out = tmp .. "/out"
      helper.rmrf(out)
      local code, _, err = cli({ "cp", "-r", id .. ":/tmp/cp/t", out })
      assert.are.equal(0, code, err)
      assert.are.equal("one\n", helper.read_file(out .. "/d/f"))
      assert.are.equal(384, uv.fs_stat(out .. "/d/f").mode & 4095)
      assert.are.equal(1400000000, uv.fs_stat(out .. "/d/f").mtime.sec)
      assert.are.equal(448, uv.fs_stat(out .. "/d").mode & 4095)
      assert.are.equal(1400000001, uv.fs_stat(out .. "/d").mtime.sec)
      assert.are.equal("d/f", uv.fs_readlink(out .. "/rel"))
      code, _, err = cli({ "cp", "-r", id .. ":/tmp/cp/t", out })
      assert.are.equal(0, code, err)
      assert.are.equal("one\n", helper.read_file(out .. "/t/d/f"))
      code, _, err = cli({ "cp", id .. ":/tmp/cp/t/d/f", out .. "/" })
      assert.are.equal(0, code, err)
      assert.are.equal("one\n", helper.read_file(out .. "/f"))
      -- SRC itself is followed, inside the box; a loop is an error
      box("ln -s t/d/f /tmp/cp/lnk && ln -s loop2 /tmp/cp/loop1 && ln -s loop1 /tmp/cp/loop2")
      code, _, err = cli({ "cp", id .. ":/tmp/cp/lnk", out .. "/" })
      assert.are.equal(0, code, err)
      assert.are.equal("one\n", helper.read_file(out .. "/lnk"))
      assert.is_nil(uv.fs_readlink(out .. "/lnk"))
      code, _, err = cli({ "cp", id .. ":/tmp/cp/loop1", out .. "/" })
      assert.are.equal(125, code)
      assert.truthy(err:find("too many levels", 1, true), err)
      -- a tar stream out, and one back in
      code, err = sh(q(helper.BIN) .. " --socket " .. q(d.socket) .. " cp " .. id .. ":/tmp/cp/t - > " .. q(tmp .. "/t.tar"))
      assert.are.equal(0, code, err)
      local _, list = sh("tar -tvf " .. q(tmp .. "/t.tar"))
      assert.truthy(list:find("t/d/f", 1, true), list)
      assert.truthy(list:find("t/rel -> d/f", 1, true), list)
      code, err = sh("cd " .. q(tmp) .. " && tar -cf - src | " .. q(helper.BIN) .. " --socket " .. q(d.socket)
        .. " cp - " .. id .. ":/tmp/cp")
      assert.are.equal(0, code, err)
      assert.are.equal("hello\n640\n", box("cat /tmp/cp/src/a.txt; stat -c %a /tmp/cp/src/a.txt"))
      code, err = sh("printf 'not a tar' | " .. q(helper.BIN) .. " --socket " .. q(d.socket) .. " cp - " .. id .. ":/tmp/cp")
      assert.are.equal(125, code, err)
    end)

    it("a hostile box's tree: nothing lands outside, links out, FIFOs and setuid are refused", function()
      local outside = tmp .. "/outside"
      helper.rmrf(outside)
      assert(uv.fs_mkdir(outside, 493))
      box("mkdir -p /tmp/cp/h/d && cd /tmp/cp/h && echo s > suid && chmod 4755 suid && ln -s " .. q(outside) ..
        " abs && ln -s ../../../../../../../../" .. q(outside:sub(2)) .. " up && ln -s d/../.. mid && " ..
        "mkfifo fifo && echo ok > d/ok")
      local out = tmp .. "/hout"
      helper.rmrf(out)
      local code, _, err = cli({ "cp", "-r", id .. ":/tmp/cp/h", out })
      assert.are.equal(0, code, err)
      assert.are.equal(".\n./d\n./d/ok\n./suid\n", ls(out))
      assert.are.equal(493, uv.fs_stat(out .. "/suid").mode & 4095)
      assert.are.equal(".\n", ls(outside))
      for _, w in ipairs({ "skipped abs", "skipped up", "skipped mid", "skipped fifo", "setuid/setgid bits dropped" }) do
        assert.truthy(err:find(w, 1, true), w .. " in " .. err)
      end
    end)

    it("an interrupted copy leaves the old file in place (both ways)", function()
      -- large and sparse: a copy through the box's own file (fs.read_fd)
      -- takes long enough to be interrupted, and costs no disk in the box
      box("truncate -s 2G /tmp/cp/big")
      local dst = tmp .. "/big"
      write(dst, "old")
      local child = { }
      child.handle, child.pid = uv.spawn(helper.BIN, { args = { "--socket", d.socket, "cp", id .. ":/tmp/cp/big", dst } },
        function(c, s) child.exit_code = s ~= 0 and 128 + s or c end)
      helper.track(child, "cp")
      local tmpname
      helper.sync(function()
        local deadline = helper.now() + 20000
        while not tmpname and helper.now() < deadline and not child.exit_code do
          local h = uv.fs_scandir(tmp)
          while h do
            local n = uv.fs_scandir_next(h)
            if not n then break end
            if n:find("^%.big%.tupper%-") then tmpname = n end
          end
          async.sleep(5)
        end
      end)
      assert.truthy(tmpname, "the copy never showed its temporary file")
      uv.process_kill(child.handle, "sigint")
      helper.sync(function() while not child.exit_code do async.sleep(5) end end)
      child.handle:close()
      assert.are.equal(130, child.exit_code)
      assert.are.equal("old", helper.read_file(dst))
      assert.is_nil(uv.fs_stat(tmp .. "/" .. tmpname))
      -- into the box: killed outright, the target keeps its old bytes
      assert.are.equal(0, (sh("truncate -s 2G " .. q(tmp .. "/big2"))))
      box("echo old > /tmp/cp/big2")
      local c2 = {}
      c2.handle, c2.pid = uv.spawn(helper.BIN, { args = { "--socket", d.socket, "cp", tmp .. "/big2", id .. ":/tmp/cp/big2" } },
        function(c, s) c2.exit_code = s ~= 0 and 128 + s or c end)
      helper.track(c2, "cp")
      local deadline = helper.now() + 20000
      while helper.now() < deadline and not c2.exit_code do
        local code, out = cli({ "exec", id, "sh", "-c", "ls -a /tmp/cp | grep -c tupper- || true" })
        if code == 0 and out:match("^1") then break end
      end
      uv.process_kill(c2.handle, "sigkill")
      helper.sync(function() while not c2.exit_code do async.sleep(5) end end)
      c2.handle:close()
      assert.are.equal("old\n", box("cat /tmp/cp/big2"))
    end)

    it("a copy onto a full disk and output whose reader went each stop at once with why", function()
      -- the bytes go from the data connection's pump in C: its failures
      -- still reach the user as the copy's error and exit code
      box("head -c 3145728 /dev/zero > /tmp/cp/three")
      local small = tmp .. "/small"
      assert(uv.fs_mkdir(small, 448))
      local mounted = sh("mount -t tmpfs -o size=1m tmpfs " .. q(small)) == 0
      local ok, err = pcall(function()
        if mounted then
          local code, _, cerr = cli({ "cp", id .. ":/tmp/cp/three", small .. "/f" })
          assert.are.equal(125, code)
          assert.truthy(cerr:find("No space left on device", 1, true), cerr)
          assert.are.equal("", (select(2, sh("ls -A " .. q(small)))))
        end
        -- `| head -c1`: ends as a SIGPIPE would, and the box's writer is not left waiting on us
        local line = table.concat({ q(helper.BIN), "--socket", q(d.socket), "exec", id, "--", "yes" }, " ")
          .. ' | head -c1; echo " ${PIPESTATUS[0]}"'
        local code, out = sh("bash -c " .. q(line))
        assert.are.equal(0, code)
        assert.are.equal("y 141\n", out)
      end)
      if mounted then sh("umount " .. q(small)) end
      uv.fs_rmdir(small)
      assert(ok, err)
    end)
  end)

  describe("logs", function()
    it("lists the processes, replays one's output, follows it to its exit code, --tail, and keeps it once exited", function()
      local child = {}
      local outp = uv.new_pipe(false)
      local errp = uv.new_pipe(false)
      child.handle, child.pid = uv.spawn(helper.BIN, { args = { "--socket", d.socket, "exec", id, "--", "sh", "-c",
        -- l3 once the test says so (a sleep there would be a race on a loaded machine)
        "echo e1 >&2; sleep 0.3; echo l1; echo l2; while [ ! -e /tmp/l3 ]; do sleep 0.05; done; echo l3; exit 4" },
        stdio = { nil, outp, errp } },
        function(c, s) child.exit_code = s ~= 0 and 128 + s or c end)
      helper.track(child, "exec")
      outp:read_start(function() end)
      errp:read_start(function() end)
      local pid
      local deadline = helper.now() + 10000
      while not pid and helper.now() < deadline do
        local code, out = cli({ "logs", "--json", id })
        if code == 0 then
          for _, p in ipairs(json.decode(out) or {}) do
            if p.argv[1] == "sh" and p.argv[3] and p.argv[3]:find("echo l1", 1, true) then pid = math.tointeger(p.pid) end
          end
        end
      end
      assert.truthy(pid, "the process was never listed")
      local code, out = cli({ "logs", id })
      assert.are.equal(0, code)
      assert.truthy(out:find("echo l1", 1, true))
      local err
      deadline = helper.now() + helper.WAIT_MS
      repeat -- until l1 and l2 are out
        code, out, err = cli({ "logs", id, tostring(pid) })
        if out == "l1\nl2\n" then break end
        uv.sleep(50)
      until helper.now() >= deadline
      assert.are.equal(0, code, err)
      assert.are.equal("l1\nl2\n", out)
      assert.are.equal("e1\n", err)
      code, out = cli({ "logs", "--tail", "1", id, tostring(pid) })
      assert.are.equal(0, code)
      assert.are.equal("l2\n", out)
      assert.are.equal(0, (cli({ "exec", id, "--", "touch", "/tmp/l3" })))
      code, out = cli({ "logs", "-f", id, tostring(pid) })
      assert.are.equal(4, code)
      assert.are.equal("l1\nl2\nl3\n", out)
      helper.sync(function() while not child.exit_code do async.sleep(5) end end)
      child.handle:close()
      outp:close()
      errp:close()
      -- exited: still there, with its exit code (the daemon keeps the last 16)
      code, out, err = cli({ "logs", id, tostring(pid) })
      assert.are.equal(0, code, err)
      assert.are.equal("l1\nl2\nl3\n", out)
      assert.are.equal("e1\n", err)
      code, out = cli({ "logs", "-f", id, tostring(pid) })
      assert.are.equal(4, code)
      assert.are.equal("l1\nl2\nl3\n", out)
      code, out = cli({ "logs", id })
      assert.are.equal(0, code)
      local line = out:match("\n(" .. pid .. " [^\n]*)")
      assert.truthy(line and line:find("exited 4", 1, true), out)
      code, out = cli({ "logs", "--json", id })
      local listed
      for _, p in ipairs(json.decode(out)) do if p.pid == pid then listed = p end end
      assert.are.equal(4, listed and listed.exit and listed.exit.exit_code)
      code, _, err = cli({ "logs", id, "4000000" })
      assert.are.equal(125, code)
      assert.truthy(err:find("no process", 1, true), err)
      code, _, err = cli({ "logs", id, "nope" })
      assert.are.equal(125, code)
      code, out = cli({ "logs", "--network", "--json", id })
      assert.are.equal(0, code)
      assert.are.same({}, json.decode(out))
    end)
  end)
end)
