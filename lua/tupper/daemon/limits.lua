--- What keeps one sandbox, and one client, from taking the host down: the
-- limits every box gets when its create names none (relative to the host),
-- and the daemon-wide caps (docs/limits.md).  Pure data and small helpers;
-- the daemon computes both once at start (`tupper daemon --default-* /
-- --max-*` change them) and create.lua and main.lua apply them.
local uv = require("luv")
local units = require("tupper.util.units")

local M = {}

local MiB, GiB = 1024 * 1024, 1024 * 1024 * 1024

M.DEFAULT_PIDS = 1024        -- a fork bomb stops here (the host's pid_max is often 32768)
M.DEFAULT_TIMEOUT = 300      -- seconds a created box lives, as E2B's
M.MAX_SANDBOXES = 1024
M.MAX_CLIENTS = 1024
M.MAX_INFLIGHT = 256         -- requests running at once on one connection
M.MAX_STREAMS = 256          -- fs watches and process attachments of one connection
M.MAX_QUEUED = 64 * MiB      -- bytes written to one connection and not yet read by its client
M.IDLE_TIMEOUT = 600         -- seconds a connection with nothing going on is kept

-- n rounded down to whole MiB (a size people read in sandbox.get)
local function mib(n) return n // MiB * MiB end

--- The host's facts the defaults are relative to: memory (bytes: RAM, or
-- the daemon's own cgroup limit when lower), cpus (usable by the daemon)
-- and disk_free (bytes free where boxes' disks go, the state dir).
function M.host(state_dir)
  local mem = uv.get_total_memory and math.tointeger(math.floor(uv.get_total_memory())) or 0
  local cmem = uv.get_constrained_memory and math.floor(uv.get_constrained_memory()) or 0
  if cmem > 0 and cmem < mem then mem = math.tointeger(cmem) end
  local cpus = uv.available_parallelism and uv.available_parallelism() or #(uv.cpu_info() or {})
  local st = state_dir and uv.fs_statfs(state_dir)
  local free = st and math.tointeger(st.bavail * st.bsize) or nil
  return { memory = mem > 0 and mib(mem) or GiB, cpus = math.max(1, cpus), disk_free = free }
end

--- The limits a box gets for each one its create leaves out: memory
-- min(1 GiB, RAM/4); cpus min(2, the host's); pids 1024; disk min(4 GiB,
-- a quarter of the free space of the state dir's filesystem); timeout 5
-- minutes.  opts: the daemon's options (default_memory, default_cpus,
-- default_pids, default_disk, default_timeout; 0 there: no such limit).
function M.defaults(host, opts)
  opts = opts or {}
  local disk = 4 * GiB
  if host.disk_free then disk = math.max(64 * MiB, math.min(disk, mib(host.disk_free // 4))) end
  local function pick(k, v) if opts["default_" .. k] ~= nil then return opts["default_" .. k] end return v end
  return {
    memory = pick("memory", math.max(64 * MiB, math.min(GiB, mib(host.memory // 4)))),
    cpus = pick("cpus", math.min(2, host.cpus)),
    pids = pick("pids", M.DEFAULT_PIDS),
    disk = pick("disk", disk),
    timeout = pick("timeout", M.DEFAULT_TIMEOUT),
  }
end

--- The daemon-wide caps: sandboxes (live at once), memory (the sum of the
-- memory limits of live sandboxes: the host's memory, so that the limits
-- never promise more than there is), clients (connections at once),
-- inflight (requests running per connection), streams (per connection)
-- queued (bytes waiting for one connection's client to read them) and
-- idle (seconds; 0: no idle timeout).  opts: max_sandboxes, max_memory,
-- max_clients, max_requests, max_streams, max_queued, idle_timeout.
function M.caps(host, opts)
  opts = opts or {}
  return {
    sandboxes = opts.max_sandboxes or M.MAX_SANDBOXES,
    memory = opts.max_memory or host.memory,
    clients = opts.max_clients or M.MAX_CLIENTS,
    inflight = opts.max_requests or M.MAX_INFLIGHT,
    streams = opts.max_streams or M.MAX_STREAMS,
    queued = opts.max_queued or M.MAX_QUEUED,
    idle = opts.idle_timeout or M.IDLE_TIMEOUT,
  }
end

--- The daemon's options for them, as `tupper daemon` takes them: flag ->
-- { key of the daemon's opts, kind }.  kind: "size", "number", "count" (a
-- whole number), "duration".  0 is always allowed: for a default, no such
-- limit; for a cap, none (idle timeout: never).
M.OPTIONS = {
  ["--default-memory"] = { "default_memory", "size" },
  ["--default-cpus"] = { "default_cpus", "number" },
  ["--default-pids"] = { "default_pids", "count" },
  ["--default-disk"] = { "default_disk", "size" },
  ["--default-timeout"] = { "default_timeout", "duration" },
  ["--max-sandboxes"] = { "max_sandboxes", "count" },
  ["--max-memory"] = { "max_memory", "size" },
  ["--max-clients"] = { "max_clients", "count" },
  ["--max-requests"] = { "max_requests", "count" },
  ["--max-streams"] = { "max_streams", "count" },
  ["--max-queued"] = { "max_queued", "size" },
  ["--idle-timeout"] = { "idle_timeout", "duration" },
}

--- Parses the value v of daemon option flag (one of M.OPTIONS); returns
-- the opts key and the value, or nil, err.
function M.parse_option(flag, v)
  local o = M.OPTIONS[flag]
  if not o then return nil, "unknown option " .. tostring(flag) end
  local key, kind = o[1], o[2]
  local n, err
  if v == nil then return nil, flag .. " needs a value" end
  if kind == "size" then
    n, err = units.size(v)
  elseif kind == "duration" then
    n, err = units.duration(v)
  else
    n = tonumber(v)
    if kind == "count" then n = n and math.tointeger(n) end
    if not n or n < 0 or n > 4194304 then err = "wants a number from 0 to 4194304" end
  end
  if err then return nil, ("%s: %s"):format(flag, err) end
  return key, n
end

--- The option that changes cap `name` of M.caps, for error messages.
M.CAP_OPTION = { sandboxes = "--max-sandboxes", memory = "--max-memory", clients = "--max-clients",
                 inflight = "--max-requests", streams = "--max-streams", queued = "--max-queued",
                 idle = "--idle-timeout" }

--- The error message and data of a cap that refused something.
function M.cap_error(name, value, what)
  local shown = (name == "memory" or name == "queued") and units.format_size(value) or tostring(value)
  return ("%s: this daemon's cap is %s (tupper daemon %s)"):format(what, shown, M.CAP_OPTION[name]),
    { cap = name, value = value, option = M.CAP_OPTION[name] }
end

--- Whether limit k can be enforced for a box of backend b (its module:
-- guest_kernel, guest_pids) on this host (enforces: the daemon's set).  A
-- VM's memory, vCPUs and disk are its shape, its pids its guest's cgroup.
function M.enforceable(k, enforces, b)
  b = b or {}
  if enforces[k] then return true end
  if k == "pids" then return b.guest_pids == true end
  return b.guest_kernel == true
end

--- The effective limits of a create: each limit it names (0: none), the
-- default for each it leaves out, where it can be enforced (enforces and b
-- as for enforceable).  Returns limits as sandbox.get shows them (0 for
-- none; a default that cannot be enforced is left out, not an error).
function M.effective(asked, defaults, enforces, b)
  local out = {}
  for _, k in ipairs({ "memory", "cpus", "pids", "disk" }) do
    local v = asked[k]
    if v == nil then
      v = defaults[k]
      if v and v ~= 0 and not M.enforceable(k, enforces, b) then v = nil end
    end
    out[k] = v
  end
  out.timeout = asked.timeout
  if out.timeout == nil then out.timeout = defaults.timeout end
  return out
end

--- The limits as backends take them (backend/registry.lua's limits): 0
-- (none) left out.
function M.for_backend(lim)
  local out = {}
  for k, v in pairs(lim) do if k ~= "timeout" and v ~= 0 then out[k] = v end end
  return out
end

return M
