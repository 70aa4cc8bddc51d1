--- The CLI's terminal side: the filter that keeps a box's output from
-- acting on the operator's terminal, and `exec -t`/`run -t` on a real
-- pseudo-terminal of the box (raw mode, resize, a detach key).
--
-- What the filter escapes (docs/cli.md "Terminal safety"), when stdout or
-- stderr is a terminal and -t was not asked: every byte that would make the
-- terminal *do* something rather than show text, except the few that plain
-- output uses.  It passes printable text (UTF-8 included), TAB, LF, CR and
-- BS, and CSI sequences of the forms `ESC [ digits;... m` (colours and
-- attributes) and `ESC [ digits;... A-H f J K` (cursor moves, erase line or
-- screen).  It shows as `\xNN` text: every other C0 control (BEL included,
-- which also ends an OSC), DEL, C1 controls (8-bit, or UTF-8 encoded
-- U+0080..U+009F), and the ESC of every other sequence: OSC (title,
-- clipboard, hyperlinks), DCS, APC, PM, SOS, private CSI modes (alternate
-- screen, mouse or focus reporting, bracketed paste), CSI queries whose
-- answer the terminal would type into our input (device status, window
-- reports), charset switches and resets.  With the ESC shown, what followed
-- it is plain text and prints as such.
local uv = require("luv")
local b64 = require("tupper.util.b64")
local async = require("tupper.util.async")
local stream = require("tupper.wire.stream")

local M = {}

local CSI_MAX = 64 -- longest CSI sequence passed; a longer one is escaped
local CSI_ALLOWED = { A = 1, B = 1, C = 1, D = 1, E = 1, F = 1, G = 1, H = 1, f = 1, J = 1, K = 1, m = 1 }

local function hex(b) return ("\\x%02x"):format(b) end

--- A fresh state for escape(): one per output stream.
function M.new_state()
  return { pending = "", need = 0, lead = "" }
end

