--- The daemon's log: one line per event on stderr (or the file core.log_to
-- points it at), with a UTC timestamp.
local M = {}

--- Writes one line: fmt formatted with the arguments.
function M.log(fmt, ...)
  io.stderr:write(os.date("!%Y-%m-%dT%H:%M:%SZ "), fmt:format(...), "\n")
end

return M
