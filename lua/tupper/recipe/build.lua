--- Sandboxes from recipes: resolving a recipe a client sent (its source
-- text, or the name of a shipped one), its image and lock, and the layer
-- its files and setup make (built once, then served from the layer store).
-- The daemon's create path and `recipe.build` call M.prepare.
-- docs/recipes.md.
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")
local debian = require("tupper.image.debian")
local layers = require("tupper.image.layers")
local recipe = require("tupper.recipe.file")
local setup = require("tupper.recipe.setup")
local vm = require("tupper.recipe.jail")

local M = {}

local load_recipe

M.LOCK_VERSION = 1
M.LOCK_MAX = 1024 * 1024

-- A name for messages: what the client calls its file, made printable.
local function chunkname(name)
  if type(name) ~= "string" or name == "" then return "recipe.lua" end
  name = name:gsub("[%c]", "?")
  if #name > 200 then name = "..." .. name:sub(-197) end
  return name
end

--- The recipe a create or build names: spec = { name, source, lock }
-- (source text and a file name for messages, or the name of a shipped
-- recipe).  Returns { recipe, source, chunk, lock } or nil, err.
function M.load(spec)
  local r, source, chunk = load_recipe(spec)
  if not r then return nil, source end
  return { recipe = r, source = source, chunk = chunk, lock = spec.lock }
end

load_recipe = function(spec)
  local source, chunk = spec.source, nil
  if source then
    chunk = chunkname(spec.name)
  else
    if not spec.name then return nil, "'recipe' needs a 'source' or the 'name' of a shipped recipe" end
    source, chunk = recipe.embedded_source(spec.name)
    if not source then return nil, chunk end
  end
  local r, err = recipe.load_string(source, chunk)
  if not r then return nil, err end
  -- the one place where a recipe asks for what the runtime cannot enforce
  -- (network rules it cannot parse): refused, never ignored
  local ok, why = recipe.check_enforceable(r)
  if not ok then return nil, why end
  return r, source, chunk
end

