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

--- The socket: $TUPPER_SOCKET, else /run/tupper/tupper.sock for root, else
-- $XDG_RUNTIME_DIR/tupper.sock.
function M.socket()
  local env = os.getenv("TUPPER_SOCKET")
  if env and env ~= "" then return env end
  if is_root() then return "/run/tupper/tupper.sock" end
  local run = os.getenv("XDG_RUNTIME_DIR")
  if run and run ~= "" then return run .. "/tupper.sock" end
  return "/tmp/tupper-" .. uv.getuid() .. "/tupper.sock"
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
