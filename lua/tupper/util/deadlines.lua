--- Many short waits on one luv timer, not a timer each (a timer made,
-- started and closed for each wait cost every `tupper exec` its making and
-- closing: docs/benchmarks.md, "`tupper exec ID -- true`").  A set's timer
-- is armed for its earliest entry; when it goes off it calls the entries
-- past due and is armed again for the next, or closed when none is left.
-- An entry's function is called once at most: cancelled, never.
local uv = require("luv")

local M = {}

local Set = {}
Set.__index = Set

--- A new, empty set (it makes its timer on its first entry).
function M.new()
  return setmetatable({ entries = {}, timer = nil, at = nil }, Set)
end

--- Calls fn() ms from now (uv.now()'s clock), unless cancelled first.
-- Returns the entry, for Set:cancel.
function Set:add(ms, fn)
  local now = uv.now()
  local entry = { due = now + ms, fn = fn }
  self.entries[entry] = true
  local timer = self.timer
  -- (closed under it: a shutdown closes every handle the daemon made)
  if not timer or timer:is_closing() then
    timer = uv.new_timer()
    self.timer = timer
  elseif timer:is_active() and self.at <= entry.due then
    return entry
  end
  self.at = entry.due
  timer:start(ms, 0, function() self:_due() end)
  return entry
end

--- The entry's function will not be called.  A cancelled or called entry
-- changes nothing.
function Set:cancel(entry)
  self.entries[entry] = nil
end

function Set:_due()
  local now, next_due, late = uv.now(), nil, nil
  for entry in pairs(self.entries) do
    if entry.due <= now then
      late = late or {}
      late[#late + 1] = entry
    elseif not next_due or entry.due < next_due then
      next_due = entry.due
    end
  end
  if next_due then
    self.at = next_due
    self.timer:start(next_due - now, 0, function() self:_due() end)
  else
    self.timer:close()
    self.timer = nil
  end
  for _, entry in ipairs(late or {}) do
    -- one called before it may have cancelled it
    if self.entries[entry] then
      self.entries[entry] = nil
      entry.fn()
    end
  end
end

return M
