--- The backends by name.  Everything above backend/ (the daemon, its
-- sandboxes, the API, the schema) reaches a backend through here, never by
-- requiring it nor by comparing its name.  A backend module has:
--
--   name                the name records, the API and recipes use
--   start(opts)         a new box (core's, or a wrapper with its methods)
--   adopt(opts)         the box a previous daemon started; opts.saved: what
--                       record(box) returned then
--   record(box)         what the sandbox's record keeps for adopt (or nil)
--   awaits_ready(box, adopting)  whether to wait for the agent's READY
--   handshake(sb, opts, adopting)  the first requests after READY
--   ready_timeout_ms    how long the agent may take to say READY
--   guest_kernel        processes run in the box's own kernel (no host
--                       cgroup per process tree)
--   agent_frozen        a pause freezes the agent too
--   guest_pids          the pids limit is enforced inside the box
--   live_limits         limits of a live box can be changed
--   pool                { option, size, delay_ms, label }: warm boxes kept
--                       (size by default, `option` of the daemon's opts)
--   pool_take(boxes, lim, blim, log)  a pooled box for a create, or nil
--   pool_park(sb, stopping)  optional: readies a started box for the pool
--   gc(state_dir)       optional: removes what removed images leave
--
-- A box (what start and adopt return) has at least M.BOX_METHODS; one
-- whose backend has no host cgroup per process tree (guest_kernel) need not
-- have core's tree_* methods.  tests/spec/unit_spec.lua holds every backend
-- to this.
--
-- The list of names is here, not in the backends: `tupper ls` and the
-- schema need it without loading a backend.
local M = {}

--- The backend names, the default first: a new backend is its module,
-- tupper.backend.<name>, and its name here.
M.NAMES = { "linux", "microvm" }
M.DEFAULT = "linux"

--- The methods every box has (see above).
M.BOX_METHODS = { "on", "send", "pid", "queued", "destroy", "freeze", "stats", "has_cgroup",
                  "set_limits", "resolv" }

local MODULES = {}
for _, name in ipairs(M.NAMES) do MODULES[name] = "tupper.backend." .. name end

--- Whether name is a backend's.
function M.known(name)
  return MODULES[name] ~= nil
end

--- The backend module of name (nil: the default), loaded on first use:
-- lazily, since a client verb loads this module for the names alone and
-- must not pay for a backend it never starts.  Raises for an unknown name
-- (the schema refuses those first).
function M.get(name)
  local mod = MODULES[name or M.DEFAULT]
  if not mod then error("unknown backend " .. tostring(name), 2) end
  return require(mod) -- lazy: start-up cost (a client verb needs the names, never a backend)
end

--- The limits of a create (memory, pids, disk, cpus) as backends take
-- them (cpus as a CFS quota and period).
function M.limits(lim)
  return { memory = lim.memory, pids = lim.pids, disk = lim.disk,
           cpu_quota = lim.cpus and math.max(1000, math.floor(lim.cpus * 100000)) or nil,
           cpu_period = lim.cpus and 100000 or nil }
end

--- Calls every backend's gc(state_dir), where it has one.
function M.gc(state_dir)
  for _, name in ipairs(M.NAMES) do
    local b = M.get(name)
    if b.gc then b.gc(state_dir) end
  end
end

return M
