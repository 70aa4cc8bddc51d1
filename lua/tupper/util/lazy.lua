--- Tables made on first use: an __index for a class whose instances leave
-- some table fields unset until something reads them, so that an object
-- nobody has used yet (an idle box's sandbox, its network relay) stays one
-- small table (docs/benchmarks.md, "Loop").
local M = {}

--- The __index of class: its methods and defaults, and for each name in
-- fields a new empty table, stored in the instance, the first time it is
-- read.  (rawget sees nil until then.)
function M.index(class, fields)
  local lazy = {}
  for _, k in ipairs(fields) do lazy[k] = true end
  return function(t, k)
    local v = class[k]
    if v == nil and lazy[k] then
      v = {}
      rawset(t, k, v)
    end
    return v
  end
end

return M
