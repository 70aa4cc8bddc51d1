--- `tupper daemon`: owns every sandbox on the host and serves the socket API.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local rpc = require("tupper.wire.rpc")
local schema = require("tupper.wire.schema")
local api = require("tupper.daemon.api")
local sandbox = require("tupper.daemon.sandbox")
local paths = require("tupper.util.paths")
local guard = require("tupper.recipe.guard")
local registry = require("tupper.image.registry")
local build = require("tupper.recipe.build")
local layers = require("tupper.image.layers")
local netrelay = require("tupper.net.relay")
local images = require("tupper.image.store")
local backends = require("tupper.backend.registry")
local debian = require("tupper.image.debian")
local policy = require("tupper.recipe.policy")
local setup = require("tupper.recipe.setup")

local M = {}

M.UID_BASE = 100000000
M.ID_COUNT = 65536
M.MAX_SANDBOXES = 1024
M.MAX_CLIENTS = 1024
-- requests one connection may have running at once: each is a coroutine
-- and may wait on a box; past this a call is answered -32004 at once
M.MAX_INFLIGHT = 256
M.RING_MAX = 65536 -- bytes of recent output kept per process for process.connect

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

local function log(fmt, ...)
  io.stderr:write(os.date("!%Y-%m-%dT%H:%M:%SZ "), fmt:format(...), "\n")
end
M.log = log

local mkdirs = paths.mkdirs

-- Limits as the backend takes them.
local function backend_limits(lim)
  return { memory = lim.memory, pids = lim.pids, disk = lim.disk,
           cpu_quota = lim.cpus and math.max(1000, math.floor(lim.cpus * 100000)) or nil,
           cpu_period = lim.cpus and 100000 or nil }
end

function Daemon:_new_id()
  local id
  repeat id = core.random_hex(6) until not self.sandboxes[id] and not self.reserved[id]
  return id
end

-- Starts a box with limits lim (may be empty) on read-only layers (lowest
-- first; default: the default image); image names it, image_digest is its
-- manifest's (what the image store keeps while the box lives); backend is
-- a name of backend/registry.lua (nil: the default).
function Daemon:_start_box(id, lim, layers, image, image_digest, backend)
  self.reserved[id] = true
  layers = layers or { self.default_image }
  local sb, err = sandbox.start({
    backend = backend, state_dir = self.state, default_layer = self.default_image,
    id = id, image = image or "default", image_digest = image_digest,
    layers = layers or { self.default_image }, dir = self.boxes .. "/" .. id,
    uid_base = self.uid_base, id_count = M.ID_COUNT, cgroup = self.tag .. "-" .. id,
    limits = backend_limits(lim),
    on_output = function(s, proc, stream, data) self:_output(s, proc, stream, data) end,
    on_exit = function(s, proc) self:_exit(s, proc) end,
    on_down = function(s, reason) self:_sandbox_down(s, reason) end,
    on_watch = function(s, w, kind, name, msg) self:_watch_event(s, w, kind, name, msg) end,
  })
  self.reserved[id] = nil
  return sb, err
end

-- Keeps each backend's pool of boxes started and idle (its `pool`:
-- backend/registry.lua), so that a create of the default image with no
-- disk cap takes one at once instead of waiting for a start.  The refill
-- waits until the daemon has been quiet for the longest delay_ms of the
-- pools that are short: the create that took a box, and the process.start
-- that usually follows it, are answered first.
function Daemon:_fill_pool()
  if self.filling or self.stopping then return end
  local delay
  for _, pool in ipairs(self.pools) do
    if #pool.boxes < pool.size then delay = math.max(delay or 0, pool.backend.pool.delay_ms) end
  end
  if not delay then return end
  if not self.pool_timer then self.pool_timer = uv.new_timer() end
  self.pool_timer:start(delay, 0, function() self:_refill() end)
end

