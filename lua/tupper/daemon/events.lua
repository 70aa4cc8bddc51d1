--- What boxes tell the daemon's clients: process output (and its ring for
-- process.connect), exits and file-watch events.  Methods of the daemon
-- (daemon/main.lua mixes them in).
local api = require("tupper.daemon.api")
local json = require("tupper.util.json")

local RING_MAX = 65536 -- bytes of recent output kept per process for process.connect

local D = {}

-- The last RING_MAX bytes of a process's output, for process.connect.
local function ring_add(proc, stream, data)
  local ring = proc.ring
  if not ring then ring = {}; proc.ring = ring; proc.ring_bytes = 0 end
  ring[#ring + 1] = { stream = stream, data = data }
  proc.ring_bytes = proc.ring_bytes + #data
  local drop = 0
  while proc.ring_bytes - #ring[drop + 1].data >= RING_MAX do
    drop = drop + 1
    proc.ring_bytes = proc.ring_bytes - #ring[drop].data
    proc.ring_dropped = (proc.ring_dropped or 0) + #ring[drop].data
  end
  if drop > 0 then
    local n = #ring
    table.move(ring, drop + 1, n, 1)
    for i = n - drop + 1, n do ring[i] = nil end
  end
  if proc.ring_bytes > RING_MAX then -- one chunk larger than the ring: keep its tail
    local c = ring[1]
    local cut = proc.ring_bytes - RING_MAX
    c.data = c.data:sub(cut + 1)
    proc.ring_bytes = proc.ring_bytes - cut
    proc.ring_dropped = (proc.ring_dropped or 0) + cut
  end
end

function D:_output(sb, proc, stream, data)
  -- a process started with streams keeps its ring in C (stream_proc.c)
  if not proc.streamed then ring_add(proc, stream, data) end
  local conn = proc.owner
  local msg = { sandbox = sb.id, pid = proc.pid, stream = stream }
  -- a process started with streams tells its owner nothing here: this is
  -- output nobody reads on a stream (its data connection went)
  if conn and not conn.closed and not proc.streamed then
    msg.data, msg.encoding = api.encode_data(data, proc.encoding)
    conn:notify("process.output", msg)
  end
  for l, enc in pairs(proc.listeners or {}) do
    if l.closed then
      proc.listeners[l] = nil
    elseif enc ~= "streams" then -- a listener with streams reads it there
      msg.data, msg.encoding = api.encode_data(data, enc)
      l:notify("process.output", msg)
    end
  end
end

function D:_exit(sb, proc)
  local msg = { sandbox = sb.id, pid = proc.pid, exit_code = proc.exit_code,
                signal = proc.signal, timed_out = proc.timed_out or nil,
                oom_killed = proc.oom_killed } -- its memory limit killed it
  local conn = proc.owner
  if conn and not conn.closed then conn:notify("process.exit", msg) end
  for l in pairs(proc.listeners or {}) do
    if not l.closed and l ~= conn then l:notify("process.exit", msg) end
  end
end

function D:_watch_event(sb, w, kind, name, message)
  local conn = w.owner
  if kind == "end" and conn.watches then conn.watches[w] = nil end
  if conn.closed then return end
  local text, raw = json.text(name) -- name_raw: the exact bytes of a name that is not UTF-8
  conn:notify("fs.event", { sandbox = sb.id, watch = w.id, type = kind, name = text, name_raw = raw,
    message = message })
end

return D
