--- The Lua client of the socket API, used by the CLI (and later the REPL).
-- Calls are asynchronous: use them from a coroutine (tupper.async).
local uv = require("luv")
local async = require("tupper.util.async")
local rpc = require("tupper.wire.rpc")
local paths = require("tupper.util.paths")

local M = {}

M.START_TIMEOUT_MS = 10000

local Client = {}
Client.__index = Client

local function try_connect(path)
  local pipe = uv.new_pipe(false)
  local err = async.wait(function(cb) pipe:connect(path, function(e) cb(e) end) end)
  if err then
    pipe:close()
    return nil, err
  end
  return pipe
end

-- Starts `tupper daemon` in the background (its own session, log in its
-- state dir) and waits until its socket answers.
local function start_daemon(socket, state_dir)
  local state = state_dir or paths.state_dir()
  local args = { "daemon", "--socket", socket, "--log", state .. "/daemon.log" }
  if state_dir then
    args[#args + 1] = "--state-dir"
    args[#args + 1] = state_dir
  end
  local handle, err = uv.spawn(uv.exepath(), { args = args, detached = true }, function() end)
  if not handle then return nil, "cannot start the daemon: " .. tostring(err) end
  handle:unref()
  local deadline = uv.now() + M.START_TIMEOUT_MS
  local delay = 2
  while uv.now() < deadline do
    local pipe = try_connect(socket)
    if pipe then
      handle:close()
      return pipe
    end
    if not handle:is_active() then break end -- the daemon exited
    async.sleep(delay)
    delay = math.min(delay * 2, 50)
  end
  handle:close()
  return nil, ("the daemon did not start (see %s/daemon.log)"):format(state)
end

--- Whether a client starts a private daemon when none answers: opts.autostart
-- when given, else $TUPPER_AUTOSTART (1, true or yes).  Off by default: a
-- verb never starts a daemon (as root, under /run/tupper and /var/lib/tupper)
-- behind its user's back.
function M.autostart(opts)
  if opts and opts.autostart ~= nil then return opts.autostart == true end
  local env = os.getenv("TUPPER_AUTOSTART")
  return env == "1" or env == "true" or env == "yes"
end

-- where a tupper.socket unit may be installed (it listens on
-- paths.system_socket())
M.UNIT_DIRS = { "/etc/systemd/system", "/usr/local/lib/systemd/system", "/lib/systemd/system",
  "/usr/lib/systemd/system" }

--- What to say when no daemon answers at socket: how to start one.
-- tried (optional): every { socket, err } the client tried, in order (a
-- user's own socket, then the system's), all named.
function M.no_daemon(socket, err, tried)
  local system = paths.system_socket()
  local unit = false
  for _, dir in ipairs(M.UNIT_DIRS) do unit = unit or uv.fs_stat(dir .. "/tupper.socket") ~= nil end
  tried = tried or { { socket, err } }
  local where = {}
  for i, t in ipairs(tried) do where[i] = ("%s (%s)"):format(t[1], t[2]) end
  local hint = ""
  local system_tried = false
  for _, t in ipairs(tried) do system_tried = system_tried or t[1] == system end
  if unit and system_tried then
    hint = " or `systemctl start tupper.socket`"
  elseif not system_tried and (uv.fs_stat(system) or {}).type == "socket" then
    hint = (" or use the system's (TUPPER_SOCKET=%s)"):format(system)
  end
  if system_tried and #tried > 1 and tried[#tried][2] == "EACCES" then
    hint = hint .. " (the system's socket is for root and the tupper group: `usermod -aG tupper $USER`)"
  end
  return ("no tupper daemon answers at %s: start one with `%s`%s, or pass --autostart "
    .. "(or set TUPPER_AUTOSTART=1) to start a private one"):format(table.concat(where, " nor at "),
    socket == paths.socket() and "tupper daemon &" or ("tupper daemon --socket " .. socket .. " &"), hint)
end

-- A connection refused or nobody there: try the next place (or start one).
local function absent(err) return err == "ENOENT" or err == "ECONNREFUSED" end

--- Connects to the daemon.  opts: socket, state_dir, autostart (default:
-- M.autostart).  Without opts.socket a user that is not root tries its own
-- socket, then the system's when that one exists (paths.client_sockets).
-- Returns the client or nil, err.
function M.connect(opts)
  opts = opts or {}
  local places = opts.socket and { opts.socket } or paths.client_sockets()
  local socket = places[1]
  local pipe, err = try_connect(socket)
  local tried = { { socket, err } }
  if not pipe and absent(err) and places[2] then
    -- a member of the tupper group reaches the system daemon as it is
    local st, err2 = uv.fs_stat(places[2]), "ENOENT"
    if st and st.type == "socket" then
      local p2
      p2, err2 = try_connect(places[2])
      if p2 then pipe, socket = p2, places[2] end
    elseif st then
      err2 = "not a socket"
    end
    tried[2] = { places[2], err2 }
  end
  if not pipe then
    if not absent(err) then
      return nil, ("cannot reach the daemon at %s: %s"):format(socket, err)
    end
    if not M.autostart(opts) then return nil, M.no_daemon(socket, err, tried) end
    pipe, err = start_daemon(socket, opts.state_dir)
    if not pipe then return nil, err end
  end
  local self = setmetatable({ next_id = 1, pending = {}, subs = {}, closed = false, socket = socket }, Client)
  self.conn = rpc.wrap(pipe, {
    message = function(_, msg) self:_message(msg) end,
    close = function() self:_closed() end,
  })
  local hello, herr = self:call("hello", { protocol = rpc.PROTOCOL, client = "tupper-lua" })
  if not hello then
    self:close()
    return nil, "hello: " .. herr.message
  end
  self.server = hello
  return self
end

function Client:_message(msg)
  if msg == nil then return end
  if msg.method then
    local fn = self.subs[msg.method]
    if fn then fn(msg.params) end
    return
  end
  local id = math.tointeger(msg.id)
  local cb = id and self.pending[id]
  if not cb then return end
  self.pending[id] = nil
  if msg.error then cb(nil, msg.error) else cb(msg.result) end
end

function Client:_closed()
  self.closed = true
  local pending = self.pending
  self.pending = {}
  for _, cb in pairs(pending) do cb(nil, { code = -1, message = "connection to the daemon lost" }) end
  if self.on_close then self.on_close() end
end

--- Calls method; returns the result, or nil and the error object
-- ({code, message, data}).
function Client:call(method, params)
  if self.closed then return nil, { code = -1, message = "not connected" } end
  local id = self.next_id
  self.next_id = id + 1
  return async.wait(function(cb)
    self.pending[id] = cb
    local ok, err = self.conn:send({ jsonrpc = "2.0", id = id, method = method, params = params or {} })
    if not ok then
      self.pending[id] = nil
      cb(nil, { code = -1, message = err })
    end
  end)
end

--- Subscribes fn(params) to a notification method (one subscriber each).
function Client:on(method, fn)
  self.subs[method] = fn
end

function Client:close()
  if not self.closed then self.conn:close() end
end

return M