function Daemon:_refill()
  if self.filling or self.stopping then return end
  self.filling = true
  async.spawn(function()
    for _, pool in ipairs(self.pools) do
      local b = pool.backend
      while #pool.boxes < pool.size and not self.stopping do
        local sb, err = self:_start_box(self:_new_id(), {}, nil, nil, nil, b.name)
        if not sb then
          log("%s: %s", b.pool.label, err)
          break
        end
        local ok, ferr = true, nil
        if not self.stopping and b.pool_park then
          ok, ferr = b.pool_park(sb, function() return self.stopping end)
        end
        if self.stopping or not ok then
          if ferr then log("%s: %s", b.pool.label, ferr) end
          sb:destroy()
          break
        end
        pool.boxes[#pool.boxes + 1] = sb
        if b.pool_park then log("%s: sandbox %s ready", b.pool.label, sb.id) end
      end
    end
    self.filling = false
  end)
end

-- A pooled box of backend b for a create with limits lim, or nil (then
-- start one), or nil, err (the create fails).
function Daemon:_take_pooled(b, lim)
  return b.pool_take(self.pools[b.name].boxes, lim, backend_limits(lim), log)
end

--- Pulls an image from its registry into the store (<state>/images, an OCI
-- layout: tupper.registry).  on_progress(done, total) may be nil.  Two
-- pulls of one ref at once share the download.  Returns the pull's result
-- (ref, digest, config, layers, size) or nil, message, kind.
function Daemon:pull_image(refstr, on_progress)
  local ref, perr = registry.parse_ref(refstr)
  if not ref then return nil, perr, "invalid" end
  local running = self.pulls[ref.name]
  if running then
    if on_progress then running.listeners[#running.listeners + 1] = on_progress end
    return async.wait(function(cb) running.waiters[#running.waiters + 1] = cb end)
  end
  running = { waiters = {}, listeners = { on_progress } }
  self.pulls[ref.name] = running
  log("pulling %s", ref.name)
  local ok, res = pcall(registry.pull, self.state .. "/images", ref.name, {
    on_session = function(s) running.session = s end, record = self.images == nil,
    on_progress = function(done, total)
      for _, fn in ipairs(running.listeners) do fn(done, total) end
    end })
  if ok and self.images then
    -- the store unpacks the layers and records the ref: a pulled image is
    -- ready to run, and one whose layers the store refuses is not recorded
    local img, terr = self.images:tag(res.ref, res.digest)
    if not img then ok, res = false, { kind = "image", message = ("%s: %s"):format(res.ref, terr) } end
  end
  self.pulls[ref.name] = nil
  local out
  if ok then
    log("pulled %s (%s, %d bytes)", ref.name, res.digest, res.size)
    out = table.pack(res)
  else
    local msg = type(res) == "table" and res.message or tostring(res)
    local kind = type(res) == "table" and res.kind or "internal"
    if kind == "internal" then log("pull %s: internal error: %s", ref.name, msg) end
    log("pull %s failed: %s", ref.name, msg)
    out = table.pack(nil, msg, kind)
  end
  for _, cb in ipairs(running.waiters) do cb(table.unpack(out, 1, out.n)) end
  return table.unpack(out, 1, out.n)
end
Daemon._pull = Daemon.pull_image -- the image store's pull-on-first-use hook

-- A create from a recipe, before any policy sees it: the recipe is loaded
-- and checked, and its env, workdir and limits become the create's params
-- under those the request gives explicitly (docs/recipes.md, "Explicit
-- parameters"), so that the policies cap and judge what will really run.
-- Returns the params and the loaded recipe, or nil, err.
function Daemon:_recipe_params(p)
  if p.image then
    return nil, "'image' and 'recipe' together: the recipe names its image"
  end
  local loaded, err = build.load(p.recipe)
  if not loaded then return nil, err end
  local r = loaded.recipe
  local q = {}
  for k, v in pairs(p) do q[k] = v end
  q.image = build.image_name(r.image) -- what policies see; the plan has the image itself
  local env = {}
  for k, v in pairs(r.env or {}) do env[k] = v end
  for k, v in pairs(p.env or {}) do env[k] = v end
  q.env = next(env) and env or nil
  q.cwd = p.cwd or r.workdir
  q.backend = p.backend or r.backend
  local lim = {}
  for k, v in pairs(r.limits or {}) do lim[k] = v end
  for k, v in pairs(p.limits or {}) do lim[k] = v end
  q.limits = next(lim) and lim or nil
  -- the recipe's network rules, unless the request names its own
  if p.network == nil and r.network ~= nil and r.network ~= "none" then q.network = r.network end
  return q, loaded
end

--- Every connection the rules allow is then put to the on_connect hooks
-- of the policies binding the sandbox (the daemon's, then its own): any
-- that does not return true refuses it, with its reason.
function Daemon:_hook_connect(sb)
  if not sb.net then return end
  sb.net.on_connect = function(host, port, addr)
    for _, pol in ipairs(guard.policies_of(self, sb)) do
      if pol.on_connect then
        local ok, err = policy.check_connect(pol, host, port, addr)
        if not ok then return false, err end
      end
    end
    return true
  end
end

--- The `network` values of the policies binding a sandbox: the daemon's,
-- then the sandbox's own (pol).
function Daemon:policy_networks(pol)
  local out = {}
  if self.policy and self.policy.network ~= nil then out[#out + 1] = self.policy.network end
  if pol and pol.network ~= nil then out[#out + 1] = pol.network end
  return out
end

-- What live sandboxes use, for the store's remove and prune.
function Daemon:_images_in_use()
  local digests, layers = {}, {}
  local function add(sb)
    if sb.image_digest then digests[sb.image_digest] = true end
    for _, l in ipairs(sb.layers or {}) do layers[l] = true end
  end
  for _, sb in pairs(self.sandboxes) do add(sb) end
  for _, pool in ipairs(self.pools) do
    for _, sb in ipairs(pool.boxes) do add(sb) end
  end
  return { digests = digests, layers = layers }
end

-- The sandbox's settings from its image's config, under the caller's.
local function apply_image(sb, img, p)
  local env = {}
  for _, kv in ipairs(img and img.config and img.config.env or {}) do
    local k, v = kv:match("^([^=]+)=(.*)$")
    if k then env[k] = v end
  end
  for k, v in pairs(p.env or {}) do env[k] = v end
  sb.env = env
  local cfg = img and img.config or {}
  sb.cwd = p.cwd or cfg.workdir or "/"
  -- a working directory the sandbox was given (not the fallback /): the
  -- TypeScript SDK starts commands there rather than in the account's home
  sb.workdir = p.cwd or (cfg.workdir ~= "" and cfg.workdir) or nil
  local user = cfg.user
  sb.user = user ~= "root" and user ~= "0" and user ~= "0:0" and user or nil
end

-- E2B's default account (the TypeScript SDK's, docs/protocol.md): the
-- recipe's user, else the image's User, else `user` where the image has
-- that account (as E2B's base image does), else root, whose home is then
-- taken to be /.  Returns its name and home (no name for an image User
-- that is a bare uid without an entry in /etc/passwd), and whether the
-- answer came from the image's files alone (not from a recipe, nor a
-- lookup that failed for another reason than the account's absence).
local function default_account(sb)
  if sb.cred then return sb.cred.name, sb.cred.home, false end
  if sb.user then
    local c = sb:_resolve_user(sb.user)
    if c and c.name then return c.name, c.home or "/", false end
    return nil, c and c.home or "/", false
  end
  local acct, _, errno = sb:account("user")
  if acct then return acct.name, acct.home, true end
  return "root", "/", errno == 2
end

function Daemon:create_sandbox(p)
  local plan
  if p._recipe then
    -- the image, lock and layer (built here unless cached); the policies
    -- that bind the sandbox also judge the setup's commands and files
    local pols = guard.policies_of(self, { policy = p._policy })
    local err
    plan, err = build.prepare(self, p._recipe, { policies = pols })
    if not plan then return nil, err end
  end
  local image = p.image or "default"
  local img
  if image ~= "default" and not plan then
    local err
    img, err = self.images:resolve(image)
    if not img then
      -- pull-on-first-use (tupper.registry), then the store has it
      local pulled, perr = self:_pull(image)
      if pulled then
        img, err = self.images:resolve(image)
      elseif perr then
        err = ("%s; pulling it failed: %s"):format(err, perr)
      end
    end
    if not img then return nil, err end
  end
  local b = backends.get(p.backend)
  for _, name in ipairs({ "memory", "cpus", "pids", "disk" }) do
    -- a guest may enforce pids itself, in its own kernel's cgroups
    if p.limits and p.limits[name] and not self.enforces[name]
       and not (name == "pids" and b.guest_pids) then
      return nil, ("the '%s' limit cannot be enforced on this host yet"):format(name)
    end
  end
  local count = 0
  for _ in pairs(self.sandboxes) do count = count + 1 end
  if count >= M.MAX_SANDBOXES then return nil, "too many sandboxes" end
  local lim = p.limits or {}
  local sb, err
  local layers = plan and plan.layers or (img and img.layers)
  local pooled_ok = not lim.disk and (not layers or (#layers == 1 and layers[1] == self.default_image))
  if pooled_ok then
    sb, err = self:_take_pooled(b, lim)
    if err then return nil, err end
  end
  if not sb then
    sb, err = self:_start_box(self:_new_id(), lim, layers, img and img.ref or image,
                              (plan and plan.image.digest) or (img and img.digest), b.name)
    if not sb then
      log("create failed: %s", err)
      return nil, err
    end
  end
  if self.stopping then -- the daemon began to shut down while this box started
    sb:destroy()
    return nil, "the daemon is shutting down"
  end
  self:_fill_pool()
  if p.network ~= nil and p.network ~= "none" then
    local ok, nerr = sb:set_network(p.network, self:policy_networks(p._policy))
    if not ok then
      sb:destroy()
      return nil, nerr
    end
  end
  if plan then
    local ok, rerr = self:_apply_recipe(sb, plan, p)
    if not ok then
      sb:destroy()
      return nil, rerr
    end
  end
  -- the image's Env, WorkingDir and User, under the create's (and recipe's)
  apply_image(sb, img or (plan and plan.image), p)
  -- without a recipe, the default account is a function of the image's
  -- files alone (no code has run in the box yet): kept per image digest, a
  -- create of an image seen before asks its box nothing (two file reads
  -- through the agent, which under TCG are a microVM's slowest after a
  -- snapshot restore)
  local akey = not plan and (img and img.digest or (image == "default" and "default")) or nil
  local known = akey and self.accounts[akey]
  if known then
    sb.default_user, sb.home = known.name, known.home
  else
    local keep
    sb.default_user, sb.home, keep = default_account(sb)
    if akey and keep then self.accounts[akey] = { name = sb.default_user, home = sb.home } end
  end
  sb.metadata = p.metadata or {}
  sb.policy, sb.policy_source = p._policy, p._policy_source
  self:_hook_connect(sb)
  sb.created_at = os.date("!%Y-%m-%dT%H:%M:%SZ")
  sb.limits = { memory = lim.memory, pids = lim.pids, disk = lim.disk, cpus = lim.cpus }
  self.sandboxes[sb.id] = sb
  local timeout = lim.timeout
  if timeout == nil then timeout = schema.DEFAULT_TIMEOUT end
  self:set_timeout(sb, timeout) -- also writes the record
  log("sandbox %s created", sb.id)
  return sb
end

-- What a recipe sets on a started box: its user (looked up in the box's
-- /etc/passwd) and its workdir (made if missing); sb.recipe says which
-- recipe and layer it came from (sandbox.get shows it).
function Daemon:_apply_recipe(sb, plan, p)
  local r = plan.recipe
  sb.image = plan.image.ref
  sb.recipe = { name = r.name, layer = plan.layer, cached = plan.cached, image_digest = plan.image.digest }
  if r.user ~= nil then
    local cred, err = setup.lookup_user(sb, r.user)
    if not cred then return nil, ("%s: %s"):format(r.origin and r.origin.file or r.name, err) end
    sb.cred = cred
  end
  if p.cwd and p.cwd ~= "/" then
    sb:request(core.MSG.FS_MKDIR, { path = p.cwd, mode = 493, flags = 1 })
  end
  return true
end

-- The record of a live sandbox, <state>/boxes/<id>.json, written atomically:
-- what a restarted daemon needs to re-adopt it after a crash.
function Daemon:save(sb)
  if sb.state ~= "running" and sb.state ~= "paused" then return end
  local path = self.boxes .. "/" .. sb.id .. ".json"
  local text = json.encode(sb:record())
  local fd = uv.fs_open(path .. ".tmp", "w", tonumber("600", 8))
  if not fd then return end
  uv.fs_write(fd, text)
  uv.fs_close(fd)
  uv.fs_rename(path .. ".tmp", path)
end

function Daemon:unsave(id)
  uv.fs_unlink(self.boxes .. "/" .. id .. ".json")
end

--- Sets a sandbox's remaining lifetime to seconds from now (0: none).
local function stop_life_timer(sb)
  if sb.life_timer then
    sb.life_timer:stop()
    sb.life_timer:close()
    sb.life_timer = nil
  end
end

function Daemon:set_timeout(sb, seconds)
  stop_life_timer(sb)
  sb.timeout = seconds
  sb.expires_at = nil
  if seconds and seconds > 0 then
    sb.expires_at = os.time() + math.ceil(seconds)
    sb.life_timer = uv.new_timer()
    sb.life_timer:start(math.ceil(seconds * 1000), 0, function()
      log("sandbox %s reached its timeout", sb.id)
      async.spawn(function() self:kill_sandbox(sb.id) end)
    end)
  end
  self:save(sb)
end

function Daemon:kill_sandbox(id)
  local sb = self.sandboxes[id]
  if not sb or not sb.destroy then return false end
  self.sandboxes[id] = nil
  stop_life_timer(sb)
  self:unsave(id)
  local ok, err = sb:destroy()
  if not ok then log("sandbox %s: cleanup: %s", id, tostring(err)) end
  log("sandbox %s killed", id)
  return true
end

-- A box died on its own (its agent exited or misbehaved): remove it.
function Daemon:_sandbox_down(sb, reason)
  log("sandbox %s went down: %s", sb.id, reason)
  for _, pool in ipairs(self.pools) do
    for i, pooled in ipairs(pool.boxes) do
      if pooled == sb then
        table.remove(pool.boxes, i)
        async.spawn(function() sb:destroy() end)
        return
      end
    end
  end
  async.spawn(function() self:kill_sandbox(sb.id) end)
end

-- The last RING_MAX bytes of a process's output, for process.connect.
local function ring_add(proc, stream, data)
  local ring = proc.ring
  if not ring then ring = {}; proc.ring = ring; proc.ring_bytes = 0 end
  ring[#ring + 1] = { stream = stream, data = data }
  proc.ring_bytes = proc.ring_bytes + #data
  local drop = 0
  while proc.ring_bytes - #ring[drop + 1].data >= M.RING_MAX do
    drop = drop + 1
    proc.ring_bytes = proc.ring_bytes - #ring[drop].data
    proc.ring_dropped = (proc.ring_dropped or 0) + #ring[drop].data
  end
  if drop > 0 then
    local n = #ring
    table.move(ring, drop + 1, n, 1)
    for i = n - drop + 1, n do ring[i] = nil end
  end
  if proc.ring_bytes > M.RING_MAX then -- one chunk larger than the ring: keep its tail
    local c = ring[1]
    local cut = proc.ring_bytes - M.RING_MAX
    c.data = c.data:sub(cut + 1)
    proc.ring_bytes = proc.ring_bytes - cut
    proc.ring_dropped = (proc.ring_dropped or 0) + cut
  end
end

function Daemon:_output(sb, proc, stream, data)
  ring_add(proc, stream, data)
  local conn = proc.owner
  local msg = { sandbox = sb.id, pid = proc.pid, stream = stream }
  if conn and not conn.closed then
    msg.data, msg.encoding = api.encode_data(data, proc.encoding)
    conn:notify("process.output", msg)
  end
  for l, enc in pairs(proc.listeners or {}) do
    if l.closed then
      proc.listeners[l] = nil
    else
      msg.data, msg.encoding = api.encode_data(data, enc)
      l:notify("process.output", msg)
    end
  end
end

function Daemon:_exit(sb, proc)
  local msg = { sandbox = sb.id, pid = proc.pid, exit_code = proc.exit_code,
                signal = proc.signal, timed_out = proc.timed_out or nil }
  local conn = proc.owner
  if conn and not conn.closed then conn:notify("process.exit", msg) end
  for l in pairs(proc.listeners or {}) do
    if not l.closed then l:notify("process.exit", msg) end
  end
end

function Daemon:_watch_event(sb, w, kind, name, message)
  local conn = w.owner
  if kind == "end" and conn.watches then conn.watches[w] = nil end
  if conn.closed then return end
  conn:notify("fs.event", { sandbox = sb.id, watch = w.id, type = kind, name = name, message = message })
end

function Daemon:_request(conn, msg)
  local id = msg.id
  local is_call = id ~= nil
  if is_call and type(id) ~= "string" and type(id) ~= "number" and id ~= json.null then
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
  if inflight >= M.MAX_INFLIGHT then
    if is_call then
      return conn:error(id, rpc.BUSY, ("too many requests in flight on this connection (at most %d)"):format(M.MAX_INFLIGHT))
    end
    return
  end
  local loaded
  if msg.method == "sandbox.create" and params.recipe then
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
    local ok, res, code, message, data = xpcall(handler, debug.traceback, self, conn, params)
    conn.inflight = conn.inflight - 1
    if not is_call then return end
    if not ok then
      log("internal error in %s: %s", msg.method, tostring(res))
      return conn:error(id, rpc.INTERNAL_ERROR, "internal error")
    end
    if res == nil then return conn:error(id, code or rpc.INTERNAL_ERROR, message or "failed", data) end
    conn:reply(id, res)
  end)
end

function Daemon:_accept()
  local client = uv.new_pipe(false)
  if not self.server:accept(client) then client:close(); return end
  if self.nclients >= M.MAX_CLIENTS then client:close(); return end
  self.nclients = self.nclients + 1
  local conn
  conn = rpc.wrap(client, {
    message = function(c, msg, err)
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
  })
  self.clients[conn] = true
end

--- A paused sandbox's lifetime stands still: its timer stops, keeping what
-- was left, and runs on at resume.
function Daemon:pause_timeout(sb)
  if not sb.expires_at then return end
  local left = math.max(1, sb.expires_at - os.time())
  self:set_timeout(sb, 0)
  sb.paused_left = left
end

function Daemon:resume_timeout(sb)
  if sb.paused_left then
    self:set_timeout(sb, sb.paused_left)
    sb.paused_left = nil
  end
end

local function read_json(path)
  local fd = uv.fs_open(path, "r", 0)
  if not fd then return nil end
  local st = uv.fs_fstat(fd)
  local text = st and st.size < 4194304 and uv.fs_read(fd, st.size, 0)
  uv.fs_close(fd)
  return text and json.decode(text)
end

-- After a crash: re-adopts the boxes a previous daemon left that are still
-- whole, and removes everything else it left in boxes/ (directories,
-- records, cgroups).
function Daemon:_recover()
  local names = {}
  local dir = uv.fs_scandir(self.boxes)
  while dir do
    local name = uv.fs_scandir_next(dir)
    if not name then break end
    names[#names + 1] = name
  end
  local seen = {}
  for _, name in ipairs(names) do
    local id = name:match("^([a-z0-9]+)%.json$")
    if id and not seen[id] then
      seen[id] = true
      local rec = read_json(self.boxes .. "/" .. name)
      local sb, err, pol
      if type(rec) == "table" and type(rec.policy) == "table" then
        -- the sandbox's policy binds it after a crash too: one that no
        -- longer loads means no re-adoption (fail closed)
        pol, err = guard.load_client_policy(rec.policy)
        if not pol then rec = nil end
      end
      local backend = type(rec) == "table" and rec.backend or nil
      if backend ~= nil and not backends.known(backend) then
        err = "unknown backend"
      elseif type(rec) == "table" and rec.id == id and math.tointeger(rec.pid) then
        sb, err = sandbox.adopt({ id = id, image = rec.image, layers = rec.layers,
          backend = backend or nil, saved = type(rec.vm) == "table" and rec.vm or nil,
          paused = rec.paused == true,
          image_digest = rec.image_digest, user = rec.user, dir = self.boxes .. "/" .. id,
          pid = math.tointeger(rec.pid), cgroup = self.tag .. "-" .. id, created_at = rec.created_at,
          metadata = rec.metadata, env = rec.env, cwd = rec.cwd, limits_info = rec.limits,
          cred = type(rec.cred) == "table" and rec.cred or nil,
          default_user = type(rec.default_user) == "string" and rec.default_user or nil,
          home = type(rec.home) == "string" and rec.home or nil,
          workdir = type(rec.workdir) == "string" and rec.workdir or nil,
          recipe = type(rec.recipe) == "table" and rec.recipe or nil,
          on_output = function(s, proc, stream, data) self:_output(s, proc, stream, data) end,
          on_exit = function(s, proc) self:_exit(s, proc) end,
          on_down = function(s, reason) self:_sandbox_down(s, reason) end,
          on_watch = function(s, w, kind, name, msg) self:_watch_event(s, w, kind, name, msg) end })
      else
        err = err or "unreadable record"
      end
      if sb then
        self.sandboxes[id] = sb
        if pol then sb.policy, sb.policy_source = pol, rec.policy end
        self:_hook_connect(sb)
        if rec.network ~= nil then
          local nok, nerr = sb:set_network(rec.network, self:policy_networks(sb.policy))
          if not nok then log("sandbox %s: network rules not restored: %s", id, tostring(nerr)) end
        end
        if rec.paused then sb.state = "paused" end
        local left = rec.expires_at and (rec.expires_at - os.time())
        if rec.expires_at then
          self:set_timeout(sb, math.max(1, left))
          if rec.paused then self:pause_timeout(sb) end
        else
          self:set_timeout(sb, 0)
        end
        log("sandbox %s re-adopted (%d processes)", id, (function()
          local n = 0
          for _ in pairs(sb.procs) do n = n + 1 end
          return n
        end)())
      else
        log("sandbox %s cannot be re-adopted (%s): removing it", id, tostring(err))
        self:unsave(id)
      end
    end
  end
  -- what is left: boxes nobody re-adopted, half-made ones, stray files
  for _, name in ipairs(names) do
    local id = name:match("^([a-z0-9]+)") or name
    if not self.sandboxes[id] and not name:match("%.json$") then
      if self.cgroups then core.cgroup_remove(self.tag .. "-" .. id) end
      local path = self.boxes .. "/" .. name
      local st = uv.fs_lstat(path)
      local ok, err = true, nil
      if st and st.type == "directory" then ok, err = core.rmtree(path)
      elseif st then ok, err = uv.fs_unlink(path) end
      if not ok then log("cannot remove %s: %s", name, err) end
    end
  end
end

-- Removes the cgroups of this daemon's boxes that no live sandbox owns: a
-- previous daemon's, after a crash.  Other daemons' cgroups (another state
-- dir) carry another tag and are left alone.
function Daemon:_sweep_cgroups()
  local prefix = self.tag .. "-"
  for _, name in ipairs(core.cgroup_orphans()) do
    if name:sub(1, #prefix) == prefix and not self.sandboxes[name:sub(#prefix + 1)] then
      local ok, err = core.cgroup_remove(name)
      if not ok then log("cannot remove stale cgroup %s: %s", name, err) end
    end
  end
end

function Daemon:shutdown()
  if self.stopping then return end
  self.stopping = true
  log("shutting down")
  async.spawn(function()
    if self.server and not self.server:is_closing() then self.server:close() end
    uv.fs_unlink(self.socket)
    for id, sb in pairs(self.sandboxes) do
      if sb.destroy then self:kill_sandbox(id) end
    end
    if self.pool_timer then self.pool_timer:close(); self.pool_timer = nil end
    for _, pull in pairs(self.pulls) do if pull.session then pull.session:cancel() end end
    for _, pool in ipairs(self.pools) do
      local boxes = pool.boxes
      pool.boxes = {}
      for _, sb in ipairs(boxes) do sb:destroy() end
    end
    for sb in pairs(self.setups) do sb:destroy() end -- their builds fail and clean up
    debian.cancel_all() -- Debian image builds too
    while self.filling do async.sleep(5) end
    for conn in pairs(self.clients) do conn:close() end
    core.cgroup_prune()
    -- everything is gone: a late SIGTERM (a second Ctrl-C) must not make
    -- a clean exit look like a death by signal
    for _, s in ipairs(self.signals) do s:close() end
    core.ignore_stop_signals()
    if self.lock then uv.fs_close(self.lock); self.lock = nil end
  end)
end

local function listen(path)
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

--- Runs the daemon until SIGTERM/SIGINT.  opts: socket, state_dir, uid_base.
-- Returns the exit code.
function M.run(opts)
  local self = setmetatable({ sandboxes = {}, clients = {}, nclients = 0, signals = {}, enforces = {},
    reserved = {}, pulls = {}, setups = {}, pools = {},
    accounts = {}, -- image digest -> its default account { name, home }
    socket = opts.socket or paths.socket(), state = opts.state_dir or paths.state_dir(),
    uid_base = opts.uid_base or M.UID_BASE }, Daemon)
  -- one pool per backend, in the registry's order (by index, and by name)
  for _, name in ipairs(backends.NAMES) do
    local b = backends.get(name)
    local pool = { backend = b, size = opts[b.pool.option] or b.pool.size, boxes = {} }
    self.pools[#self.pools + 1] = pool
    self.pools[name] = pool
  end
  local code = 0
  async.spawn(function()
    local ok, err = mkdirs(self.state, tonumber("711", 8))
    if ok then ok, err = uv.fs_chmod(self.state, tonumber("711", 8)) end
    if ok then ok, err = mkdirs(self.socket:match("^(.*)/[^/]*$") or ".", tonumber("700", 8)) end
    if ok and opts.log then ok, err = core.log_to(opts.log) end
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
    if ok then
      self.images, err = images.open(self.state .. "/images", { uid_base = self.uid_base,
        id_count = M.ID_COUNT, default_layers = { self.default_image }, log = log,
        default_digest = function() return build.default_digest(self) end,
        pulling = function() return next(self.pulls) ~= nil end,
        limits = opts.max_layer and { max_tar_bytes = opts.max_layer, max_bytes = opts.max_layer } or nil,
        in_use = function() return self:_images_in_use() end })
      ok = self.images ~= nil
    end
    if ok then
      self:_recover()
      if self.cgroups then self:_sweep_cgroups() end
    end
    if ok then
      self.server, err = listen(self.socket)
      ok = self.server ~= nil
    end
    if not ok then
      io.stderr:write("tupper daemon: ", tostring(err), "\n")
      code = 1
      if self.lock then uv.fs_close(self.lock) end
      return
    end
    self.server:listen(128, function(e) if not e then self:_accept() end end)
    for _, name in ipairs({ "sigint", "sigterm" }) do
      local s = uv.new_signal()
      s:start(name, function() self:shutdown() end)
      self.signals[#self.signals + 1] = s
    end
    log("tupper daemon %s listening on %s (state %s)", core.version, self.socket, self.state)
    self:_refill()
  end)
  uv.run()
  return code
end

return M