--- The identity of the embedded default image: a hash of what it is made of
-- (the busybox binary and the daemon's version, which lays it out).
function M.default_digest(d)
  if d.default_digest then return d.default_digest end
  local fd = uv.fs_open(d.default_image .. "/bin/busybox", "r", 0)
  local parts = { "tupper-default-image", core.version }
  if fd then
    local st = uv.fs_fstat(fd)
    local off = 0
    while st and off < st.size do
      local chunk = uv.fs_read(fd, 1048576, off)
      if not chunk or #chunk == 0 then break end
      parts[#parts + 1] = chunk
      off = off + #chunk
    end
    uv.fs_close(fd)
  end
  d.default_digest = "sha256:" .. core.sha256(table.concat(parts, "\0"))
  return d.default_digest
end

--- How messages and sandbox.get name a recipe's image: its name, or for a
-- Debian image to build "debian:<suite>".
function M.image_name(image)
  if type(image) == "table" then return "debian:" .. tostring(image.debian) end
  return image
end

-- A Debian image (recipe field image = { debian, packages }): built with
-- tupper.debian (cached by its content key), or from a lock's exact package
-- versions (rebuild), imported once into the image store under a name of
-- that key, and resolved there.  Returns the image with `debian` (what a
-- lockfile keeps: the package list) or nil, err.
local function debian_image(d, spec, pinned, rebuild)
  if not (d.images and d.images.import and d.images.resolve) then
    return nil, "a Debian image needs the daemon's image store, which this build lacks"
  end
  if pinned and not rebuild then
    -- a locked create: exactly the pinned image, no build
    local img = d.images:resolve(pinned)
    if not img then
      return nil, ("the image %s pinned by the lock (%s) is gone: `tupper build` rebuilds it from the lock's packages")
        :format(M.image_name(spec), pinned)
    end
    return img
  end
  -- built (or found) and imported once, as localhost/tupper/debian-<suite>:<key>
  local img, err = debian.image(d.images, spec, { cache = d.state .. "/debian", lock = rebuild })
  if not img then return nil, "image: " .. tostring(err) end
  return img
end

--- Resolves a recipe's image: { ref, digest, layers, config }.  With the
-- image store (tupper.images) when the daemon has one; else only the
-- embedded "default".  pinned: a digest a lock names, used instead of what
-- the name resolves to now.  rebuild: a Debian lock to rebuild from.
function M.image(d, ref, pinned, rebuild)
  if type(ref) == "table" then return debian_image(d, ref, pinned, rebuild) end
  if d.images and d.images.resolve then
    local img, err = d.images:resolve(pinned or ref)
    if not img and not pinned and ref ~= "default" and d.pull_image then
      -- pulled on first use, as a create of that image would
      local pulled, perr = d:pull_image(ref)
      if pulled then
        img, err = d.images:resolve(ref)
      elseif perr then
        err = ("%s; pulling it failed: %s"):format(tostring(err), perr)
      end
    end
    if not img then
      if pinned then
        return nil, ("the image %s pinned by the lock (%s) is gone: run `tupper build` again"):format(ref, pinned)
      end
      return nil, err
    end
    return img
  end
  if ref ~= "default" then
    return nil, ("image '%s' is not available (this daemon has only the embedded 'default' image)"):format(ref)
  end
  local img = { ref = "default", digest = M.default_digest(d), layers = { d.default_image }, config = {} }
  if pinned and pinned ~= img.digest then
    return nil, ("the image default pinned by the lock (%s) is gone: this daemon's is %s; run `tupper build` again")
      :format(pinned, img.digest)
  end
  return img
end

--- Parses and checks a lock (the text of a RECIPE.lock) against the
-- recipe's source.  Returns the lock table or nil, err.
function M.parse_lock(text, source, chunk)
  if #text > M.LOCK_MAX then return nil, "the lock is larger than 1 MiB" end
  local ok, lock = pcall(json.decode, text)
  if not ok or type(lock) ~= "table" then return nil, "the lock is not a JSON object" end
  if lock.version ~= M.LOCK_VERSION then
    return nil, ("the lock has version %s; this daemon reads version %d"):format(tostring(lock.version), M.LOCK_VERSION)
  end
  for _, k in ipairs({ "recipe_sha256", "image", "image_digest" }) do
    if type(lock[k]) ~= "string" or #lock[k] > 300 then return nil, ("the lock's '%s' is missing"):format(k) end
  end
  if lock.layer ~= nil and lock.layer ~= json.null and not layers.valid_key(lock.layer) then
    return nil, "the lock's 'layer' is not a layer key"
  end
  local sha = core.sha256(source)
  if lock.recipe_sha256 ~= sha then
    return nil, ("%s changed since it was locked (sha256 %s, the lock says %s): run `tupper build` again")
      :format(chunk, sha:sub(1, 12), lock.recipe_sha256:sub(1, 12))
  end
  return lock
end

-- Builds the layer at <tmp>/fs: a fresh box of the image with the recipe's
-- limits (not the disk cap: the layer is the box's upper dir), files
-- written, setup run; then the box goes and its upper dir stays.
local function build_layer(d, r, img, tmp, chunk, policies, on_log)
  local lim = r.limits or {}
  local sb, err = d:_start_box(d:_new_id(), { memory = lim.memory, pids = lim.pids, cpus = lim.cpus }, img.layers)
  if not sb then return nil, err end
  if r.network ~= nil and r.network ~= "none" then
    -- setup reaches what the recipe's rules allow (pip install, ...), as
    -- narrowed by the policies that bind the sandbox
    local nets = {}
    for _, pol in ipairs(policies) do
      if pol.network ~= nil then nets[#nets + 1] = pol.network end
    end
    local nok, nerr = sb:set_network(r.network, nets)
    if not nok then
      sb:destroy()
      return nil, ("%s: network: %s"):format(chunk, tostring(nerr))
    end
  end
  -- setup's commands see the image's Env and the recipe's env, as the
  -- sandbox's processes will (not its user: setup runs as root)
  local env = {}
  for _, kv in ipairs(img.config and img.config.env or {}) do
    local k, v = kv:match("^([^=]+)=(.*)$")
    if k then env[k] = v end
  end
  for k, v in pairs(r.env or {}) do env[k] = v end
  sb.env = env
  local ctx = { policies = policies, on_log = on_log }
  local hooks = setup.hooks(ctx)
  sb.hooks.on_output, sb.hooks.on_exit = hooks.on_output, hooks.on_exit
  sb.hooks.on_down = function() end
  d.setups[sb] = true
  local ok = true
  local paths = {}
  for path in pairs(r.files or {}) do paths[#paths + 1] = path end
  table.sort(paths)
  for _, path in ipairs(paths) do
    local parent = path:match("^(.*)/[^/]*$")
    if parent and parent ~= "" then
      sb:request(core.MSG.FS_MKDIR, { path = parent, mode = 493, flags = 1 })
    end
    local wok, werr = pcall(function()
      local allowed, why = setup.check_file(ctx, "write", path)
      if not allowed then error(why, 0) end
      local data, off = r.files[path], 0
      repeat
        local piece = data:sub(off + 1, off + core.CHUNK_MAX)
        local res, e = sb:request(core.MSG.FS_WRITE, { path = path, data = piece, offset = off,
          flags = 4 | (off == 0 and 1 or 0), mode = 420 })
        if not res then error(e, 0) end
        off = off + #piece
      until off >= #data
    end)
    if not wok then
      ok, err = nil, ("%s: files[%q]: %s"):format(chunk, path, tostring(werr))
      break
    end
  end
  if ok and r.setup then
    ok, err = setup.run(r, sb, ctx)
    if not ok then err = "setup failed: " .. err end
  end
  d.setups[sb] = nil
  local dok, derr = sb:destroy(ok and (tmp .. "/fs") or nil)
  if ok and not dok then return nil, "keep the setup layer: " .. tostring(derr) end
  if ok and not uv.fs_stat(tmp .. "/fs") then
    -- the box went (a daemon shutdown destroyed it) before its layer was kept
    return nil, "the setup box went away before its layer was kept"
  end
  return ok, err
end

--- Everything a create or build from recipe spec needs: returns
-- { recipe = r, image = img, layers = {...}, layer = key|nil, cached,
--   lock = what a lockfile of it says } or nil, err.
-- loaded: what M.load returned.  opts: build (recipe.build: a lock sent
-- along is not honoured but rebuilt from, for its Debian packages; the
-- image is pinned in the store), policies (they judge the setup's
-- commands and files), on_log(stream, data) (the output of setup's
-- commands, as they run, when the layer is built here).
function M.prepare(d, loaded, opts)
  opts = opts or {}
  local r, source, chunk = loaded.recipe, loaded.source, loaded.chunk
  local lock
  if loaded.lock and not opts.build then
    local err
    lock, err = M.parse_lock(loaded.lock, source, chunk)
    if not lock then return nil, chunk .. ": " .. err end
  end
  -- a build from a recipe that has not changed since its lock rebuilds
  -- the lock's Debian packages exactly; other builds start afresh
  local rebuild
  if opts.build and loaded.lock then
    local old = M.parse_lock(loaded.lock, source, chunk)
    rebuild = old and type(old.debian) == "table" and old.debian or nil
  end
  local img, err
  if opts.build then
    img, err = M.image(d, r.image, nil, rebuild)
  else
    img, err = M.image(d, r.image, lock and lock.image_digest)
  end
  if not img then return nil, chunk .. ": " .. err end
  local layers_list = {}
  for i, l in ipairs(img.layers) do layers_list[i] = l end
  local key, cached = nil, nil
  if r.setup or r.files then
    key = layers.key(img.digest, source, r.files)
    if lock and not opts.build and lock.layer and lock.layer ~= json.null and lock.layer ~= key then
      return nil, ("%s: the lock names layer %s, but the recipe and its image make %s: run `tupper build` again")
        :format(chunk, lock.layer:sub(1, 12), key:sub(1, 12))
    end
    local info = { recipe = r.name, file = chunk, image = img.ref, image_digest = img.digest,
                   built_at = os.date("!%Y-%m-%dT%H:%M:%SZ"), setup = r.setup ~= nil }
    local layer, built = d.layer_store:ensure(key, function(tmp)
      return build_layer(d, r, img, tmp, chunk, opts.policies or {}, opts.on_log)
    end, info)
    if not layer then return nil, built end
    cached = not built
    layers_list[#layers_list + 1] = layer.fs
  end
  -- a build pins its image in the store: a lock names it by digest
  if opts.build and d.images and d.images.pin and img.digest then
    pcall(d.images.pin, d.images, img.digest, "recipe-lock:" .. (key or core.sha256(source)))
  end
  return {
    recipe = r, image = img, layers = layers_list, layer = key, cached = cached,
    lock = { version = M.LOCK_VERSION, recipe = r.name, recipe_sha256 = core.sha256(source),
             image = img.ref, image_digest = img.digest, layer = key or json.null,
             debian = img.debian },
  }
end

return M
