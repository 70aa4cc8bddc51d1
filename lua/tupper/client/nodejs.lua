--- `tupper mcp` and `tupper http`: the MCP server and the HTTP API are
-- written in TypeScript on the SDK (sdk/js); these verbs find its built
-- entry point and run it with node, in the foreground, on the same socket.
--
-- Where the package is looked for, first found wins (docs/mcp.md):
--   $TUPPER_SDK_JS                       the package directory itself
--   $TUPPER_ROOT/sdk/js                  a source tree
--   <dir of tupper>/../sdk/js            a build dir inside the source tree
--   <dir of tupper>/../lib/node_modules/@tupper/sdk
--                                        npm install -g --prefix PREFIX
--   /usr/local/lib/node_modules/@tupper/sdk, /usr/lib/node_modules/@tupper/sdk
-- The node binary is $TUPPER_NODE, else `node` from PATH.
local uv = require("luv")
local async = require("tupper.util.async")
local client = require("tupper.wire.client")
local paths = require("tupper.util.paths")

local M = {}

M.ENTRIES = { mcp = "cli-mcp.js", http = "cli-http.js" }

local function dirname(p)
  return p:match("^(.*)/[^/]*$") or "."
end

--- The directories where the package may be, in order.
function M.candidates()
  local c = {}
  local function add(p)
    if p and p ~= "" then c[#c + 1] = p end
  end
  add(os.getenv("TUPPER_SDK_JS"))
  local root = os.getenv("TUPPER_ROOT")
  if root and root ~= "" then add(root .. "/sdk/js") end
  local exe = uv.exepath()
  if exe then
    local bin = dirname(uv.fs_realpath(exe) or exe)
    add(bin .. "/../sdk/js")
    add(bin .. "/../lib/node_modules/@tupper/sdk")
  end
  add("/usr/local/lib/node_modules/@tupper/sdk")
  add("/usr/lib/node_modules/@tupper/sdk")
  return c
end

--- The entry point's path, or nil and the paths tried.
function M.locate(entry)
  local tried = {}
  for _, dir in ipairs(M.candidates()) do
    local p = dir .. "/dist/" .. entry
    if uv.fs_stat(p) then return p end
    tried[#tried + 1] = p
  end
  return nil, tried
end

local function die(fmt, ...)
  io.stderr:write("tupper: ", fmt:format(...), "\n")
  return 125
end

--- Runs `tupper VERB ARGS` (VERB: mcp or http); g: the global options.
function M.main(verb, args, g)
  local path, tried = M.locate(M.ENTRIES[verb])
  if not path then
    return die("%s: the @tupper/sdk package is not built or not found; tried:\n  %s\n"
      .. "build it (cd sdk/js && npm ci && npm run build) or set TUPPER_SDK_JS to its directory",
      verb, table.concat(tried, "\n  "))
  end
  local socket, help = g.socket, false
  for k, a in ipairs(args) do
    if a == "--socket" then socket = args[k + 1] end
    if a == "--help" or a == "-h" then help = true end
  end
  if not help then
    -- as every client verb does: fail with how to start a daemon when none
    -- answers (or start one with --autostart); the server gets the socket
    -- that answered (a user's own, else the system's)
    local cerr
    async.spawn(function()
      local c, e = client.connect({ socket = socket, state_dir = g.state_dir, autostart = g.autostart })
      if c then socket = c.socket; c:close() else cerr = e end
    end)
    uv.run()
    if cerr then return die("%s: %s", verb, tostring(cerr)) end
  end
  socket = socket or paths.socket()
  local argv = { path, "--socket", socket }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local node = os.getenv("TUPPER_NODE")
  if not node or node == "" then node = "node" end
  local code = 125
  local sigs = {}
  local handle, err
  handle, err = uv.spawn(node, { args = argv, stdio = { 0, 1, 2 } }, function(status, signal)
    code = signal ~= 0 and 128 + signal or status
    for _, s in ipairs(sigs) do s:close() end
    handle:close()
  end)
  if not handle then return die("%s: cannot run %s: %s (set TUPPER_NODE to node's path)", verb, node, tostring(err)) end
  -- the server ends its session (killing an MCP session's sandboxes) on these
  for _, name in ipairs({ "sigint", "sigterm", "sighup" }) do
    local s = uv.new_signal()
    s:start(name, function(signame)
      if handle:is_active() then handle:kill(signame) end
    end)
    sigs[#sigs + 1] = s
  end
  uv.run()
  return code
end

return M
