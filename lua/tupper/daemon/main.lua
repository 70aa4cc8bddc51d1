--- `tupper daemon`: owns every sandbox on the host and serves the socket API.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")
local units = require("tupper.util.units")
local rpc = require("tupper.wire.rpc")
local schema = require("tupper.wire.schema")
local api = require("tupper.daemon.api")
local sandbox = require("tupper.daemon.sandbox")
local log = require("tupper.daemon.log").log
local guard = require("tupper.recipe.guard")
local build = require("tupper.recipe.build")
local policy = require("tupper.recipe.policy")
local layers = require("tupper.image.layers")
local images = require("tupper.image.store")
local debian = require("tupper.image.debian")
local netrelay = require("tupper.net.relay")
local backends = require("tupper.backend.registry")
local activation = require("tupper.daemon.activation")
local limits = require("tupper.daemon.limits")
local handles = require("tupper.daemon.handles")
-- the daemon's methods, by what they do (mixed into Daemon below)
local PARTS = { require("tupper.daemon.pool"), require("tupper.daemon.create"), require("tupper.daemon.caps"),
                require("tupper.daemon.life"), require("tupper.daemon.events"),
                require("tupper.daemon.recover"), require("tupper.daemon.pause"),
                require("tupper.daemon.vmsnap"),
                (require("tupper.daemon.snapshots")), (require("tupper.daemon.disk_pool")) } -- (): require also returns the path

local M = {}

