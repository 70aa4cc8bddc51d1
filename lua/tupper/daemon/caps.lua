--- The daemon's caps on sandboxes and their committed memory (tupper
-- daemon --max-sandboxes, --max-memory: docs/limits.md), checked on each
-- create in O(1).  Methods of the daemon (daemon/main.lua mixes them in);
-- pure Lua, so that the unit specs can drive them.
local limits = require("tupper.daemon.limits")
local units = require("tupper.util.units")

local D = {}

--- The daemon's fields for the totals.
function D:_caps_init()
  self.cap_n, self.cap_mem = 0, 0
  self.cap_of = { sandboxes = {}, creating = {}, dying = {} }
end

-- The caps' running totals (issue 14: a create's check was a walk of every
-- sandbox): cap_n and cap_mem count the sandboxes (self.sandboxes), those
-- being made (self.creating) and those being removed (self.dying), and the
-- memory they commit (an unlimited box, or one paused to disk with no box,
-- commits none).  Each table's entries change only through _sb_put,
-- _creating_put and _dying_put, and each remembers in cap_of what it added,
-- so that what goes out takes back exactly what came in.
local function committed(sb)
  return not sb.dormant and sb.limits and sb.limits.memory or 0
end

local function cap_move(self, kind, key, m)
  local of = self.cap_of[kind]
  local old = of[key]
  if old then self.cap_n, self.cap_mem = self.cap_n - 1, self.cap_mem - old end
  of[key] = m
  if m then self.cap_n, self.cap_mem = self.cap_n + 1, self.cap_mem + m end
end

--- Puts sandbox sb (nil: none) under id in self.sandboxes.
function D:_sb_put(id, sb)
  self.sandboxes[id] = sb
  cap_move(self, "sandboxes", id, sb and committed(sb) or nil)
end

--- Counts a create being made (token) with memory m against the caps; nil: done.
function D:_creating_put(token, m)
  self.creating[token] = m
  cap_move(self, "creating", token, m)
end

--- Counts killed sandbox id, whose removal is under way, with memory m; nil: gone.
function D:_dying_put(id, m)
  self.dying[id] = m
  cap_move(self, "dying", id, m)
end

--- The totals by a walk of the three tables (what the running totals must
-- equal: the unit specs compare them).
function D:_caps_walk()
  local count, mem = 0, 0
  for _, sb in pairs(self.sandboxes) do count, mem = count + 1, mem + committed(sb) end
  for _, m in pairs(self.creating) do count, mem = count + 1, mem + m end
  for _, m in pairs(self.dying) do count, mem = count + 1, mem + m end
  return count, mem
end

-- Whether one more sandbox with limits lim fits the daemon's caps (live
-- sandboxes, those being made and those being removed; their committed
-- memory).  replaces: the id of a sandbox the create takes the place of
-- (the sandbox paused to disk this create resumes: daemon/pause.lua), not
-- counted.  O(1): the running totals above.  Returns true or nil, message, data.
function D:_check_caps(lim, replaces)
  local count, mem = self.cap_n, self.cap_mem + (lim.memory or 0)
  local rm = replaces ~= nil and self.cap_of.sandboxes[replaces]
  if rm then count, mem = count - 1, mem - rm end
  local caps = self.caps
  if caps.sandboxes > 0 and count >= caps.sandboxes then
    return nil, limits.cap_error("sandboxes", caps.sandboxes, ("too many sandboxes (%d live)"):format(count))
  end
  if caps.memory > 0 and mem > caps.memory then
    return nil, limits.cap_error("memory", caps.memory,
      ("the sandboxes' memory limits would total %s, over the daemon's cap"):format(
        units.format_size(mem // 1048576 * 1048576)))
  end
  return true
end

return D