-- An allowed CSI sequence (without its ESC [): its parameters and final.
local function csi_ok(params, final)
  if not CSI_ALLOWED[final] then return false end
  if final == "m" then return params:match("^[0-9;:]*$") ~= nil end
  return params:match("^[0-9;]*$") ~= nil
end

--- Escapes the control sequences of data (see the module's doc) so that it
-- shows as text; state (new_state()) carries an incomplete sequence or
-- UTF-8 character over to the next call.  Returns the bytes to write.
function M.escape(data, state)
  state = state or M.new_state()
  local s = state.pending .. data
  state.pending = ""
  local out, i, n = {}, 1, #s
  while i <= n do
    local b = s:byte(i)
    if state.need > 0 then
      -- inside a UTF-8 character
      if b >= 0x80 and b <= 0xbf then
        state.lead = state.lead .. string.char(b)
        state.need = state.need - 1
        if state.need == 0 then
          local ch = state.lead
          state.lead = ""
          -- U+0080..U+009F: the C1 controls, which some terminals obey
          if ch:byte(1) == 0xc2 and ch:byte(2) <= 0x9f then ch = hex(0xc2) .. hex(ch:byte(2)) end
          out[#out + 1] = ch
        end
        i = i + 1
      else
        -- a broken character: show what came of it, then read b afresh
        for k = 1, #state.lead do out[#out + 1] = hex(state.lead:byte(k)) end
        state.lead, state.need = "", 0
      end
    elseif b == 0x1b then
      local nb = s:byte(i + 1)
      if nb == nil then
        state.pending = "\27" -- wait for what follows
        i = i + 1
      elseif nb == 0x5b then -- CSI
        local j = i + 2
        while j <= n and j - i < CSI_MAX do
          local c = s:byte(j)
          if c >= 0x40 and c <= 0x7e then break end
          if c < 0x20 or c > 0x3f then break end -- not a parameter byte: cut short
          j = j + 1
        end
        local c = s:byte(j)
        if c == nil and j - i < CSI_MAX then
          state.pending = s:sub(i) -- incomplete: wait
          i = n + 1
        elseif c and c >= 0x40 and c <= 0x7e and csi_ok(s:sub(i + 2, j - 1), string.char(c)) then
          out[#out + 1] = s:sub(i, j)
          i = j + 1
        else
          out[#out + 1] = hex(0x1b)
          i = i + 1
        end
      else
        out[#out + 1] = hex(0x1b)
        i = i + 1
      end
    elseif b == 0x09 or b == 0x0a or b == 0x0d or b == 0x08 or (b >= 0x20 and b < 0x7f) then
      -- plain text: copy the run at once
      local j = s:find("[^\t\n\r\8\32-\126]", i) or n + 1
      out[#out + 1] = s:sub(i, j - 1)
      i = j
    elseif b < 0x20 or b == 0x7f then
      out[#out + 1] = hex(b)
      i = i + 1
    elseif b >= 0xc2 and b <= 0xf4 then
      state.lead = string.char(b)
      state.need = b >= 0xf0 and 3 or (b >= 0xe0 and 2 or 1)
      i = i + 1
    else
      -- a lone continuation byte (0x80..0xbf, 8-bit C1 among them) or a
      -- byte that never starts UTF-8
      out[#out + 1] = hex(b)
      i = i + 1
    end
  end
  return table.concat(out)
end

--- What state still holds at the end of a stream, escaped.
function M.flush(state)
  local out = {}
  for k = 1, #state.pending do out[#out + 1] = hex(state.pending:byte(k)) end
  for k = 1, #state.lead do out[#out + 1] = hex(state.lead:byte(k)) end
  state.pending, state.lead, state.need = "", "", 0
  return table.concat(out)
end

--- A function(data) that turns bytes for fd (1 or 2) into what is written:
-- escaped when fd is a terminal and raw is not set, else untouched.
function M.filter(fd, raw)
  if raw or uv.guess_handle(fd) ~= "tty" then return function(data) return data end end
  local state = M.new_state()
  return function(data)
    if data == nil then return M.flush(state) end
    return M.escape(data, state)
  end
end

-- ---- detach keys ----------------------------------------------------------

--- The bytes of a --detach-keys value, docker's syntax: a comma-separated
-- list of "ctrl-X" (X a letter or one of @[\]^_) and single characters.
-- Returns the bytes, or nil and a message.  "" turns detaching off.
function M.parse_detach_keys(spec)
  if spec == "" then return "" end
  local out = {}
  for part in (spec .. ","):gmatch("([^,]*),") do
    local x = part:match("^ctrl%-(.)$")
    if x then
      local up = x:upper():byte()
      if up < 0x40 or up > 0x5f then return nil, ("--detach-keys: ctrl-%s is not a control key"):format(x) end
      out[#out + 1] = string.char(up - 0x40)
    elseif #part == 1 then
      out[#out + 1] = part
    else
      return nil, ("--detach-keys: %q is neither ctrl-X nor one character"):format(part)
    end
  end
  return table.concat(out)
end

M.DEFAULT_DETACH = "\29" -- ctrl-]

-- read_start/read_stop over fd with the loop's file reads, for an fd that
-- epoll refuses (a regular file, /dev/null): the callback gets each chunk,
-- then (nil, nil) at the end, as a stream handle's does.
function M.file_reader(fd)
  local r = { stopped = true }
  function r.read_start(self, cb)
    self.stopped = false
    local function step()
      uv.fs_read(fd, 65536, -1, function(err, data)
        if self.stopped then return end
        if err or data == nil or #data == 0 then
          self.stopped = true
          cb(err, nil)
          return
        end
        cb(nil, data)
        if not self.stopped then step() end
      end)
    end
    step()
  end
  function r.read_stop(self) self.stopped = true end
  return r
end

--- A matcher for the detach sequence keys: feed(chunk) returns the bytes
-- to forward and true once the whole sequence was typed.  A partial match
-- is held back until the next byte tells; bytes typed after the sequence in
-- the same chunk are dropped.
function M.detacher(keys)
  local held = 0
  return function(chunk)
    if keys == "" then return chunk, false end
    local out = {}
    for k = 1, #chunk do
      local ch = chunk:sub(k, k)
      if ch == keys:sub(held + 1, held + 1) then
        held = held + 1
        if held == #keys then return table.concat(out), true end
      else
        if held > 0 then out[#out + 1] = keys:sub(1, held); held = 0 end
        if ch == keys:sub(1, 1) then held = 1 else out[#out + 1] = ch end
        if held == #keys then return table.concat(out), true end
      end
    end
    return table.concat(out), false
  end
end

-- ---- a process on the box's terminal -----------------------------------
--
-- (run_pty with o.attach_pid is `tupper attach`: the same session on a
-- process that already has a terminal)

local function term_size()
  for _, fd in ipairs({ 1, 0, 2 }) do
    if uv.guess_handle(fd) == "tty" then
      local t = uv.new_tty(fd, false)
      local w, h = t:get_winsize()
      t:close()
      if w and w > 0 and h and h > 0 then return math.min(w, 4096), math.min(h, 4096) end
    end
  end
  return 80, 24
end

--- Runs argv in sandbox id on a new terminal of the box (exec -t, run -t)
-- and returns its exit code.  o.interactive sends the CLI's stdin to the
-- terminal (with stdin a terminal: in raw mode, restored on every way out);
-- o.detach (exec only) lets the detach keys (o.detach_keys, default
-- ctrl-]) leave the program running and return 0.  o.attach_pid: instead
-- of starting argv, join that process of the box (it has a terminal).  The terminal's size
-- follows ours (SIGWINCH).  Output is written untouched: -t asked for it.
function M.run_pty(c, id, argv, o)
  local keys = M.DEFAULT_DETACH
  if o.detach_keys then
    local err
    keys, err = M.parse_detach_keys(o.detach_keys)
    if not keys then io.stderr:write("tupper: ", err, "\n"); return 125 end
  end
  if not o.detach then keys = "" end
  local exited, done_cb, pid, detached
  local function wake() if done_cb then local cb = done_cb; done_cb = nil; cb() end end
  -- the terminal as one stream of the data connection (docs/protocol.md,
  -- "Process streams"), where the daemon has them; else base64 in JSON
  local dc = c.server and c.server.process_streams == stream.PROCESS_STREAMS and stream.open(c) or nil
  local term, term_open, term_err -- its stream id; its output not yet ended; why it failed
  c:on("process.output", function(p)
    if p.sandbox == id and p.pid == pid then
      local data = p.data
      if p.encoding ~= "utf8" then data = b64.decode(data) or "" end
      if not io.stdout:write(data) or not io.stdout:flush() then
        uv.tty_reset_mode() -- our terminal is not left raw
        os.exit(141)
      end
    end
  end)
  c:on("process.exit", function(p)
    if p.sandbox == id and p.pid == pid then exited = p; wake() end
  end)
  c.on_close = wake
  local env = {}
  for k, v in pairs(o.env or {}) do env[k] = v end
  if env.TERM == nil then env.TERM = os.getenv("TERM") or "xterm" end
  local cols, rows = term_size()
  local r, err, backlog
  if o.attach_pid then
    -- an existing process: what its terminal showed lately, then the rest
    pid = o.attach_pid
    r, err = c:call("process.connect", { sandbox = id, pid = pid, streams = dc and true or nil })
    if not r and dc and type(err) == "table" and err.data and (err.data.code == "EOPNOTSUPP" or err.data.code == "EBUSY") then
      -- started without streams, or another client reads them: the JSON path
      dc:close(); dc = nil
      r, err = c:call("process.connect", { sandbox = id, pid = pid })
    end
    if r then
      -- written once our terminal is raw: a key typed on seeing it must go to the box
      backlog = {}
      for _, ch in ipairs(r.output or {}) do
        backlog[#backlog + 1] = ch.encoding == "utf8" and ch.data or (b64.decode(ch.data) or "")
      end
      async.spawn(function() c:call("pty.resize", { sandbox = id, pid = pid, cols = cols, rows = rows }) end)
    end
  else
    r, err = c:call("pty.create", { sandbox = id, argv = argv, env = env, cwd = o.workdir,
      cols = cols, rows = rows, streams = dc and true or nil })
  end
  if r and dc and r.streams and r.streams.pty then
    term, term_open = r.streams.pty, true
    async.spawn(function()
      local n, derr = dc:drain(term, function(data)
        if not io.stdout:write(data) or not io.stdout:flush() then
          uv.tty_reset_mode() -- our terminal is not left raw
          os.exit(141)
        end
        return true
      end)
      if not n then term_err = derr end
      term_open = false
      wake()
    end)
  elseif dc then
    dc:close(); dc = nil
  end
  if not r then
    io.stderr:write("tupper: ", type(err) == "table" and tostring(err.message) or tostring(err), "\n")
    local code = type(err) == "table" and err.data and err.data.code
    return (code == "ENOENT") and 127 or (code == "EACCES" and 126 or 125)
  end
  pid = r.pid
  local handles = {}
  -- our size is the box terminal's
  local winch = uv.new_signal()
  handles[#handles + 1] = winch
  winch:start("sigwinch", function()
    local w, h = term_size()
    async.spawn(function() c:call("pty.resize", { sandbox = id, pid = pid, cols = w, rows = h }) end)
  end)
  -- without raw mode, ^C and friends reach us: pass them on
  for _, name in ipairs({ "sigint", "sigterm", "sighup" }) do
    local s = uv.new_signal()
    handles[#handles + 1] = s
    s:start(name, function(signame)
      async.spawn(function()
        c:call("process.signal", { sandbox = id, pid = pid, signal = signame:upper():sub(4) })
      end)
    end)
  end
  local tty_in, is_sending
  if o.interactive then
    local kind = uv.guess_handle(0)
    local input
    if kind == "tty" then
      tty_in = uv.new_tty(0, true)
      tty_in:set_mode(1) -- raw: keys go to the box's terminal, its line discipline does the rest
      -- libuv's raw mode keeps output processing: without this a box's
      -- bare LF (curses uses it to move down) would come out as CR LF.
      -- luv binds no termios; the mode libuv saved is restored at the end
      -- (libuv made fd 0 close-on-exec: stty reads the controlling terminal)
      os.execute("stty -opost </dev/tty 2>/dev/null")
      input = tty_in
    elseif kind == "file" or kind == "unknown" then
      -- a file or /dev/null: epoll takes neither (libuv aborts on a pipe
      -- handle over one), so the loop's file reads feed the same callback
      input = M.file_reader(0)
    else
      input = uv.new_pipe(false)
      input:open(0)
      handles[#handles + 1] = input
    end
    local feed = M.detacher(keys)
    local keyin = term and dc:input(term)
    local queue, sending = {}, false
    is_sending = function() return sending or #queue > 0 end
    local function pump()
      if sending then return end
      sending = true
      async.spawn(function()
        while #queue > 0 and not c.closed do
          local chunk = table.remove(queue, 1)
          if keyin then
            if not keyin:write(chunk) then queue = {} end
          else
            c:call("process.stdin", { sandbox = id, pid = pid, data = b64.encode(chunk) })
          end
        end
        sending = false
      end)
    end
    input:read_start(function(rerr, chunk)
      if rerr or not chunk then input:read_stop(); return end -- end of input: the program goes on
      local fwd, hit = feed(chunk)
      if #fwd > 0 then queue[#queue + 1] = fwd; pump() end
      if hit then detached = true; input:read_stop(); wake() end
    end)
  end
  if backlog then
    io.stdout:write(table.concat(backlog))
    io.stdout:flush()
  end
  -- the end: its exit, and with a stream the terminal's last bytes (END)
  while (not exited or term_open) and not detached and not c.closed do
    async.wait(function(cb) done_cb = cb end)
  end
  -- keys typed before the detach keys still go (for a second at most)
  local drain_until = uv.now() + 1000
  while detached and is_sending and is_sending() and not c.closed and uv.now() < drain_until do async.sleep(5) end
  if tty_in then
    tty_in:set_mode(0)
    uv.tty_reset_mode()
    tty_in:read_stop()
    tty_in:close()
  end
  for _, h in ipairs(handles) do if not h:is_closing() then h:close() end end
  if dc then dc:close() end -- detached: the process goes on unread, `tupper attach` takes it again
  if term_err and exited then
    io.stderr:write("tupper: the terminal's stream failed: ", tostring(term_err.message), "\n")
  end
  if detached and not exited then
    io.stderr:write(("\r\ntupper: detached; process %d keeps running in %s (back: tupper attach %s %d)\r\n")
      :format(pid, id, id, pid))
    return 0
  end
  if not exited then
    io.stderr:write("tupper: lost the connection to the daemon\n")
    return 125
  end
  local sig = math.tointeger(exited.signal) or 0
  if sig > 0 then return 128 + sig end
  return math.tointeger(exited.exit_code) or 125
end


--- tupper attach ID PID: back onto a process's terminal (one exec -t
-- started, detached from or not), with stdin, resize and the detach keys
-- as exec -it.  o: { detach_keys }.  Returns the exit code.
function M.attach(c, o, args)
  local id, pid = args[1], math.tointeger(tonumber(args[2] or ""))
  if not id or not pid or #args ~= 2 then io.stderr:write("tupper: usage: tupper attach ID PID\n"); return 125 end
  local l, err = c:call("process.list", { sandbox = id })
  if not l then io.stderr:write("tupper: attach: ", tostring(type(err) == "table" and err.message or err), "\n"); return 125 end
  local proc
  for _, p in ipairs(l.processes) do if p.pid == pid then proc = p end end
  if not proc then io.stderr:write(("tupper: attach: no process %d in %s (tupper logs %s lists them)\n"):format(pid, id, id)); return 125 end
  if not proc.pty then
    io.stderr:write(("tupper: attach: process %d has no terminal; its output: tupper logs -f %s %d\n"):format(pid, id, pid))
    return 125
  end
  return M.run_pty(c, id, nil, { attach_pid = pid, interactive = true, detach = true, detach_keys = o.detach_keys })
end

return M
