--- sandbox.create as the daemon runs it: recipe params, image resolution
-- and pull-on-first-use, the pooled or new box, the image's settings and
-- the default account.  Methods of the daemon (daemon/main.lua mixes them in).
local core = require("tupper.core")
local async = require("tupper.util.async")
local schema = require("tupper.wire.schema")
local sandbox = require("tupper.daemon.sandbox")
local guard = require("tupper.recipe.guard")
local registry = require("tupper.image.registry")
local build = require("tupper.recipe.build")
local policy = require("tupper.recipe.policy")
local setup = require("tupper.recipe.setup")
local start = require("tupper.recipe.start")
local templates = require("tupper.daemon.templates")
local backends = require("tupper.backend.registry")
local limits = require("tupper.daemon.limits")
local volumes = require("tupper.daemon.volumes")
local log = require("tupper.daemon.log").log

local D = {}

function D:_new_id()
  local id
  repeat id = core.random_hex(6) until not self.sandboxes[id] and not self.reserved[id] and not self.dying[id]
  return id
end

-- Starts a box with limits lim (as for_backend in daemon/limits.lua
-- leaves them; may be empty) on read-only layers (lowest
-- first; default: the default image); image names it, image_digest is its
-- manifest's (what the image store keeps while the box lives); backend is
-- a name of backend/registry.lua (nil: the default); accel: the microVM
-- accelerator asked for (nil: the daemon's); vols: the volumes' image,
-- target pairs (daemon/volumes.lua) or nil; vm_state: a microVM memory
-- snapshot's dir to start from (daemon/vmsnap.lua) or nil.
function D:_start_box(id, lim, layers, image, image_digest, backend, accel, vols, vm_state)
  self.reserved[id] = true
  layers = layers or { self.default_image }
  local sb, err = sandbox.start({
    backend = backend, accel = accel, state_dir = self.state, default_layer = self.default_image,
    id = id, image = image or "default", image_digest = image_digest,
    layers = layers or { self.default_image }, dir = self.boxes .. "/" .. id,
    uid_base = self.uid_base, id_count = sandbox.ID_COUNT, cgroup = self.tag .. "-" .. id,
    limits = backends.limits(lim), volumes = vols, vm_state = vm_state,
    on_output = function(s, proc, stream, data) self:_output(s, proc, stream, data) end,
    on_exit = function(s, proc) self:_exit(s, proc) end,
    on_down = function(s, reason) self:_sandbox_down(s, reason) end,
    on_watch = function(s, w, kind, name, msg) self:_watch_event(s, w, kind, name, msg) end,
  })
  self.reserved[id] = nil
  return sb, err
end

--- Pulls an image from its registry into the store (<state>/images, an OCI
-- layout: tupper.registry).  on_progress(done, total) may be nil.  Two
-- pulls of one ref at once share the download.  Returns the pull's result
-- (ref, digest, config, layers, size) or nil, message, kind.
function D:pull_image(refstr, on_progress)
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
D._pull = D.pull_image -- the image store's pull-on-first-use hook

-- A create from a recipe, before any policy sees it: the recipe is loaded
-- and checked, and its env, workdir and limits become the create's params
-- under those the request gives explicitly (docs/recipes.md, "Explicit
-- parameters"), so that the policies cap and judge what will really run.
-- Returns the params and the loaded recipe, or nil, err.
function D:_recipe_params(p)
  if p.template then
    -- a template's name: a registered recipe, a shipped one, else an image
    if p.image or p.recipe then return nil, "'template' names the image or recipe: not with 'image' or 'recipe'" end
    local q = {}
    for k, v in pairs(p) do q[k] = v end
    q.template = nil
    local spec = templates.resolve(self, p.template)
    if not spec then
      -- E2B's Sandbox.create(snapshotId): a snapshot's id or name
      if self:snapshot_find(p.template) then q.snapshot = p.template else q.image = p.template end
      return q
    end
    q.recipe = spec
    p = q
  end
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
  -- the recipe's env and the request's together obey the env rules too
  local eerr = q.env and schema.check("env", schema.MAP, q.env)
  if eerr then return nil, eerr .. " (the recipe's env with the request's)" end
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
function D:_hook_connect(sb)
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
function D:policy_networks(pol)
  local out = {}
  if self.policy and self.policy.network ~= nil then out[#out + 1] = self.policy.network end
  if pol and pol.network ~= nil then out[#out + 1] = pol.network end
  return out
end

-- What live sandboxes use, for the store's remove and prune.
function D:_images_in_use()
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
  -- a working directory the sandbox was given (not the fallback /, which
  -- is also what an image without WorkingDir reads as): the TypeScript SDK
  -- starts commands there rather than in the account's home, as E2B does
  sb.workdir = p.cwd or (cfg.workdir ~= "" and cfg.workdir ~= "/" and cfg.workdir) or nil
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

-- A box of backend b for a create with effective limits lim: a pooled one
-- when the pool's boxes (made with the default limits, disk cap included)
-- fit, else a new one.  Returns the sandbox or nil, err.
function D:_make_box(b, lim, plan, img, image, accel, vols, fixed_id)
  local layers = plan and plan.layers or (img and img.layers)
  -- fixed_id: a resume from a pause to disk keeps the sandbox's id (daemon/pause.lua)
  local pooled_ok = not fixed_id and not vols and not (img and img.vm_state) and (not layers or (#layers == 1 and layers[1] == self.default_image))
  -- a pooled VM runs on the daemon's accelerator
  if accel ~= nil and accel ~= "auto" then pooled_ok = false end
  -- what differs from the pool's boxes: a limit can be set on a running
  -- box, but not taken off it (0), and its disk is the one it was made with
  local pl, diff = self.pool_limits[b.name], {}
  for _, k in ipairs({ "memory", "cpus", "pids", "disk" }) do
    if lim[k] ~= pl[k] then
      if k == "disk" or not lim[k] or lim[k] == 0 then pooled_ok = false else diff[k] = lim[k] end
    end
  end
  local sb, err
  if pooled_ok then
    sb, err = self:_take_pooled(b, diff)
    if err then return nil, err end
  end
  if not sb then
    sb, err = self:_start_box(fixed_id or self:_new_id(), limits.for_backend(lim), layers, img and img.ref or image,
                              (plan and plan.image.digest) or (img and img.digest), b.name, accel, vols,
                              img and img.vm_state)
    if not sb then
      log("create failed: %s", err)
      return nil, err
    end
  end
  return sb
end

function D:create_sandbox(p)
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
  if p.snapshot then
    -- a create from a snapshot (daemon/snapshots.lua): its layer, image
    -- settings, env, limits and network rules under the request's own
    if p.image or p._recipe then return nil, "'snapshot' names the sandbox's files: not with 'image', 'recipe' or 'template'" end
    local rec, serr = self:snapshot_find(p.snapshot)
    if not rec then return nil, serr end
    local err
    -- a microVM's memory snapshot (daemon/vmsnap.lua): its VM's image and memory
    if rec.vm then img, err = self:_vm_snapshot_image(rec) else img, err = self:_snapshot_image(rec) end
    if not img then return nil, err end
    p = self:_snapshot_params(rec, p)
    if rec.vm then p.backend = rec.backend end
    image = img.ref or "default"
  elseif image ~= "default" and not plan then
    local err
    img, err = self.images:resolve(image)
    if not img and not image:match("^sha256:") then -- a digest names nothing to pull
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
  if p.accel and not b.takes_accel then
    return nil, ("'accel' is for microVMs; the %s backend has no accelerator to choose"):format(b.name)
  end
  local asked = p.limits or {}
  for _, name in ipairs({ "memory", "cpus", "pids", "disk" }) do
    -- a guest may enforce pids itself, in its own kernel's cgroups; a VM's
    -- memory, vCPUs and disk are its shape
    if asked[name] and asked[name] ~= 0 and not limits.enforceable(name, self.enforces, b) then
      return nil, ("the '%s' limit cannot be enforced on this host yet"):format(name)
    end
  end
  -- the daemon's defaults for what the create leaves out (docs/limits.md)
  local lim = limits.effective(asked, self.defaults, self.enforces, b)
  local ok, cerr, cdata = self:_check_caps(lim, p._id)
  -- a cap that killed boxes still fill: their removal ends in a moment
  -- (bounded: life.lua), and a create right after a kill must fit
  while not ok and next(self.dying) do
    self:wait_one_dying()
    ok, cerr, cdata = self:_check_caps(lim, p._id)
  end
  if not ok then return nil, cerr, cdata end
  -- counted against the caps until it is a sandbox, or failed
  -- the volumes it mounts: claimed (one sandbox at a time) until it is a sandbox
  local vclaim, vcode, verr, vdata
  if p.volumes and next(p.volumes) then
    vclaim, vcode, verr, vdata = volumes.of(self):claim(p.volumes, b.name)
    if not vclaim then return nil, verr, vdata end
  end
  local token = {}
  self:_creating_put(token, lim.memory or 0)
  local sb, err = self:_finish_create(p, b, lim, plan, img, image, vclaim and vclaim.spec)
  self:_creating_put(token, nil)
  if sb then
    sb.volume_mounts = vclaim and vclaim.mounts
    self:_sb_put(sb.id, sb)
    sb.kill_on_disconnect = p.kill_on_disconnect == true or nil -- in the record (daemon/recover.lua)
    volumes.of(self):release(vclaim)
    self:set_timeout(sb, lim.timeout) -- also writes the record
    log("sandbox %s created", sb.id)
  end
  volumes.of(self):release(vclaim)
  return sb, err
end

-- The rest of a create that fits the caps: the box, its network, recipe,
-- image settings and default account.  Returns the sandbox (not yet in
-- self.sandboxes) or nil, err.
function D:_finish_create(p, b, lim, plan, img, image, vols)
  local sb, err = self:_make_box(b, lim, plan, img, image, p.accel, vols, p._id)
  if not sb then return nil, err end
  if self.stopping then -- the daemon began to shut down while this box started
    sb:destroy()
    return nil, "the daemon is shutting down"
  end
  self:_pool_hold(sb) -- the refill, once its first process has started (pool.lua)
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
  if img and img.snapshot then sb.snapshot, sb.cred = img.snapshot, img.cred end
  -- without a recipe, the default account is a function of the image's
  -- files alone (no code has run in the box yet): kept per image digest, a
  -- create of an image seen before asks its box nothing (two file reads
  -- through the agent, which under TCG are a microVM's slowest after a
  -- snapshot restore)
  local akey = not plan and not (img and img.snapshot)
    and (img and img.digest or (image == "default" and "default")) or nil
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
  if plan and plan.recipe.start then
    -- the recipe's start command, and its ready check the create waits for
    local ok, serr = start.run(sb, plan.recipe.start, guard.policies_of(self, sb))
    if not ok then
      sb:destroy()
      return nil, ("%s: %s"):format(plan.recipe.origin and plan.recipe.origin.file or plan.recipe.name, serr)
    end
    if self.stopping then
      sb:destroy()
      return nil, "the daemon is shutting down"
    end
  end
  return sb
end

-- What a recipe sets on a started box: its user (looked up in the box's
-- /etc/passwd) and its workdir (made if missing); sb.recipe says which
-- recipe and layer it came from (sandbox.get shows it).
function D:_apply_recipe(sb, plan, p)
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

return D