M.UID_BASE = 100000000
-- methods that subscribe a connection to a stream of notifications
-- (counted against the daemon's streams cap, daemon/limits.lua)
local STREAM_METHODS = { ["fs.watch"] = true, ["process.connect"] = true, ["sandbox.expose"] = true }
-- methods whose work holds a thread of libuv's pool (a box's start, a
-- freeze, a snapshot, a volume's image; a pull's downloads, an import's
-- unpacks): a few of one connection run at once, M.POOL_CALLS of each
-- line, the rest wait in that connection's line, not in the pool's queue
-- ahead of other clients' work.  A kill is in no line: it must never wait
-- behind a slow create (a recipe's setup) of its own connection.
local POOL_METHODS = { ["sandbox.create"] = "box", ["sandbox.pause"] = "box",
  ["sandbox.resume"] = "box", ["sandbox.snapshot"] = "box", ["sandbox.fork"] = "box",
  ["snapshot.delete"] = "box", ["volume.create"] = "box", ["volume.destroy"] = "box",
  ["image.pull"] = "image", ["image.import"] = "image" }
-- box: twice libuv's 4 threads (another client waits behind two rounds of
-- them at most, one client's creates still fill the pool); image: what the
-- pool's long lane runs at once (runtime/host/job.c)
M.POOL_CALLS = { box = 8, image = 2 }

-- Waits (in the request's coroutine) for a place in conn's line: fewer
-- than M.POOL_CALLS[line] of its calls of that line running, in the order
-- they came.
local function pool_turn(conn, line)
  conn.pool_lines = conn.pool_lines or {}
  local l = conn.pool_lines[line]
  if not l then
    l = { running = 0, waiting = {} }
    conn.pool_lines[line] = l
  end
  if l.running >= M.POOL_CALLS[line] then
    local q = l.waiting
    async.wait(function(cb) q[#q + 1] = cb end)
    -- pool_done handed its place over: counted already
  else
    l.running = l.running + 1
  end
end

local function pool_done(conn, line)
  local l = conn.pool_lines[line]
  if #l.waiting > 0 then
    table.remove(l.waiting, 1)() -- the place goes to the next call in line
  else
    l.running = l.running - 1
  end
end

local Daemon = {}
Daemon.__index = Daemon

--- An 8-hex-digit tag of a path (FNV-1a), naming this daemon's cgroups.
function M.tag(path)
  local h = 0xcbf29ce484222325
  for i = 1, #path do
    h = (h ~ path:byte(i)) * 0x100000001b3
  end
  return ("%08x"):format(h & 0xffffffff)
end

M.log = log

local mkdirs = paths.mkdirs

for _, part in ipairs(PARTS) do
  for k, v in pairs(part) do Daemon[k] = v end
end

function Daemon:_request(conn, msg)
  local id = msg.id
  local is_call = id ~= nil
  if is_call and not rpc.valid_id(id) then
    return conn:error(nil, rpc.INVALID_REQUEST, "'id' must be a string or a number")
  end
  if msg.jsonrpc ~= "2.0" or type(msg.method) ~= "string" then
    return conn:error(id, rpc.INVALID_REQUEST, "not a JSON-RPC 2.0 request")
  end
  if self.pool_timer and self.pool_timer:is_active() then self:_fill_pool() end
  local handler = api.lookup(msg.method)
  if not handler then
    if is_call then return conn:error(id, rpc.METHOD_NOT_FOUND, ("unknown method '%s'"):format(msg.method:sub(1, 100))) end
    return
  end
  local params, err = schema.validate(msg.method, msg.params)
  if not params then
    if is_call then return conn:error(id, rpc.INVALID_PARAMS, msg.method .. ": " .. err) end
    return
  end
  local inflight = conn.inflight or 0
  -- requests one connection may have running at once: each is a coroutine
  -- and may wait on a box; past the cap a call is answered -32004 at once
  local caps = self.caps
  if caps.inflight > 0 and inflight >= caps.inflight then
    if is_call then
      local m, data = limits.cap_error("inflight", caps.inflight,
        ("too many requests in flight on this connection (%d)"):format(inflight))
      return conn:error(id, rpc.BUSY, m, data)
    end
    return
  end
  if STREAM_METHODS[msg.method] and caps.streams > 0 then
    local n = self:_streams_of(conn)
    if n >= caps.streams then
      if is_call then
        local m, data = limits.cap_error("streams", caps.streams,
          ("too many watches, process attachments and port forwards on this connection (%d)"):format(n))
        return conn:error(id, rpc.BUSY, m, data)
      end
      return
    end
  end
  local loaded
  if msg.method == "sandbox.create" and (params.recipe or params.template) then
    params, loaded = self:_recipe_params(params)
    if not params then
      if is_call then return conn:error(id, rpc.SANDBOX_ERROR, loaded) end
      return
    end
  end
  conn.inflight = inflight + 1
  async.spawn(function()
    -- the policies first (an fs call's account is looked up in the box)
    local gok, checked, gerr, gcode, gdata = xpcall(guard.check, debug.traceback, self, msg.method, params)
    if not gok or not checked then
      conn.inflight = conn.inflight - 1
      if not gok then log("internal error in the policy check of %s: %s", msg.method, tostring(checked)) end
      if is_call then
        if not gok then return conn:error(id, rpc.INTERNAL_ERROR, "internal error") end
        return conn:error(id, gcode or rpc.POLICY_DENIED, gerr, gdata)
      end
      return
    end
    params = checked
    if loaded then params._recipe = loaded end -- internal, after the policies
    -- their replies are C's (api_stream.lua): the attach's, and an fd's
    if msg.method == "stream.attach" or api.SENDS_OWN_REPLY[msg.method] then params._rpc_id = id end
    local sid = params.sandbox or params.id
    if type(sid) == "string" and self.sandboxes[sid] then
      self:_use(conn, sid) -- not idle while that box lives
    end
    local line = POOL_METHODS[msg.method]
    if line then pool_turn(conn, line) end
    local ok, res, code, message, data = xpcall(handler, debug.traceback, self, conn, params)
    if line then pool_done(conn, line) end
    conn.inflight = conn.inflight - 1
    if not is_call then return end
    if not ok then
      log("internal error in %s: %s", msg.method, tostring(res))
      return conn:error(id, rpc.INTERNAL_ERROR, "internal error")
    end
    if res == nil then return conn:error(id, code or rpc.INTERNAL_ERROR, message or "failed", data) end
    if res == api.SENT then return end -- the handler sent its reply itself (with an fd)
    if msg.method == "sandbox.create" and type(res.id) == "string" then
      self:_use(conn, res.id)
    elseif msg.method == "sandbox.expose" then
      conn.exposes = conn.exposes or {}
      conn.exposes[params.id .. ":" .. params.port] = params.id
    end
    conn:reply(id, res)
  end)
end

-- conn used sandbox id: the connection is not idle while it lives
-- (Daemon:_idle).  The ids of sandboxes gone are dropped once the set has
-- doubled since the last time, so that a client that creates and kills in
-- a loop (and so is never idle) keeps a set the size of what it holds, not
-- of every box it ever made.
function Daemon:_use(conn, id)
  local uses = conn.uses
  if not uses then
    uses = {}
    conn.uses, conn.uses_n, conn.uses_cap = uses, 0, 16
  end
  if uses[id] then return end
  uses[id] = true
  local n = conn.uses_n + 1
  if n > conn.uses_cap then
    n = 0
    for k in pairs(uses) do
      if self.sandboxes[k] then n = n + 1 else uses[k] = nil end
    end
    conn.uses_cap = math.max(16, 2 * n)
  end
  conn.uses_n = n
end

-- The fs watches, process attachments (process.connect) and port forwards
-- (sandbox.expose, while their box lives) a connection holds.
function Daemon:_streams_of(conn)
  local n = 0
  for _ in pairs(conn.watches or {}) do n = n + 1 end
  for key, id in pairs(conn.exposes or {}) do
    if self.sandboxes[id] then n = n + 1 else conn.exposes[key] = nil end
  end
  for _, sb in pairs(self.sandboxes) do
    for _, proc in pairs(sb.procs or {}) do
      if proc.listeners and proc.listeners[conn] then n = n + 1 end
    end
  end
  return n
end

-- Whether a connection is idle: no request running, and nothing it would
-- miss by going (no watch, no process of its own or attached to, no box
-- that dies with it), and no live sandbox it made or used (an SDK's
-- Sandbox object keeps one connection for its box, however quiet).  An
-- idle one is closed after the idle timeout.
function Daemon:_idle(conn)
  if (conn.inflight or 0) > 0 or next(conn.watches or {}) or next(conn.owned or {}) then return false end
  for id in pairs(conn.uses or {}) do
    if self.sandboxes[id] then return false end
    conn.uses[id] = nil
  end
  for _, sb in pairs(self.sandboxes) do
    for _, proc in pairs(sb.procs or {}) do
      if proc.owner == conn or (proc.listeners and proc.listeners[conn]) then return false end
    end
  end
  return true
end

-- The loop-lag probe: a timer every LAG_EVERY_MS that measures its own
-- lateness.  A loop held LAG_LOG_MS or more (by work done on it, or by the
-- host not scheduling the daemon) is said in the log, at most once every
-- LAG_QUIET_MS (sooner for a hold longer than the last one said), with the
-- longest hold since the last such line.
Daemon.LAG_EVERY_MS, Daemon.LAG_LOG_MS, Daemon.LAG_QUIET_MS = 100, 250, 60000

function Daemon:_start_lag_probe()
  local t = uv.new_timer()
  local due = uv.now() + self.LAG_EVERY_MS
  local worst, said, said_ms = 0, nil, 0
  t:start(self.LAG_EVERY_MS, self.LAG_EVERY_MS, function()
    local now = uv.now()
    local late = now - due
    due = now + self.LAG_EVERY_MS
    if late > worst then worst = late end
    if worst >= self.LAG_LOG_MS and (not said or now - said >= self.LAG_QUIET_MS or worst > said_ms) then
      log("the daemon's loop was held %d ms (the longest since the last such line): every client waited that long",
          worst)
      said, said_ms, worst = now, worst, 0
    end
  end)
  t:unref()
  self.lag_timer = t
end

-- Closes the connections idle for longer than the idle timeout (a
-- periodic sweep: a quarter of the timeout, at most every 5 s).
function Daemon:_start_idle_sweep()
  local idle = self.caps.idle
  if idle <= 0 then return end
  local every = math.max(50, math.min(5000, math.floor(idle * 250)))
  self.idle_timer = uv.new_timer()
  self.idle_timer:start(every, every, function()
    local now = uv.now()
    for conn in pairs(self.clients) do
      if not conn.closed and now - (conn.last_active or now) >= idle * 1000 then
        if self:_idle(conn) then
          log("closing a connection idle for %gs (tupper daemon --idle-timeout)", idle)
          conn:close()
        else
          conn.last_active = now -- busy: its idle time starts when it is done
        end
      end
    end
  end)
end

function Daemon:_accept()
  local client = uv.new_pipe(false)
  if not self.server:accept(client) then client:close(); return end
  local caps = self.caps
  if caps.clients > 0 and self.nclients >= caps.clients then
    -- told why before the close, as one JSON-RPC error (id null)
    local m, data = limits.cap_error("clients", caps.clients, "too many connections")
    local c = rpc.wrap(client, { message = function() end })
    c:error(nil, rpc.BUSY, m, data)
    c:close()
    return
  end
  self.nclients = self.nclients + 1
  local conn
  conn = rpc.wrap(client, {
    message = function(c, msg, err)
      c.last_active = uv.now()
      if not msg then return c:error(nil, rpc.PARSE_ERROR, "parse error: " .. tostring(err)) end
      if msg[1] ~= nil then return c:error(nil, rpc.INVALID_REQUEST, "batch requests are not supported") end
      self:_request(c, msg)
    end,
    close = function()
      self.nclients = self.nclients - 1
      self.clients[conn] = nil
      -- sandboxes created with kill_on_disconnect go with their client
      for id in pairs(conn.owned or {}) do
        async.spawn(function() self:kill_sandbox(id) end)
      end
      -- and its watches: nobody would get their events
      for w, sb in pairs(conn.watches or {}) do
        async.spawn(function() sb:unwatch(w) end)
      end
      conn.watches = nil
    end,
  }, { max_backlog = caps.queued, hold_replies = true, on_backlog = function(_, bytes)
    -- nobody reads: the client cannot be told, the log says why
    log("%s", (limits.cap_error("queued", caps.queued,
      ("a client closed: %d bytes queued on its connection, not read"):format(bytes))))
  end })
  conn.last_active = uv.now()
  self.clients[conn] = true
end

function Daemon:shutdown()
  if self.stopping then return end
  self.stopping = true
  log("shutting down")
  async.spawn(function()
    if self.server and not self.server:is_closing() then self.server:close() end
    -- an activated socket's path belongs to the service manager (tupper.socket)
    if not self.activated then uv.fs_unlink(self.socket) end
    self.notify("STOPPING=1")
    for id, sb in pairs(self.sandboxes) do
      -- paused to disk: kept for the next daemon, its box removed (daemon/pause.lua)
      if sb.persist then self:_pause_park(sb)
      elseif sb.destroy then self:kill_sandbox(id) end
    end
    if self.pool_timer then self.pool_timer:close(); self.pool_timer = nil end
    if self.pool_hold_timer then self.pool_hold_timer:close(); self.pool_hold_timer = nil end
    if self.idle_timer then self.idle_timer:close(); self.idle_timer = nil end
    require("tupper.daemon.metrics").stop(self)
    if self.lag_timer then self.lag_timer:close(); self.lag_timer = nil end
    for _, pull in pairs(self.pulls) do if pull.session then pull.session:cancel() end end
    for _, pool in ipairs(self.pools) do
      local boxes = pool.boxes
      pool.boxes = {}
      for _, sb in ipairs(boxes) do sb:destroy() end
    end
    for sb in pairs(self.setups) do sb:destroy() end -- their builds fail and clean up
    debian.cancel_all() -- Debian image builds too
    while self.filling do async.sleep(5) end
    self:wait_dying() -- the removals that kills left in the pool
    -- no box is left to take them: the spare dirs and records go too
    -- (daemon/recover.lua), a stopped daemon's boxes/ is empty
    if self.spare_dir then
      local spare = self.spare_dir
      self.spare_dir = nil
      local ok, err = core.rmtree(spare)
      if not ok then log("cannot remove %s: %s", spare, err) end
    end
    for conn in pairs(self.clients) do conn:close() end
    core.cgroup_prune()
    self:_disk_pool_close() -- its boxes are gone
    -- everything is gone: a late SIGTERM (a second Ctrl-C) must not make
    -- a clean exit look like a death by signal
    for _, s in ipairs(self.signals) do s:close() end
    core.ignore_stop_signals()
    if self.lock then uv.fs_close(self.lock); self.lock = nil end
  end)
end

local function listen(path, activated)
  if activated then
    -- the manager's socket, already bound and listening (activation.lua)
    local server = uv.new_pipe(false)
    local ok, err = server:open(activated.fd)
    if not ok then server:close(); return nil, ("socket activation: fd %d: %s"):format(activated.fd, err) end
    return server
  end
  local probe = uv.new_pipe(false)
  local live = async.wait(function(cb)
    probe:connect(path, function(err) cb(err == nil) end)
  end)
  probe:close()
  if live then return nil, "a daemon already listens on " .. path end
  uv.fs_unlink(path)
  local server = uv.new_pipe(false)
  local old = core.umask(tonumber("177", 8))
  local ok, err = server:bind(path)
  core.umask(old)
  if not ok then server:close(); return nil, ("bind %s: %s"):format(path, err) end
  uv.fs_chmod(path, tonumber("600", 8))
  return server
end

M.GC_PAUSE = 150 -- the collector's pause, percent (M.run)

--- Runs the daemon until SIGTERM/SIGINT.  opts: socket, state_dir, uid_base.
-- Returns the exit code.
function M.run(opts)
  -- every luv handle made from here on is known to the shutdown
  handles.track()
  -- A cycle of the collector starts once the heap is 1.5 times what the
  -- last one left (Lua's default: 2 times).  Most of the daemon's heap is
  -- its boxes' state, which lives long, so the default let the heap (and
  -- the RSS, which keeps its high-water mark) grow by as much garbage
  -- again as the boxes hold: 1.3 MiB less at 1,000 idle boxes, no slower
  -- creates (docs/benchmarks.md, "Loop").  The generational collector was
  -- measured and is not taken yet ("The loop's Lua work"; again, with pause
  -- 200, under churn beside 1,000 idle boxes: no faster, "The loop's Lua
  -- per create and start").
  collectgarbage("incremental", M.GC_PAUSE)
  -- malloc keeps the heap's top between the collector's bursts of frees
  -- rather than unmapping and faulting it in again (l_util.c)
  core.keep_heap()
  local self = setmetatable({ sandboxes = {}, clients = {}, nclients = 0, signals = {}, enforces = {},
    reserved = {}, pulls = {}, setups = {}, pools = {}, creating = {}, dying = {}, dying_waiters = {}, pool_limits = {},
    accounts = {}, -- image digest -> its default account { name, home }
    socket = opts.socket or paths.socket(), state = opts.state_dir or paths.state_dir(),
    uid_base = opts.uid_base or M.UID_BASE }, Daemon)
  self:_caps_init()
  -- before anything starts a process: these variables must not leak to it
  local activated, aerr = activation.listen_socket()
  self.notify = activation.notifier()
  if activated then
    self.activated = activated
    if activated.path ~= "" then self.socket = activated.path end
  end
  -- one pool per backend, in the registry's order (by index, and by name)
  for _, name in ipairs(backends.NAMES) do
    local b = backends.get(name)
    local pool = { backend = b, size = opts[b.pool.option] or b.pool.size, boxes = {} }
    self.pools[#self.pools + 1] = pool
    self.pools[name] = pool
  end
  local code = 0
  async.spawn(function()
    local ok, err = activated ~= nil, aerr
    if ok then ok, err = mkdirs(self.state, tonumber("711", 8)) end
    if ok then ok, err = uv.fs_chmod(self.state, tonumber("711", 8)) end
    if ok and not self.activated then ok, err = mkdirs(self.socket:match("^(.*)/[^/]*$") or ".", tonumber("700", 8)) end
    if ok and opts.log then ok, err = core.log_to(opts.log) end
    -- the backends' own daemon options (the microVMs' --accel)
    for _, name in ipairs(backends.NAMES) do
      local b = backends.get(name)
      if ok and b.configure then ok, err = b.configure(opts) end
    end
    -- the daemon's own environment, never a client: a hosts file and an
    -- upstream resolver for the network relay (tests, split-view hosts)
    if ok then
      ok, err = netrelay.configure({ hosts = os.getenv("TUPPER_NET_HOSTS"),
                                     resolver = os.getenv("TUPPER_NET_RESOLVER") })
    end
    if ok and opts.policy then
      -- the daemon's own policy binds every sandbox, whatever clients send
      self.policy, err = policy.load(opts.policy)
      ok = self.policy ~= nil
    end
    if ok then
      self.lock, err = core.lock(self.state .. "/lock")
      ok = self.lock ~= nil
    end
    if ok then
      self.boxes = self.state .. "/boxes"
      ok, err = mkdirs(self.boxes, tonumber("711", 8))
    end
    if ok then
      -- cgroups of boxes carry a tag of the state dir: two daemons on one
      -- host never touch each other's boxes
      self.tag = M.tag(uv.fs_realpath(self.state) or self.state)
      local info, cgerr = core.cgroup_init(opts.cgroup_root)
      if info then
        self.cgroups = info
        self.enforces = { memory = info.memory, pids = info.pids, cpus = info.cpu,
                          pause = info.freezer }
      else
        log("no usable cgroups (%s): limits, pause and whole-tree kill are off", cgerr)
      end
      -- the disk cap puts the box's writable layer on an ext4 image
      self.enforces.disk = uv.fs_access("/dev/loop-control", "rw") and
        (uv.fs_access("/sbin/mkfs.ext4", "x") or uv.fs_access("/usr/sbin/mkfs.ext4", "x")) or nil
      -- the default limits and the daemon's caps, relative to this host
      self.host = limits.host(self.state)
      self.defaults = limits.defaults(self.host, opts)
      self.caps = limits.caps(self.host, opts)
      for _, name in ipairs(backends.NAMES) do
        local b = backends.get(name)
        self.pool_limits[name] = limits.effective({}, self.defaults, self.enforces, b)
      end
      local d = self.defaults
      log("default limits: memory %s, cpus %g, pids %d, disk %s, timeout %gs; caps: %d sandboxes, "
          .. "memory %s, %d clients, %d requests, %d streams and %s queued per client, idle timeout %gs",
          units.format_size(d.memory), d.cpus, d.pids, units.format_size(d.disk), d.timeout,
          self.caps.sandboxes, units.format_size(self.caps.memory), self.caps.clients,
          self.caps.inflight, self.caps.streams, units.format_size(self.caps.queued), self.caps.idle)
    end
    if ok then ok, err = mkdirs(self.state .. "/images/default", tonumber("711", 8)) end
    if ok then
      self.default_image = self.state .. "/images/default/rootfs"
      ok, err = core.default_image(self.default_image, self.uid_base, self.uid_base)
    end
    if ok then
      self.layer_store, err = layers.open(self.state .. "/layers")
      ok = self.layer_store ~= nil
    end
    if ok then ok, err = self:_disk_pool_open() end
    if ok then ok, err = self:_snapshots_open() end
    if ok then
      self.images, err = images.open(self.state .. "/images", { uid_base = self.uid_base,
        id_count = sandbox.ID_COUNT, default_layers = { self.default_image }, log = log,
        default_digest = function() return build.default_digest(self) end,
        pulling = function() return next(self.pulls) ~= nil end,
        limits = opts.max_layer and { max_tar_bytes = opts.max_layer, max_bytes = opts.max_layer } or nil,
        in_use = function() return self:_images_in_use() end })
      ok = self.images ~= nil
    end
    if ok then
      self:_recover()
      self:_disk_pool_sweep()
      if self.cgroups then self:_sweep_cgroups() end
    end
    if ok then
      self.server, err = listen(self.socket, self.activated)
      ok = self.server ~= nil
    end
    if not ok then
      io.stderr:write("tupper daemon: ", tostring(err), "\n")
      code = 1
      if next(self.sandboxes) == nil then self:_disk_pool_close() end
      if self.lock then uv.fs_close(self.lock) end
      return
    end
    self.server:listen(128, function(e) if not e then self:_accept() end end)
    for _, name in ipairs({ "sigint", "sigterm" }) do
      local s = uv.new_signal()
      s:start(name, function() self:shutdown() end)
      self.signals[#self.signals + 1] = s
    end
    log("tupper daemon %s listening on %s%s (state %s)", core.version, self.socket,
      self.activated and " (socket-activated)" or "", self.state)
    self:_start_idle_sweep()
    self:_start_lag_probe()
    local nok, nerr = self.notify("READY=1")
    if not nok then log("sd_notify READY=1: %s", tostring(nerr)) end
    self:_refill()
    require("tupper.daemon.metrics").start(self) -- sandbox.metrics's series
  end)
  uv.run()
  -- the loop ran out of work: what is still open is idle (a stopped timer,
  -- an exited process's handle, a pipe nobody reads, an unref'd timer).
  -- Closed now, their close callbacks run, before tp_main closes the Lua
  -- state (daemon/handles.lua).  Not earlier: a box's cleanup still
  -- running after the shutdown's last step needs its timers.
  local n = handles.close_all()
  if n > 0 then
    log("closed %d handle%s left open", n, n == 1 and "" or "s")
    uv.run()
  end
  return code
end

return M
