--- Paths and small files on the host: where the daemon's socket and state
-- live (docs/architecture.md), the default PATH, clean absolute paths, and
-- the few file helpers every subsystem needs (mkdirs, read_file).
local uv = require("luv")

local M = {}

--- The PATH of a box's process and of an image that sets none.
M.DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

M.READ_MAX = 64 * 1024 * 1024 -- bytes read_file reads when the caller gives no bound

local function is_root()
  return uv.getuid() == 0
end

local function env_of(getenv, name)
  local v = (getenv or os.getenv)(name)
  if v and v ~= "" then return v end
end

--- The system daemon's socket (tupper.socket's): /run/tupper/tupper.sock;
-- $TUPPER_SYSTEM_SOCKET names another, for tests.  getenv: os.getenv's
-- stand-in (tests), default os.getenv.
function M.system_socket(getenv)
  return env_of(getenv, "TUPPER_SYSTEM_SOCKET") or "/run/tupper/tupper.sock"
end

--- The socket: $TUPPER_SOCKET, else the system's for root, else
-- $XDG_RUNTIME_DIR/tupper.sock, else /tmp/tupper-UID/tupper.sock.
-- getenv and uid (default: the process's) are for tests.
function M.socket(getenv, uid)
  local env = env_of(getenv, "TUPPER_SOCKET")
  if env then return env end
  uid = uid or uv.getuid()
  if uid == 0 then return M.system_socket(getenv) end
  local run = env_of(getenv, "XDG_RUNTIME_DIR")
  if run then return run .. "/tupper.sock" end
  return "/tmp/tupper-" .. uid .. "/tupper.sock"
end

--- Where a client that was given no socket looks, in order: M.socket(),
-- then, for a user that is not root and named no $TUPPER_SOCKET, the
-- system's (a member of the tupper group reaches the system daemon
-- without setting anything; docs/install.md).  getenv, uid as for socket.
function M.client_sockets(getenv, uid)
  local first = M.socket(getenv, uid)
  local system = M.system_socket(getenv)
  if env_of(getenv, "TUPPER_SOCKET") or first == system then return { first } end
  return { first, system }
end

--- The state directory: /var/lib/tupper for root, else $XDG_DATA_HOME/tupper.
function M.state_dir()
  local env = os.getenv("TUPPER_STATE_DIR")
  if env and env ~= "" then return env end
  if is_root() then return "/var/lib/tupper" end
  local data = os.getenv("XDG_DATA_HOME")
  if not data or data == "" then data = (os.getenv("HOME") or "/tmp") .. "/.local/share" end
  return data .. "/tupper"
end

--- Makes path and its missing parents (mode, default 0755; the umask
-- applies).  Returns true, or nil, err.
function M.mkdirs(path, mode)
  local acc = ""
  for part in path:gmatch("[^/]+") do
    acc = acc .. "/" .. part
    local ok, err, name = uv.fs_mkdir(acc, mode or 493)
    if not ok and name ~= "EEXIST" then return nil, err end
  end
  return true
end

--- The whole of the regular file at path, of at most max bytes (default
-- READ_MAX).  Returns its text, or nil, err (a missing file, another
-- type, too large, a short read).
function M.read_file(path, max)
  max = max or M.READ_MAX
  local fd, err = uv.fs_open(path, "r", 0)
  if not fd then return nil, err end
  local st = uv.fs_fstat(fd)
  if not st or st.type ~= "file" then uv.fs_close(fd); return nil, path .. " is not a regular file" end
  if st.size > max then uv.fs_close(fd); return nil, ("%s is over %d bytes"):format(path, max) end
  local data, rerr = uv.fs_read(fd, st.size, 0)
  uv.fs_close(fd)
  if not data then return nil, rerr end
  if #data ~= st.size then return nil, path .. ": short read" end
  return data
end

--- A clean absolute path: relative paths are taken from base (absolute),
-- `.` and empty parts dropped, `..` goes up (never above /).
function M.clean_path(path, base)
  if path:sub(1, 1) ~= "/" then path = (base or "/") .. "/" .. path end
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." then
      parts[#parts] = nil
    elseif part ~= "." then
      parts[#parts + 1] = part
    end
  end
  return "/" .. table.concat(parts, "/")
end

return M
