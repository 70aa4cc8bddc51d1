--- The daemon's log: one line per event on stderr (or the file core.log_to
-- points it at), with a UTC timestamp.
local M = {}

--- Writes one line: fmt formatted with the arguments, in one write (stderr
-- is unbuffered: each argument of a write was a system call of its own,
-- three a line, two lines a box under churn).
function M.log(fmt, ...)
  io.stderr:write(os.date("!%Y-%m-%dT%H:%M:%SZ ") .. fmt:format(...) .. "\n")
end

return M
