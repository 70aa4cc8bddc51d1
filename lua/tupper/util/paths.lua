--- Where the daemon's socket and state live (docs/architecture.md).
local M = {}

local function is_root()
  local uv = require("luv")
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
  return "/tmp/tupper-" .. require("luv").getuid() .. "/tupper.sock"
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
  local uv = require("luv")
  local acc = ""
  for part in path:gmatch("[^/]+") do
    acc = acc .. "/" .. part
    local ok, err, name = uv.fs_mkdir(acc, mode or 493)
    if not ok and name ~= "EEXIST" then return nil, err end
  end
  return true
end

return M
