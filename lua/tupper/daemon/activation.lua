--- The daemon under an init system (docs/install.md): the listening socket
-- a socket-activating manager passed in (tupper.socket), and the state
-- notifications of a Type=notify service (tupper.service).
--
-- The protocols are systemd's, read here without libsystemd:
-- sd_listen_fds(3): LISTEN_PID names the process the fds are for (another
-- pid: they are not ours, and ignored), LISTEN_FDS how many there are from
-- fd 3 on, LISTEN_FDNAMES their names; sd_notify(3): NOTIFY_SOCKET is the
-- unix datagram socket that takes "READY=1" and "STOPPING=1".  Every one of
-- these variables is unset once read, so no process the daemon starts
-- inherits them.
local uv = require("luv")
local core = require("tupper.core")

local M = {}

M.FIRST_FD = 3 -- SD_LISTEN_FDS_START

local function unset(names)
  for _, k in ipairs(names) do uv.os_unsetenv(k) end
end

-- a decimal number without sign or spaces, of at most 9 digits
local function count(s)
  if type(s) ~= "string" or not s:match("^%d+$") or #s > 9 then return nil end
  return math.tointeger(tonumber(s))
end

local function shown(s)
  return ("%q"):format(s:sub(1, 40))
end

--- The activated socket: { fd =, path = (the path it is bound to, "" when
-- it has none), name = (its LISTEN_FDNAMES entry or nil) }; false when the
-- daemon was not socket-activated; nil, msg when it was, wrongly (garbage
-- in the variables, more than one fd, an fd that is not a listening unix
-- stream socket).  The fd is made close-on-exec.
function M.listen_socket()
  local pid_s, fds_s = os.getenv("LISTEN_PID"), os.getenv("LISTEN_FDS")
  local names_s = os.getenv("LISTEN_FDNAMES")
  unset({ "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES" })
  if pid_s == nil then return false end
  local pid = count(pid_s)
  if not pid or pid == 0 then return nil, ("socket activation: LISTEN_PID=%s is not a pid"):format(shown(pid_s)) end
  if pid ~= uv.os_getpid() then return false end -- meant for another process
  local n = count(fds_s)
  if not n then
    return nil, ("socket activation: LISTEN_FDS=%s is not a number of fds"):format(shown(fds_s or ""))
  end
  if n ~= 1 then
    return nil, ("socket activation: %d fds passed; the daemon takes exactly one "
      .. "(one ListenStream= in tupper.socket)"):format(n)
  end
  local name
  if names_s then
    if names_s:find(":", 1, true) then
      return nil, ("socket activation: LISTEN_FDNAMES=%s names more fds than LISTEN_FDS=1"):format(shown(names_s))
    end
    name = names_s
  end
  local path, err = core.listen_fd(M.FIRST_FD)
  if not path then return nil, "socket activation: " .. tostring(err) end
  return { fd = M.FIRST_FD, path = path, name = name }
end

--- A function that sends a state ("READY=1") to the service manager and
-- returns true, or nil, msg; without NOTIFY_SOCKET it does nothing and
-- returns true.
function M.notifier()
  local addr = os.getenv("NOTIFY_SOCKET")
  unset({ "NOTIFY_SOCKET" })
  if not addr or addr == "" then return function() return true end end
  return function(state) return core.sd_notify(addr, state) end
end

return M
