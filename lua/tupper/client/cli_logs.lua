--- `tupper logs`: a process's output (the daemon's replay ring of its
-- last 64 KiB, then, with -f, what it writes until it exits), the list of
-- a box's processes (no PID; its last exited ones too, with their exit), or
-- the box's network decisions (--network).
-- Output from the box goes through the terminal filter (client/cli_tty.lua)
-- when it lands on a terminal.
local uv = require("luv")
local async = require("tupper.util.async")
local b64 = require("tupper.util.b64")
local json = require("tupper.util.json")
local cli_tty = require("tupper.client.cli_tty")

local M = {}

local function errmsg(e) return type(e) == "table" and tostring(e.message) or tostring(e) end
local function fail(fmt, ...)
  io.stderr:write("tupper: logs: ", fmt:format(...), "\n")
  return 125
end

local function network(c, id, o)
  local r, err = c:call("sandbox.network_log", { id = id })
  if not r then return fail("%s: %s", id, errmsg(err)) end
  if o.json then
    print(json.encode(json.array(r.entries)))
    return 0
  end
  local filter = cli_tty.filter(1)
  for _, e in ipairs(r.entries) do
    local port = math.tointeger(e.port)
    io.stdout:write(filter(("%s %-5s %-11s %s%s%s%s\n"):format(e.time, e.action, e.via, tostring(e.host or "?"),
      port and (":" .. port) or "", e.addr and (" -> " .. e.addr) or "",
      e.reason and ("  (" .. e.reason .. ")") or "")))
  end
  return 0
end

-- How an exit reads: "exited 0", "exited 3", "killed 9", "oom", "timeout".
local function status(e)
  if not e then return "running" end
  if e.oom_killed then return "oom" end
  if e.timed_out then return "timeout" end
  local s = math.tointeger(e.signal) or 0
  if s > 0 then return "killed " .. s end
  return "exited " .. tostring(math.tointeger(e.exit_code) or "?")
end

local function processes(c, id, o)
  local r, err = c:call("process.list", { sandbox = id, exited = true })
  if not r then return fail("%s: %s", id, errmsg(err)) end
  if o.json then
    print(json.encode(json.array(r.processes)))
    return 0
  end
  local filter = cli_tty.filter(1)
  print(("%-8s %-4s %-20s %-10s %s"):format("PID", "TTY", "STARTED", "STATUS", "COMMAND"))
  for _, p in ipairs(r.processes) do
    io.stdout:write(filter(("%-8d %-4s %-20s %-10s %s\n"):format(math.tointeger(p.pid) or 0, p.pty and "yes" or "-",
      tostring(p.started_at), status(p.exit), table.concat(p.argv or {}, " "))))
  end
  return 0
end

-- The last n lines of chunks ({stream, data}), per stream as they came.
local function tail(chunks, n)
  local count, cut = 0, nil
  for i = #chunks, 1, -1 do
    local d = chunks[i].data
    for k = #d, 1, -1 do
      if d:byte(k) == 10 and not (i == #chunks and k == #d) then
        count = count + 1
        if count == n then cut = { i, k }; break end
      end
    end
    if cut then break end
  end
  if not cut then return chunks end
  local out = { { stream = chunks[cut[1]].stream, data = chunks[cut[1]].data:sub(cut[2] + 1) } }
  for i = cut[1] + 1, #chunks do out[#out + 1] = chunks[i] end
  return out
end

--- tupper logs [--network] [--json] [-f] [--tail N] ID [PID]: see
-- docs/cli.md.  o: { network, json, follow, tail }; args: { ID, PID? }.
function M.logs(c, o, args)
  local id, pid = args[1], args[2]
  if not id or #args > 2 then return fail("usage: tupper logs [--network] [-f] [--tail N] [--json] ID [PID]") end
  if o.network then
    if pid then return fail("--network takes no PID") end
    return network(c, id, o)
  end
  if not pid then return processes(c, id, o) end
  pid = math.tointeger(tonumber(pid))
  if not pid or pid < 1 then return fail("PID must be a process id (tupper logs %s lists them)", id) end
  local filters = { stdout = cli_tty.filter(1), stderr = cli_tty.filter(2) }
  local function emit(stream, data)
    if o.json then
      local text = utf8.len(data) and not data:find("\0", 1, true)
      print(json.encode({ stream = stream, data = text and data or b64.encode(data),
                          encoding = text and "utf8" or "base64" }))
      return
    end
    local f = stream == "stderr" and io.stderr or io.stdout
    local filter = filters[stream] or filters.stdout
    if not f:write(filter(data)) or not f:flush() then os.exit(141) end
  end
  local exited, done_cb
  local function wake() if done_cb then local cb = done_cb; done_cb = nil; cb() end end
  local early = {} -- what arrives between the reply and our loop (nothing: see api.process_connect)
  if o.follow then
    c:on("process.output", function(p)
      if p.sandbox ~= id or p.pid ~= pid then return end
      local data = p.encoding == "utf8" and p.data or (b64.decode(p.data) or "")
      if early then early[#early + 1] = { stream = p.stream, data = data } else emit(p.stream, data) end
    end)
    c:on("process.exit", function(p)
      if p.sandbox == id and p.pid == pid then exited = p; wake() end
    end)
    c.on_close = wake
  end
  -- exited = true: a process that has exited is still shown (the daemon
  -- keeps the box's last 16), its exit in the reply
  local r, err = c:call("process.connect", { sandbox = id, pid = pid, exited = true })
  if not r then return fail("%s %d: %s", id, pid, errmsg(err)) end
  if r.exit then exited = r.exit end
  local chunks = {}
  for i, ch in ipairs(r.output or {}) do
    chunks[i] = { stream = ch.stream, data = ch.encoding == "utf8" and ch.data or (b64.decode(ch.data) or "") }
  end
  if o.tail then chunks = tail(chunks, o.tail) end
  if (math.tointeger(r.dropped) or 0) > 0 and not o.tail and not o.json then
    io.stderr:write(("tupper: logs: %d earlier bytes are no longer kept\n"):format(math.tointeger(r.dropped)))
  end
  for _, ch in ipairs(chunks) do emit(ch.stream, ch.data) end
  if not o.follow then return 0 end
  for _, ch in ipairs(early) do emit(ch.stream, ch.data) end
  early = nil
  -- ^C ends the following, not the process
  local sig = uv.new_signal()
  local stopped = false
  sig:start("sigint", function() stopped = true; wake() end)
  if not exited and not c.closed and not stopped then async.wait(function(cb) done_cb = cb end) end
  sig:close()
  for _, f in pairs(filters) do
    local rest = f(nil)
    if rest and #rest > 0 then io.stdout:write(rest) end
  end
  if stopped then return 0 end
  if not exited then return fail("lost the connection to the daemon") end
  local s = math.tointeger(exited.signal) or 0
  if s > 0 then return 128 + s end
  return math.tointeger(exited.exit_code) or 0
end

return M
