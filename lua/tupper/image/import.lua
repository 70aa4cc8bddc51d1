--- Imports into the image store (image/store.lua): OCI image layouts,
-- docker-archives (`docker save`) and plain rootfs tars or directories,
-- each checked as hostile input.  These are methods of the store: store.lua
-- puts them on its Store class; call them from a coroutine (tupper.async).
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")
local oci = require("tupper.image.oci")

local M = {}

local hex, pick, host_arch, manifest_for = oci.hex, oci.pick, oci.host_arch, oci.manifest_for
local decode_object, read_file = oci.decode_object, paths.read_file

-- path inside root (no symlink leading out), or nil.
local function inside(root, rel)
  if type(rel) ~= "string" or rel == "" or rel:sub(1, 1) == "/" or #rel > 4096 then return nil end
  for part in rel:gmatch("[^/]+") do
    if part == ".." then return nil end
  end
  local real = uv.fs_realpath(root .. "/" .. rel)
  local rroot = uv.fs_realpath(root)
  if not real or not rroot or real:sub(1, #rroot + 1) ~= rroot .. "/" then return nil end
  local st = uv.fs_stat(real)
  if not st or st.type ~= "file" then return nil end
  return real
end

-- Adds a manifest whose config and layer blobs are in the store: checks
-- it, unpacks the layers, returns its digest.
function M:_commit(manifest_text)
  local digest, err = self:_put_text(manifest_text)
  if not digest then return nil, err end
  self.busy[digest] = (self.busy[digest] or 0) + 1
  local img, ierr = self:_image(nil, digest)
  self.busy[digest] = self.busy[digest] - 1
  if self.busy[digest] == 0 then self.busy[digest] = nil end
  if not img then return nil, ierr end
  return digest
end

local function file_size(path)
  local st = uv.fs_stat(path)
  return st and st.size or 0
end

-- A plain rootfs tar (any compression the unpacker takes): one layer.
-- staged: the dir it was unpacked into already, named by its diff id hex.
function M:_import_rootfs_tar(path, staged)
  local digest, err = self:put_blob(path)
  if not digest then return nil, err end
  local info
  if staged then
    -- the stage is that layer, unpacked by the same rules: move it in
    local h = staged:match("(%x+)$")
    info = { diff_id = "sha256:" .. h }
    local ok, rerr, code = uv.fs_rename(staged, self.layers_dir .. "/" .. h)
    if ok then self:_wrote("layers", info.diff_id)
    elseif code ~= "EEXIST" and code ~= "ENOTEMPTY" then return nil, rerr end
  else
    local uerr
    info, uerr = async.wait(function(cb)
      local ok, e = core.layer_unpack({ blob = self:blob_path(digest), dir = self.layers_dir,
        uid_base = self.uid_base, gid_base = self.gid_base, id_count = self.id_count,
        max_tar_bytes = self.limits.max_tar_bytes, max_bytes = self.limits.max_bytes,
        max_entries = self.limits.max_entries, digest = digest }, cb)
      if not ok then cb(nil, e) end
    end)
    if not info then return nil, uerr end
    if not info.existed then self:_wrote("layers", info.diff_id) end
  end
  local cfg = json.encode({ architecture = host_arch(), os = "linux", created = oci.now(),
    config = { Env = { "PATH=" .. paths.DEFAULT_PATH } },
    rootfs = { type = "layers", diff_ids = { info.diff_id } } })
  local cdigest, cerr = self:_put_text(cfg)
  if not cdigest then return nil, cerr end
  return self:_commit(manifest_for(cdigest, #cfg, { { digest = digest, size = file_size(path) } }))
end

-- docker save's layout: manifest.json [{ Config, RepoTags, Layers }].
function M:_import_docker(root)
  local text, err = read_file(root .. "/manifest.json", oci.MAX_JSON)
  if not text then return nil, err end
  local list = json.decode(text)
  if type(list) ~= "table" or type(list[1]) ~= "table" then return nil, "manifest.json: not a list of images" end
  if #list > 1 then return nil, "manifest.json holds several images: import one archive per image" end
  local entry = list[1]
  local cpath = inside(root, entry.Config)
  if not cpath then return nil, "manifest.json: Config is not a file of the archive" end
  local want = type(entry.Config) == "string" and entry.Config:match("(%x+)%.json$")
  want = want and #want == 64 and ("sha256:" .. want) or nil
  local bw = type(entry.Config) == "string" and entry.Config:match("^blobs/sha256/(%x+)$")
  if bw and #bw == 64 then want = "sha256:" .. bw end
  local cdigest, cerr = self:put_blob(cpath, want)
  if not cdigest then return nil, "config: " .. cerr end
  local cfg, perr = self:_json_blob(cdigest, "config")
  if not cfg then return nil, perr end
  if type(entry.Layers) ~= "table" or #entry.Layers < 1 or #entry.Layers > oci.MAX_LAYERS then
    return nil, "manifest.json: Layers must list 1 to " .. oci.MAX_LAYERS .. " layers"
  end
  local layers = {}
  for i, rel in ipairs(entry.Layers) do
    local lpath = inside(root, rel)
    if not lpath then return nil, ("manifest.json: layer %d is not a file of the archive"):format(i) end
    local lw = type(rel) == "string" and rel:match("^blobs/sha256/(%x+)$")
    local digest, lerr = self:put_blob(lpath, lw and #lw == 64 and "sha256:" .. lw or nil)
    if not digest then return nil, ("layer %d: %s"):format(i, lerr) end
    layers[i] = { digest = digest, size = file_size(lpath) }
  end
  local tag = type(entry.RepoTags) == "table" and type(entry.RepoTags[1]) == "string" and entry.RepoTags[1] or nil
  local digest, merr = self:_commit(manifest_for(cdigest, file_size(cpath), layers))
  return digest, merr, tag
end

-- An OCI image layout (index.json, blobs/sha256/...).
function M:_import_oci(root, ref)
  local text, err = read_file(root .. "/index.json", oci.MAX_JSON)
  if not text then return nil, err end
  local index, derr = decode_object(text, "index.json")
  if not index then return nil, derr end
  local tag = ref and ref:match(":([^:/]+)$")
  local desc, perr = pick(index, tag, "index.json")
  if not desc then return nil, perr end
  local function blob(d, what)
    if type(d) ~= "table" or not oci.valid_digest(d.digest) then return nil, what .. ": bad descriptor" end
    local path = inside(root, "blobs/sha256/" .. hex(d.digest))
    if not path then return nil, ("%s %s is missing from the layout"):format(what, d.digest) end
    if math.tointeger(d.size) and file_size(path) ~= d.size then
      return nil, ("%s %s: size %d, the descriptor says %d"):format(what, d.digest, file_size(path), d.size)
    end
    local digest, berr = self:put_blob(path, d.digest)
    if not digest then return nil, ("%s: %s"):format(what, berr) end
    return digest, nil, path
  end
  local mdigest, merr = blob(desc, "manifest")
  if not mdigest then return nil, merr end
  local m, jerr = self:_json_blob(mdigest, "manifest")
  if not m then return nil, jerr end
  if oci.INDEX_TYPES[m.mediaType or desc.mediaType] or (m.manifests and not m.layers) then
    local inner, ierr = pick(m, tag, "image index " .. mdigest)
    if not inner then return nil, ierr end
    mdigest, merr = blob(inner, "manifest")
    if not mdigest then return nil, merr end
    m, jerr = self:_json_blob(mdigest, "manifest")
    if not m then return nil, jerr end
  end
  if m.mediaType and not oci.MANIFEST_TYPES[m.mediaType] then
    return nil, ("manifest %s: media type %s is not an image manifest"):format(mdigest, tostring(m.mediaType))
  end
  local ok, cerr = blob(m.config, "config")
  if not ok then return nil, cerr end
  if type(m.layers) ~= "table" then return nil, "manifest " .. mdigest .. " has no layers" end
  for i, l in ipairs(m.layers) do
    local lok, lerr = blob(l, "layer " .. i)
    if not lok then return nil, lerr end
  end
  self.busy[mdigest] = (self.busy[mdigest] or 0) + 1
  local img, ierr = self:_image(nil, mdigest)
  self.busy[mdigest] = self.busy[mdigest] - 1
  if self.busy[mdigest] == 0 then self.busy[mdigest] = nil end
  if not img then return nil, ierr end
  local ann = type(desc.annotations) == "table" and desc.annotations["org.opencontainers.image.ref.name"]
  return mdigest, nil, ann
end

-- A tar of a whole archive, unpacked into a staging dir with the layer
-- unpacker's rules (it is as hostile as any layer).
function M:_stage(path, stage)
  local ok, err = uv.fs_mkdir(stage, tonumber("700", 8))
  if not ok then return nil, err end
  local info, uerr = async.wait(function(cb)
    local qok, e = core.layer_unpack({ blob = path, dir = stage, uid_base = self.uid_base,
      gid_base = self.gid_base, id_count = self.id_count, max_tar_bytes = self.limits.max_tar_bytes,
      max_bytes = self.limits.max_bytes, max_entries = self.limits.max_entries }, cb)
    if not qok then cb(nil, e) end
  end)
  if not info then return nil, uerr end
  return stage .. "/" .. hex(info.diff_id)
end

local function is_file(p)
  local st = uv.fs_lstat(p)
  return st and st.type == "file"
end

--- Imports path: an OCI image layout (dir or tar with index.json and
-- oci-layout), a docker-archive (`docker save`: manifest.json), or a plain
-- rootfs tar or directory; names it ref (else the archive's own name).
-- Returns { ref, digest } or nil, err; a failed import leaves nothing.
function M:import(path, ref)
  if type(path) ~= "string" or path:sub(1, 1) ~= "/" then return nil, "import: the path must be absolute" end
  local name
  if ref then
    local nerr
    name, nerr = oci.normalize(ref)
    if not name then return nil, nerr end
    if name == "default" or oci.valid_digest(name) or name:find("@") then
      return nil, ("'%s' cannot name an image"):format(ref)
    end
  end
  local st = uv.fs_stat(path)
  if not st then return nil, ("import: no such file or directory: %s"):format(path) end
  self.importing = (self.importing or 0) + 1
  local written = { blobs = {}, layers = {} }
  self.written[coroutine.running()] = written
  local stage = self.tmp .. "/import-" .. core.random_hex(8)
  local digest, err, own_name
  if st.type == "directory" then
    if is_file(path .. "/index.json") and is_file(path .. "/oci-layout") then
      digest, err, own_name = self:_import_oci(path, name)
    elseif is_file(path .. "/manifest.json") then
      digest, err, own_name = self:_import_docker(path)
    else
      local ok, merr = uv.fs_mkdir(stage, tonumber("700", 8))
      local tar = stage .. "/rootfs.tar"
      if ok then
        ok, merr = async.wait(function(cb)
          local qok, e = core.tar_dir(path, tar, self.uid_base, self.gid_base, self.id_count, cb)
          if not qok then cb(nil, e) end
        end)
      end
      if ok then digest, err = self:_import_rootfs_tar(tar) else err = merr end
    end
  elseif st.type == "file" then
    local root, serr = self:_stage(path, stage)
    if not root then
      err = serr
    elseif is_file(root .. "/index.json") and is_file(root .. "/oci-layout") then
      digest, err, own_name = self:_import_oci(root, name)
    elseif is_file(root .. "/manifest.json") then
      digest, err, own_name = self:_import_docker(root)
    else
      digest, err = self:_import_rootfs_tar(path, root)
    end
  else
    err = "import: " .. path .. " is neither a file nor a directory"
  end
  core.rmtree(stage)
  if digest then
    local final = name
    if not final and own_name then final = oci.normalize(own_name) end
    if not final then
      err, digest = "the archive names no image: give a name (tupper import PATH NAME)", nil
    else
      local ok, serr = self:_set_ref(final, digest)
      if ok then
        self.importing = self.importing - 1
        self.written[coroutine.running()] = nil
        return { ref = final, digest = digest }
      end
      err, digest = serr, nil
    end
  end
  self.importing = self.importing - 1
  self.written[coroutine.running()] = nil
  -- nothing of a failed import stays (what it shares with others does)
  self:_collect(written)
  return nil, err
end

return M
