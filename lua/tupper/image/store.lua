--- The image store (docs/images.md): content-addressed blobs, layers
-- unpacked once and shared read-only by every sandbox, refs naming images,
-- pins held by lockfiles, and imports of OCI image layouts, docker-archive
-- tars and plain rootfs tars or directories (image/import.lua; the OCI
-- format's pieces are image/oci.lua).
--
--   <dir>/blobs/sha256/<hex>   blobs (manifests, configs, layer tars), verified
--   <dir>/layers/<hex>/        a layer unpacked (hex of its diff id)
--   <dir>/index.json           the refs: an OCI image index, one manifest
--                              descriptor per ref (annotation
--                              org.opencontainers.image.ref.name), shared
--                              with the registry client (tupper.registry)
--   <dir>/pins.json            digest -> owners that keep it
--   <dir>/tmp/                 imports in progress (emptied at open)
--
-- Every function that reads or writes blobs or layers waits on the thread
-- pool: call it from a coroutine (tupper.async).
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")
local import = require("tupper.image.import")
local oci = require("tupper.image.oci")

local M = {}

M.MAX_JSON, M.MAX_LAYERS = oci.MAX_JSON, oci.MAX_LAYERS
M.LIMITS = {
  max_blob = 16 * 2 ^ 30 // 1,     -- one blob as stored
  max_tar_bytes = 16 * 2 ^ 30 // 1, -- one layer uncompressed
  max_bytes = 16 * 2 ^ 30 // 1,     -- the files of one layer
  max_entries = 1000000,            -- entries of one layer
}

local Store = {}
Store.__index = Store

-- the imports (image/import.lua) are methods of the store too
Store.import, Store._commit, Store._stage = import.import, import._commit, import._stage
Store._import_oci, Store._import_docker = import._import_oci, import._import_docker
Store._import_rootfs_tar = import._import_rootfs_tar

---------------------------------------------------------------- helpers

local function mkdir(path, mode)
  local ok, err, name = uv.fs_mkdir(path, mode)
  if not ok and name ~= "EEXIST" then return nil, err end
  return true
end

local read_file = paths.read_file
local hex, pick, config_of, decode_object = oci.hex, oci.pick, oci.config_of, oci.decode_object
local MEDIA_MANIFEST, INDEX_TYPES = oci.MEDIA_MANIFEST, oci.INDEX_TYPES

--- 1 if d is "sha256:<64 lowercase hex>".
M.valid_digest = oci.valid_digest
--- Normalizes an image reference as Docker does (image/oci.lua).
M.normalize = oci.normalize

local function write_atomic(path, text, mode)
  local tmp = path .. ".tmp"
  local fd, err = uv.fs_open(tmp, "w", mode or tonumber("600", 8))
  if not fd then return nil, err end
  local ok, werr = uv.fs_write(fd, text)
  if ok then ok, werr = uv.fs_fsync(fd) end
  uv.fs_close(fd)
  if ok then ok, werr = uv.fs_rename(tmp, path) end
  if not ok then uv.fs_unlink(tmp); return nil, werr end
  return true
end

---------------------------------------------------------------- open

--- Opens (creating it) the store at dir.  opts: uid_base, gid_base,
-- id_count, log(fmt, ...), default_digest() (the embedded image's identity,
-- for locks that pin it), pulling() (true while a pull writes blobs: prune
-- then leaves unreferenced blobs alone), default_layers (the embedded image's dirs), in_use() -> { digests
-- = set, layers = set } (what live sandboxes use), and limits (M.LIMITS).
function M.open(dir, opts)
  opts = opts or {}
  local self = setmetatable({ dir = dir, blobs = dir .. "/blobs/sha256", layers_dir = dir .. "/layers",
    tmp = dir .. "/tmp", uid_base = assert(opts.uid_base, "uid_base"),
    gid_base = opts.gid_base or opts.uid_base, id_count = opts.id_count or 65536,
    default_layers = opts.default_layers, default_digest = opts.default_digest,
    pulling = opts.pulling or function() return false end, in_use = opts.in_use or function() return { digests = {}, layers = {} } end,
    limits = setmetatable(opts.limits or {}, { __index = M.LIMITS }), log = opts.log or function() end,
    unpacking = {}, busy = {}, cache = {}, written = setmetatable({}, { __mode = "k" }) }, Store)
  for _, d in ipairs({ dir, dir .. "/blobs", self.blobs, self.layers_dir, self.tmp }) do
    local ok, err = mkdir(d, tonumber("711", 8))
    if not ok then return nil, err end
  end
  uv.fs_chmod(self.tmp, tonumber("700", 8))
  -- what a crashed import or unpack left
  local ok, err = self:_sweep_temps()
  if not ok then return nil, err end
  if not uv.fs_stat(dir .. "/oci-layout") then
    write_atomic(dir .. "/oci-layout", '{"imageLayoutVersion":"1.0.0"}', tonumber("644", 8))
  end
  return self
end

local function scandir(path)
  local names = {}
  local h = uv.fs_scandir(path)
  while h do
    local name, t = uv.fs_scandir_next(h)
    if not name then break end
    names[#names + 1] = { name = name, type = t }
  end
  return names
end

function Store:_sweep_temps()
  for _, e in ipairs(scandir(self.tmp)) do
    local ok, err = core.rmtree(self.tmp .. "/" .. e.name)
    if not ok then return nil, err end
  end
  for _, d in ipairs({ self.blobs, self.layers_dir }) do
    for _, e in ipairs(scandir(d)) do
      if e.name:sub(1, 5) == ".tmp-" then core.rmtree(d .. "/" .. e.name) end
    end
  end
  return true
end

local REF_NAME = "org.opencontainers.image.ref.name"
local CREATED = "org.opencontainers.image.created"

-- index.json as it is now (the registry client writes it too: always read
-- afresh, and changed with no yield between the read and the rename).
function Store:_index()
  local text = uv.fs_stat(self.dir .. "/index.json") and read_file(self.dir .. "/index.json", M.MAX_JSON)
  local t = text and json.decode(text)
  if type(t) ~= "table" or type(t.manifests) ~= "table" then
    t = { schemaVersion = 2, mediaType = "application/vnd.oci.image.index.v1+json", manifests = {} }
  end
  return t
end

--- The refs: name -> { digest, created }.
function Store:refs()
  local out = {}
  for _, m in ipairs(self:_index().manifests) do
    local a = type(m) == "table" and type(m.annotations) == "table" and m.annotations
    if a and type(a[REF_NAME]) == "string" and M.valid_digest(m.digest) then
      out[a[REF_NAME]] = { digest = m.digest, created = type(a[CREATED]) == "string" and a[CREATED] or nil }
    end
  end
  return out
end

-- Sets (digest given) or drops the ref name in index.json.
function Store:_set_ref(name, digest)
  local t = self:_index()
  local out = {}
  for _, m in ipairs(t.manifests) do
    local a = type(m) == "table" and type(m.annotations) == "table" and m.annotations
    if not (a and a[REF_NAME] == name) then out[#out + 1] = m end
  end
  if digest then
    local st = uv.fs_stat(self:blob_path(digest))
    out[#out + 1] = { mediaType = MEDIA_MANIFEST, digest = digest, size = st and st.size or 0,
                      annotations = { [REF_NAME] = name, [CREATED] = oci.now() } }
  end
  t.manifests = json.array(out)
  return write_atomic(self.dir .. "/index.json", json.encode(t), tonumber("644", 8))
end

--- The pins: digest -> { owner = true }.
function Store:pins()
  local text = uv.fs_stat(self.dir .. "/pins.json") and read_file(self.dir .. "/pins.json", M.MAX_JSON)
  local t = text and json.decode(text)
  local out = {}
  for d, owners in pairs(type(t) == "table" and t or {}) do
    if M.valid_digest(d) and type(owners) == "table" and next(owners) then out[d] = owners end
  end
  return out
end

function Store:_save_pins(pins)
  return write_atomic(self.dir .. "/pins.json", next(pins) and json.encode(pins) or "{}")
end

---------------------------------------------------------------- blobs and layers

function Store:blob_path(digest) return self.blobs .. "/" .. hex(digest) end
function Store:layer_path(diff_id) return self.layers_dir .. "/" .. hex(diff_id) end

--- Copies the file at path into the store; verifies want when given.
-- Returns the digest.
function Store:put_blob(path, want)
  -- a blob is what its digest says: one in the store already needs no copy
  if want and M.valid_digest(want) and uv.fs_stat(self:blob_path(want)) then return want end
  local digest, err = async.wait(function(cb)
    local ok, e = core.blob_put(path, self.blobs, want, self.limits.max_blob, cb)
    if not ok then cb(nil, e) end
  end)
  self:_wrote("blobs", digest)
  return digest, err
end

-- Notes what an import (this coroutine) added, so that a failed one can
-- take it back.
function Store:_wrote(kind, digest)
  local w = digest and self.written[coroutine.running()]
  if w then w[kind][hex(digest)] = true end
end

-- A JSON blob of the store, verified on every read (a blob is immutable,
-- so a parsed one is cached by digest).
function Store:_json_blob(digest, what)
  if self.cache[digest] then return self.cache[digest] end
  if not M.valid_digest(digest) then return nil, what .. ": bad digest" end
  local path = self:blob_path(digest)
  local text, err = read_file(path, M.MAX_JSON)
  if not text then return nil, ("%s %s: %s"):format(what, digest, err) end
  local got = async.wait(function(cb)
    local ok, e = core.blob_put(path, nil, digest, M.MAX_JSON, cb)
    if not ok then cb(nil, e) end
  end)
  if got ~= digest then return nil, ("%s %s: the blob does not match its digest"):format(what, digest) end
  local v, derr = decode_object(text, what)
  if not v then return nil, derr end
  self.cache[digest] = v
  return v
end

-- Adds text as a blob; returns its digest.
function Store:_put_text(text)
  local tmp = self.tmp .. "/text-" .. core.random_hex(8)
  local ok, err = write_atomic(tmp, text, tonumber("600", 8))
  if not ok then return nil, err end
  local digest, perr = self:put_blob(tmp)
  uv.fs_unlink(tmp)
  return digest, perr
end

--- Unpacks the layer blob `digest` (diff id diff_id) unless it is there;
-- two callers for one layer share one unpack.  Returns its dir.
function Store:ensure_layer(digest, diff_id)
  if not M.valid_digest(diff_id) then return nil, "bad diff id" end
  local path = self:layer_path(diff_id)
  if uv.fs_stat(path) then return path end
  local waiting = self.unpacking[diff_id]
  if waiting then
    return async.wait(function(cb) waiting[#waiting + 1] = cb end)
  end
  waiting = {}
  self.unpacking[diff_id] = waiting
  self.log("unpacking image layer %s", diff_id)
  local info, err = async.wait(function(cb)
    local ok, e = core.layer_unpack({ blob = self:blob_path(digest), dir = self.layers_dir,
      uid_base = self.uid_base, gid_base = self.gid_base, id_count = self.id_count,
      max_tar_bytes = self.limits.max_tar_bytes, max_bytes = self.limits.max_bytes,
      max_entries = self.limits.max_entries, digest = digest, diff_id = diff_id }, cb)
    if not ok then cb(nil, e) end
  end)
  self.unpacking[diff_id] = nil
  if info and not info.existed then
    self:_wrote("layers", diff_id)
    self.log("image layer %s unpacked (%d entries, %d bytes)", diff_id, info.entries, info.bytes)
  end
  local res, rerr = info and path or nil, info and nil or ("layer %s: %s"):format(digest, tostring(err))
  for _, cb in ipairs(waiting) do cb(res, rerr) end
  return res, rerr
end

---------------------------------------------------------------- images

-- The manifest and config of an image by manifest digest (or by the
-- digest of an image index: this host's manifest in it), checked.
function Store:_load(digest)
  local m, err = self:_json_blob(digest, "manifest")
  if not m then return nil, err end
  local index_digest
  if INDEX_TYPES[m.mediaType] or (m.manifests and not m.layers) then
    local d, perr = pick(m, nil, "image index " .. digest)
    if not d then return nil, perr end
    if not M.valid_digest(d.digest) then return nil, "image index " .. digest .. ": bad digest" end
    index_digest, digest = digest, d.digest
    m, err = self:_json_blob(digest, "manifest")
    if not m then return nil, err end
  end
  if type(m.config) ~= "table" or not M.valid_digest(m.config.digest) or type(m.layers) ~= "table" then
    return nil, "manifest " .. digest .. " lacks a config or layers"
  end
  if #m.layers < 1 or #m.layers > M.MAX_LAYERS then
    return nil, ("manifest %s has %d layers (1..%d allowed)"):format(digest, #m.layers, M.MAX_LAYERS)
  end
  local cfg, cerr = self:_json_blob(m.config.digest, "config")
  if not cfg then return nil, cerr end
  local diffs = type(cfg.rootfs) == "table" and cfg.rootfs.diff_ids
  if type(diffs) ~= "table" or #diffs ~= #m.layers then
    return nil, "config of " .. digest .. ": rootfs.diff_ids does not match the layers"
  end
  local layers = {}
  for i, l in ipairs(m.layers) do
    if type(l) ~= "table" or not M.valid_digest(l.digest) or not M.valid_digest(diffs[i]) then
      return nil, ("manifest %s: layer %d has a bad digest"):format(digest, i)
    end
    layers[i] = { digest = l.digest, diff_id = diffs[i], size = math.tointeger(l.size) or 0,
                  media_type = l.mediaType }
  end
  return { manifest = m, config = cfg, layers = layers, manifest_digest = digest,
           index_digest = index_digest }
end

-- The image table the daemon starts boxes from (layer dirs unpacked).
function Store:_image(ref, digest)
  local loaded, err = self:_load(digest)
  if not loaded then return nil, err end
  local dirs = {}
  for i, l in ipairs(loaded.layers) do
    local path, lerr = self:ensure_layer(l.digest, l.diff_id)
    if not path then return nil, lerr end
    dirs[i] = path
  end
  return { ref = ref, digest = digest, layers = dirs, config = config_of(loaded.config) }
end

--- The image named ref ("default", a reference or a manifest digest):
-- { ref, digest, layers = { dir, ... lowest first }, config = { env,
-- entrypoint, cmd, workdir, user } }, its layers unpacked.  nil, err for
-- an image the store does not hold.
function Store:resolve(ref)
  local ddigest = self.default_digest and self.default_digest()
  if ref == "default" or (ddigest and ref == ddigest) then
    if not self.default_layers then return nil, "no default image" end
    return { ref = "default", digest = ddigest, layers = self.default_layers,
             config = { env = {}, workdir = "/", user = "root" } }
  end
  local name, err = M.normalize(ref)
  if not name then return nil, err end
  local refs = self:refs()
  local digest = refs[name] and refs[name].digest
  local pinned = name:match("@(sha256:%x+)$") or (M.valid_digest(name) and name)
  if not digest and pinned then
    for _, r in pairs(refs) do
      if r.digest == pinned then digest = pinned end
    end
    if not digest and (self:pins()[pinned] or name:find("@")) and uv.fs_stat(self:blob_path(pinned)) then
      digest = pinned
    end
  end
  if not digest and M.valid_digest(name) then
    return nil, ("image %s is not in the store; images are pulled by name (a name, or name@%s)"):format(name, name)
  end
  if not digest then return nil, ("no image '%s' in the store (tupper import or pull it)"):format(ref) end
  self.busy[digest] = (self.busy[digest] or 0) + 1
  local img, ierr = self:_image(name, digest)
  self.busy[digest] = self.busy[digest] - 1
  if self.busy[digest] == 0 then self.busy[digest] = nil end
  return img, ierr
end

--- Records ref -> the manifest blob `digest` (already in the store, with
-- its config and layer blobs: img-pull's path) after unpacking its layers.
function Store:tag(ref, digest)
  local name, err = M.normalize(ref)
  if not name or name == "default" or M.valid_digest(name) then
    return nil, err or ("'%s' cannot name an image"):format(ref)
  end
  self.busy[digest] = (self.busy[digest] or 0) + 1
  local img, ierr = self:_image(name, digest)
  self.busy[digest] = self.busy[digest] - 1
  if self.busy[digest] == 0 then self.busy[digest] = nil end
  if not img then return nil, ierr end
  local ok, serr = self:_set_ref(name, digest)
  if not ok then return nil, serr end
  return img
end

local function sum_sizes(loaded)
  local n = 0
  for _, l in ipairs(loaded.layers) do n = n + l.size end
  return n
end

--- Every named image: { ref, digest, created, size, layers, in_use }.
function Store:list()
  local used = self.in_use().digests
  local out = {}
  for name, r in pairs(self:refs()) do
    local loaded = self:_load(r.digest)
    out[#out + 1] = { ref = name, digest = r.digest, created = r.created,
      size = loaded and sum_sizes(loaded) or 0, layers = loaded and #loaded.layers or 0,
      in_use = used[r.digest] and true or false }
  end
  table.sort(out, function(a, b) return a.ref < b.ref end)
  return out
end

--- Details of one image: its config, layers, pins.
function Store:inspect(ref)
  if ref == "default" then
    return { ref = "default", layers = json.array({}), config = { env = json.array({}), workdir = "/", user = "root" } }
  end
  local name, err = M.normalize(ref)
  if not name then return nil, err end
  local r = self:refs()[name]
  local digest = r and r.digest or (M.valid_digest(name) and name)
  if not digest or not uv.fs_stat(self:blob_path(digest)) then
    return nil, ("no image '%s' in the store"):format(ref)
  end
  local loaded, lerr = self:_load(digest)
  if not loaded then return nil, lerr end
  local cfg = config_of(loaded.config)
  local layers = {}
  for i, l in ipairs(loaded.layers) do layers[i] = { digest = l.digest, diff_id = l.diff_id, size = l.size } end
  local owners = {}
  for owner in pairs(self:pins()[digest] or {}) do owners[#owners + 1] = owner end
  table.sort(owners)
  return { ref = r and name or nil, digest = digest, created = r and r.created or loaded.config.created,
    os = loaded.config.os, architecture = loaded.config.architecture, size = sum_sizes(loaded),
    layers = layers, pins = json.array(owners),
    config = { env = json.array(cfg.env), entrypoint = cfg.entrypoint, cmd = cfg.cmd,
               workdir = cfg.workdir, user = cfg.user } }
end

---------------------------------------------------------------- pins, removal, prune

--- Keeps the image `digest` (and its blobs and layers) from prune and
-- remove while owner (a lockfile's path, say) holds it.
function Store:pin(digest, owner)
  if not M.valid_digest(digest) then return nil, "pin: bad digest" end
  if type(owner) ~= "string" or owner == "" or #owner > 1024 then return nil, "pin: bad owner" end
  local pins = self:pins()
  pins[digest] = pins[digest] or {}
  pins[digest][owner] = true
  return self:_save_pins(pins)
end

function Store:unpin(digest, owner)
  local pins = self:pins()
  local p = pins[digest]
  if p then
    p[owner] = nil
    if not next(p) then pins[digest] = nil end
  end
  return self:_save_pins(pins)
end

-- The blobs and layer dirs reachable from refs, pins, live sandboxes and
-- images being resolved or imported.
function Store:_reachable()
  local used = self.in_use()
  local blobs, layers, roots = {}, {}, {}
  for _, r in pairs(self:refs()) do roots[r.digest] = true end
  for d in pairs(self:pins()) do roots[d] = true end
  for d in pairs(used.digests) do roots[d] = true end
  for d in pairs(self.busy) do roots[d] = true end
  for d in pairs(roots) do
    blobs[hex(d)] = true
    local loaded = uv.fs_stat(self:blob_path(d)) and self:_load(d)
    if loaded then
      blobs[hex(loaded.manifest_digest)] = true
      blobs[hex(loaded.manifest.config.digest)] = true
      for _, l in ipairs(loaded.layers) do
        blobs[hex(l.digest)] = true
        layers[hex(l.diff_id)] = true
      end
    end
  end
  for path in pairs(used.layers) do
    local h = path:match("/layers/(%x+)$")
    if h then layers[h] = true end
  end
  return blobs, layers
end

M.PRUNE_GRACE = 600 -- seconds: prune leaves younger unreachable blobs (a pull in progress)

-- Removes what nothing reaches; only = { blobs = set, layers = set } of
-- hex names limits it to those (else: every layer, and every blob older
-- than grace seconds).  Returns the counts removed.
function Store:_collect(only, grace)
  local blobs, layers = self:_reachable()
  local nb, nl = 0, 0
  local now = os.time()
  local function candidate(kind, dir, name)
    if not (name:match("^%x+$") and #name == 64) then return false end
    if only then return only[kind][name] == true end
    for _, w in pairs(self.written) do -- an import in progress: not committed yet
      if w[kind][name] then return false end
    end
    if kind == "layers" then return true end -- made by the store alone; unpacking ones are skipped
    if self.pulling() then return false end -- a pull's blobs are not referenced until it ends
    local st = uv.fs_lstat(dir .. "/" .. name)
    return st and now - st.mtime.sec >= (grace or 0)
  end
  for _, e in ipairs(scandir(self.blobs)) do
    if not blobs[e.name] and candidate("blobs", self.blobs, e.name) then
      if uv.fs_unlink(self.blobs .. "/" .. e.name) then nb = nb + 1 end
      self.cache["sha256:" .. e.name] = nil
    end
  end
  for _, e in ipairs(scandir(self.layers_dir)) do
    if not layers[e.name] and not self.unpacking["sha256:" .. e.name]
        and candidate("layers", self.layers_dir, e.name) then
      if core.rmtree(self.layers_dir .. "/" .. e.name) then nl = nl + 1 end
    end
  end
  return nb, nl
end

-- The hex names of an image's blobs and layers.
function Store:_parts(digest)
  local only = { blobs = { [hex(digest)] = true }, layers = {} }
  local loaded = self:_load(digest)
  if loaded then
    only.blobs[hex(loaded.manifest_digest)] = true
    only.blobs[hex(loaded.manifest.config.digest)] = true
    for _, l in ipairs(loaded.layers) do
      only.blobs[hex(l.digest)] = true
      only.layers[hex(l.diff_id)] = true
    end
  end
  return only
end

--- Removes the ref; its blobs and layers go unless another image, a pin
-- or a live sandbox needs them.  Refused while a sandbox uses the image.
function Store:remove(ref)
  local name, err = M.normalize(ref)
  if not name then return nil, err end
  if name == "default" then return nil, "the embedded 'default' image cannot be removed" end
  local r = self:refs()[name]
  if not r then return nil, ("no image '%s' in the store"):format(ref) end
  local used = self.in_use()
  if used.digests[r.digest] or self.busy[r.digest] then
    return nil, ("image '%s' is in use by a sandbox: kill it first"):format(name)
  end
  local parts = self:_parts(r.digest)
  local ok, serr = self:_set_ref(name, nil)
  if not ok then return nil, serr end
  local nb, nl = self:_collect(parts)
  return { ref = name, digest = r.digest, blobs = nb, layers = nl }
end

--- Removes every blob and layer no ref, pin or live sandbox reaches; with
-- all, also the refs of images neither pinned nor used by a sandbox.
function Store:prune(all, grace)
  local refs = {}
  local parts = { blobs = {}, layers = {} }
  if all then
    local used = self.in_use().digests
    local pins = self:pins()
    for name, r in pairs(self:refs()) do
      if not used[r.digest] and not pins[r.digest] and not self.busy[r.digest] then
        local p = self:_parts(r.digest)
        for k in pairs(p.blobs) do parts.blobs[k] = true end
        for k in pairs(p.layers) do parts.layers[k] = true end
        local ok, err = self:_set_ref(name, nil)
        if not ok then return nil, err end
        refs[#refs + 1] = name
      end
    end
    table.sort(refs)
  end
  self:_sweep_temps_idle()
  local nb, nl = self:_collect(parts)
  local nb2, nl2 = self:_collect(nil, grace or M.PRUNE_GRACE)
  nb, nl = nb + nb2, nl + nl2
  return { refs = json.array(refs), blobs = nb, layers = nl }
end

-- Temp files of imports that are not running any more (a crash's).
function Store:_sweep_temps_idle()
  if next(self.unpacking) or (self.importing or 0) > 0 then return end
  self:_sweep_temps()
end

return M
