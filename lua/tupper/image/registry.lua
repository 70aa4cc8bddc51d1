--- The registry client: pulls an image over the registry v2 API into an
-- OCI image layout (docs/images.md, "Pulling").
--
-- Everything a registry sends is hostile: manifests and indexes are capped
-- (MANIFEST_MAX), a blob may be no longer than its descriptor says and must
-- hash to its digest before it enters blobs/, redirects are few and never go
-- from https down to http, stalls end (core.http_get's low-speed limit).  A
-- blob downloads into partial/<hex> and moves into blobs/sha256/<hex> only
-- once verified; an interrupted pull leaves the partial file, and the next
-- pull resumes it with an HTTP Range request (the digest is of the whole
-- file, so a bad resume is caught, and then retried from zero).
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")
local auth = require("tupper.image.registry_auth")

local M = {}

M.MANIFEST_MAX = 4 * 1024 * 1024        -- bytes of a manifest or index
M.CONFIG_MAX = 8 * 1024 * 1024          -- bytes of an image config
M.LAYER_MAX = 64 * 1024 * 1024 * 1024   -- bytes of one layer
M.LAYERS_MAX = 127                      -- layers of one image (the image store's cap)
M.PARALLEL = 3                          -- blobs fetched at once
M.RETRIES = 2                           -- network retries of one blob (resumed)

M.PLATFORM = { os = "linux", architecture = "amd64" }

local MT = {
  oci_index = "application/vnd.oci.image.index.v1+json",
  oci_manifest = "application/vnd.oci.image.manifest.v1+json",
  docker_list = "application/vnd.docker.distribution.manifest.list.v2+json",
  docker_manifest = "application/vnd.docker.distribution.manifest.v2+json",
}
M.MEDIA_TYPES = MT
local INDEX_TYPES = { [MT.oci_index] = true, [MT.docker_list] = true }
local MANIFEST_TYPES = { [MT.oci_manifest] = true, [MT.docker_manifest] = true }
local CONFIG_TYPES = { ["application/vnd.oci.image.config.v1+json"] = true,
                       ["application/vnd.docker.container.image.v1+json"] = true }
local LAYER_TYPES = {
  ["application/vnd.oci.image.layer.v1.tar"] = true,
  ["application/vnd.oci.image.layer.v1.tar+gzip"] = true,
  ["application/vnd.oci.image.layer.v1.tar+zstd"] = true,
  ["application/vnd.docker.image.rootfs.diff.tar.gzip"] = true,
}
local ACCEPT = "Accept: " .. table.concat({ MT.oci_index, MT.oci_manifest, MT.docker_list,
                                            MT.docker_manifest }, ", ")

local fail = auth.fail
M.fail = fail
--- The client's settings (image/registry_auth.lua).
M.load_config = auth.load_config
--- One pull's session with a registry (image/registry_auth.lua).
M.session = auth.session
--- Parses a WWW-Authenticate challenge (image/registry_auth.lua).
M.parse_challenge = auth.parse_challenge

---------------------------------------------------------------- references

local DOCKER_HUB = auth.DOCKER_HUB

local function valid_repo(repo)
  if #repo == 0 or #repo > 255 then return false end
  for part in (repo .. "/"):gmatch("([^/]*)/") do
    -- [a-z0-9]+ separated by '.', '_', '__' or '-'s
    if not part:match("^[a-z0-9]+$") and not part:match("^[a-z0-9][a-z0-9._-]*[a-z0-9]$") then
      return false
    end
    if part:find("%.%.") or part:find("___") or part:find("[._]%-") or part:find("%-[._]")
       or part:find("%._") or part:find("_%.") then
      return false
    end
  end
  return true
end

--- Parses an image reference the way docker does: `alpine` is
-- docker.io/library/alpine:latest, `user/app` docker.io/user/app:latest, a
-- first component with a '.' or ':' (or `localhost`) names the registry;
-- `name@sha256:<hex>` pins a manifest.  Returns a table
-- { registry, host (the API's host[:port]), repo, tag, digest, name } or nil, err.
function M.parse_ref(s)
  if type(s) ~= "string" or #s == 0 or #s > 512 then return nil, "an image reference is 1..512 bytes" end
  if s:find("[%s%c]") then return nil, ("invalid image reference %q"):format(s) end
  -- "sha256:<hex>" would parse as the repository library/sha256, tag <hex>
  if s:match("^sha256:") then
    return nil, ("'%s' is a digest, which names no repository: images are pulled by name (a name, or name@sha256:...)"):format(s)
  end
  local rest, digest = s:match("^(.-)@(.*)$")
  if rest then
    if not digest:match("^sha256:[0-9a-f]+$") or #digest ~= 71 then
      return nil, ("invalid digest in %q: only sha256:<64 hex digits> is supported"):format(s)
    end
  else
    rest = s
  end
  local tag
  local head, last = rest:match("^(.*/)([^/]*)$")
  if not head then head, last = "", rest end
  local name_part, t = last:match("^(.-):(.*)$")
  if name_part then
    tag = t
    rest = head .. name_part
    if not tag:match("^[%w_][%w_.%-]*$") or #tag > 128 then
      return nil, ("invalid tag in %q"):format(s)
    end
  end
  local first, remainder = rest:match("^([^/]+)/(.+)$")
  local registry, repo
  if first and (first:find("[.:]") or first == "localhost" or first:match("^%[")) then
    registry, repo = first, remainder
  else
    registry, repo = DOCKER_HUB, rest
  end
  if registry == "index.docker.io" or registry == "registry-1.docker.io" then registry = DOCKER_HUB end
  if registry == DOCKER_HUB and not repo:find("/", 1, true) then repo = "library/" .. repo end
  if not valid_repo(repo) then return nil, ("invalid repository name in %q"):format(s) end
  if not registry:match("^[%w.%-]+$") and not registry:match("^[%w.%-]+:%d+$")
     and not registry:match("^%[[%x:]+%]:?%d*$") then
    return nil, ("invalid registry host in %q"):format(s)
  end
  if not tag and not digest then tag = "latest" end
  local r = { registry = registry, repo = repo, tag = tag, digest = digest,
              host = registry == DOCKER_HUB and "registry-1.docker.io" or registry }
  r.name = registry .. "/" .. repo .. (tag and (":" .. tag) or "") .. (digest and ("@" .. digest) or "")
  return r
end

---------------------------------------------------------------- manifests

local function is_digest(d)
  return type(d) == "string" and #d == 71 and d:match("^sha256:[0-9a-f]+$") ~= nil
end

local function check_descriptor(d, what, max)
  if type(d) ~= "table" then fail("protocol", "%s is not a descriptor", what) end
  if type(d.mediaType) ~= "string" then fail("protocol", "%s has no media type", what) end
  if not is_digest(d.digest) then
    fail("unsupported", "%s has digest %s: only sha256 is supported", what, tostring(d.digest):sub(1, 100))
  end
  local size = math.tointeger(d.size)
  if not size or size < 0 or size > max then
    fail("too_big", "%s declares a size out of bounds (%s, at most %d)", what, tostring(d.size), max)
  end
  return d
end

local function error_detail(res)
  local t = res.body and json.decode(res.body)
  local e = type(t) == "table" and type(t.errors) == "table" and t.errors[1]
  if type(e) == "table" and type(e.code) == "string" then
    return e.code .. (type(e.message) == "string" and (": " .. e.message:sub(1, 200)) or "")
  end
  return "HTTP " .. tostring(res.status)
end

-- Fetches a manifest or index by tag or digest through session self;
-- verifies a digest pin.  Returns body, media type, digest.
local function manifest(self, reference, want_digest, want_size)
  local res = self:fetch(self.ref.repo .. "/manifests/" .. reference,
    { headers = { ACCEPT }, max_bytes = want_size or M.MANIFEST_MAX, exact = want_size ~= nil,
      timeout = auth.SMALL_TIMEOUT })
  if res.status == 404 then
    fail("not_found", "%s: no such image or tag %s in %s (%s)", self.ref.name, reference,
         self.ref.registry, error_detail(res))
  elseif res.status == 403 then
    fail("auth", "%s refused access to %s (%s)", self.ref.registry, self.ref.repo, error_detail(res))
  elseif res.status ~= 200 then
    fail("protocol", "%s: manifest %s: %s", self.ref.registry, reference, error_detail(res))
  end
  local body = res.body or ""
  local digest = "sha256:" .. core.sha256(body)
  if want_digest and digest ~= want_digest then
    fail("digest", "manifest digest mismatch: asked for %s, the registry sent %s", want_digest, digest)
  end
  local t = json.decode(body)
  if type(t) ~= "table" then fail("protocol", "the manifest of %s is not JSON", self.ref.name) end
  local mt = type(t.mediaType) == "string" and t.mediaType
    or (res.headers["content-type"] or ""):match("^[^;%s]+")
  if t.schemaVersion == 1 or (mt or ""):find("distribution.manifest.v1", 1, true) then
    fail("unsupported", "%s uses Docker's schema 1 manifest, which tupper does not support", self.ref.name)
  end
  if not mt or not (INDEX_TYPES[mt] or MANIFEST_TYPES[mt]) then
    fail("unsupported", "unsupported manifest media type %s", tostring(mt):sub(1, 200))
  end
  if t.schemaVersion ~= 2 then fail("unsupported", "manifest schemaVersion %s", tostring(t.schemaVersion)) end
  return t, mt, digest, #body, body
end

--- Picks linux/amd64 out of an index: the descriptor, or fails with the
-- platforms it offers.
function M.select_platform(index)
  if type(index.manifests) ~= "table" then fail("protocol", "the index lists no manifests") end
  local seen = {}
  for i, d in ipairs(index.manifests) do
    if i > 1024 then break end
    local p = type(d) == "table" and d.platform
    if type(p) == "table" and type(p.os) == "string" and type(p.architecture) == "string" then
      if p.os == M.PLATFORM.os and p.architecture == M.PLATFORM.architecture then return d end
      seen[#seen + 1] = (p.os .. "/" .. p.architecture):sub(1, 64)
    end
  end
  fail("platform", "no %s/%s image in the index (it has: %s)", M.PLATFORM.os, M.PLATFORM.architecture,
       #seen > 0 and table.concat(seen, ", ", 1, math.min(#seen, 16)) or "none")
end

---------------------------------------------------------------- the store's files

local mkdirs = paths.mkdirs -- 0755

-- Writes data to path through a temporary file in tmpdir (the layout's
-- partial/: no half-written file is ever under a name the store reads).
local function write_atomic(path, data, tmpdir)
  local tmp = tmpdir .. "/.tmp-" .. core.random_hex(8)
  local fd, err = uv.fs_open(tmp, "w", tonumber("644", 8))
  if not fd then return nil, err end
  local ok, werr = uv.fs_write(fd, data, 0)
  if ok then ok, werr = uv.fs_fdatasync(fd) end
  uv.fs_close(fd)
  if ok then ok, werr = uv.fs_rename(tmp, path) end
  if not ok then uv.fs_unlink(tmp); return nil, werr end
  return true
end

--- The layout a pull writes into: dir/blobs/sha256/<hex> (verified blobs),
-- dir/partial/<hex> (downloads in progress), dir/oci-layout, dir/index.json
-- (the refs pulled, as org.opencontainers.image.ref.name annotations).
function M.layout(dir)
  local l = { dir = dir, blobs = dir .. "/blobs/sha256", partial = dir .. "/partial" }
  local ok, err = mkdirs(l.blobs)
  if ok then ok, err = mkdirs(l.partial) end
  if not ok then fail("io", "image store %s: %s", dir, tostring(err)) end
  -- temporary files a crash left (write_atomic never yields while one exists)
  local h = uv.fs_scandir(l.partial)
  while h do
    local name = uv.fs_scandir_next(h)
    if not name then break end
    if name:sub(1, 5) == ".tmp-" then uv.fs_unlink(l.partial .. "/" .. name) end
  end
  if not uv.fs_stat(dir .. "/oci-layout") then
    write_atomic(dir .. "/oci-layout", '{"imageLayoutVersion":"1.0.0"}', l.partial)
  end
  return l
end

local function has_blob(l, digest)
  local st = uv.fs_stat(l.blobs .. "/" .. digest:sub(8))
  return st ~= nil and st.type == "file", st
end

local function put_blob(l, digest, data)
  if has_blob(l, digest) then return end
  local ok, err = write_atomic(l.blobs .. "/" .. digest:sub(8), data, l.partial)
  if not ok then fail("io", "write blob %s: %s", digest, tostring(err)) end
end

--- Records ref -> manifest in index.json (read, change, rename: the loop is
-- single-threaded, so concurrent pulls in one daemon cannot interleave).
function M.record_ref(l, refname, desc)
  local path = l.dir .. "/index.json"
  local t = json.decode(paths.read_file(path, 16 * 1024 * 1024) or "") or {}
  if type(t.manifests) ~= "table" then t = { schemaVersion = 2, manifests = {} } end
  local out = {}
  for _, m in ipairs(t.manifests) do
    local a = type(m) == "table" and m.annotations
    if not (type(a) == "table" and a["org.opencontainers.image.ref.name"] == refname) then
      out[#out + 1] = m
    end
  end
  out[#out + 1] = { mediaType = desc.mediaType, digest = desc.digest, size = desc.size,
                    annotations = { ["org.opencontainers.image.ref.name"] = refname } }
  t.schemaVersion, t.mediaType, t.manifests = 2, MT.oci_index, out
  local ok, err = write_atomic(path, json.encode(t), l.partial)
  if not ok then fail("io", "write %s: %s", path, tostring(err)) end
end

--- Looks up ref in index.json: the manifest descriptor, or nil.
function M.lookup_ref(dir, refname)
  local t = json.decode(paths.read_file(dir .. "/index.json", 16 * 1024 * 1024) or "")
  if type(t) ~= "table" or type(t.manifests) ~= "table" then return nil end
  for _, m in ipairs(t.manifests) do
    local a = type(m) == "table" and m.annotations
    if type(a) == "table" and a["org.opencontainers.image.ref.name"] == refname then return m end
  end
end

---------------------------------------------------------------- blobs

-- One download per blob in this process: a second pull of the same blob
-- waits for the first instead of writing the same partial file.
local inflight = {}

-- Downloads blob d through session self into the layout l, resuming a
-- partial file, retrying network failures.
local function download(self, l, d, progress)
  local hex = d.digest:sub(8)
  local part = l.partial .. "/" .. hex
  local final = l.blobs .. "/" .. hex
  local from_zero_retry = false
  local attempt = 0
  while true do
    local st = uv.fs_stat(part)
    local offset = (st and st.type == "file" and st.size <= d.size) and st.size or 0
    if st and st.type ~= "file" then fail("io", "%s is not a file", part) end
    local track = { done = offset, size = d.size }
    progress[d.digest] = track
    local res, err
    local ok, e = pcall(function()
      res = self:fetch(self.ref.repo .. "/blobs/" .. d.digest,
        { file = part, offset = offset, max_bytes = d.size, exact = true }, track)
    end)
    if not ok then
      if type(e) == "table" and e.kind == "network" and attempt < M.RETRIES and not self.cancelled then
        attempt = attempt + 1
        async.sleep(200 * attempt)
        goto continue
      end
      if type(e) == "table" and (e.kind == "protocol" or e.kind == "too_big") then
        uv.fs_unlink(part) -- a liar's bytes are not worth resuming
      end
      error(e, 0)
    end
    if res.status == 404 then
      fail("not_found", "%s: blob %s is missing from %s", self.ref.name, d.digest, self.ref.registry)
    elseif res.status == 416 and offset > 0 and not from_zero_retry then
      uv.fs_unlink(part)
      from_zero_retry = true
      goto continue
    elseif res.status ~= 200 and res.status ~= 206 then
      fail("protocol", "%s: blob %s: %s", self.ref.registry, d.digest, error_detail(res))
    end
    if res.sha256 ~= hex or res.size ~= d.size then
      uv.fs_unlink(part)
      if offset > 0 and not from_zero_retry then -- the kept part may be what was wrong
        from_zero_retry = true
        goto continue
      end
      fail("digest", "blob %s: digest mismatch (the registry sent sha256:%s): refused", d.digest,
           tostring(res.sha256))
    end
    do
      local rok, rerr = uv.fs_rename(part, final)
      if not rok then fail("io", "store blob %s: %s", d.digest, tostring(rerr)) end
      track.done = d.size
      return
    end
    ::continue::
  end
end

-- Blob d into the layout l through session self, once per process.
local function blob(self, l, d, progress)
  if has_blob(l, d.digest) then
    progress[d.digest] = { done = d.size, size = d.size }
    return
  end
  local hex = d.digest:sub(8)
  local wait = inflight[hex]
  if wait then
    async.wait(function(cb) wait[#wait + 1] = cb end)
    if has_blob(l, d.digest) then
      progress[d.digest] = { done = d.size, size = d.size }
      return
    end
  end
  local waiters = {}
  inflight[hex] = waiters
  local ok, err = pcall(download, self, l, d, progress)
  inflight[hex] = nil
  for _, cb in ipairs(waiters) do cb() end
  if not ok then error(err, 0) end
end

---------------------------------------------------------------- the pull

-- Runs fns with at most n at once, in coroutines; the first error is raised
-- after all have ended (the others are cancelled by then).
local function parallel(n, fns, on_error)
  local i, running, first_err = 0, 0, nil
  local done_cb
  local function next_one()
    while running < n and i < #fns and not first_err do
      i = i + 1
      running = running + 1
      local fn = fns[i]
      async.spawn(function()
        local ok, err = pcall(fn)
        running = running - 1
        if not ok and not first_err then
          first_err = err
          if on_error then on_error() end
        end
        next_one()
        if running == 0 and (i == #fns or first_err) and done_cb then
          local cb = done_cb
          done_cb = nil
          cb()
        end
      end)
    end
  end
  next_one()
  if running > 0 then async.wait(function(cb) done_cb = cb end) end
  if first_err then error(first_err, 0) end
end

--- Pulls ref into the layout at dir.  opts: config (M.load_config()),
-- on_progress(done, total) called about every 200 ms, on_session(s) (for
-- cancel), record = false (leave index.json to the caller: the daemon's
-- image store records the ref once the layers unpack).  Returns { ref, digest, manifest = {...}, config = desc,
-- layers = { desc... }, size } or raises { kind, message }.
function M.pull(dir, refstr, opts)
  opts = opts or {}
  local ref, perr = M.parse_ref(refstr)
  if not ref then fail("invalid", "%s", perr) end
  local cfg = opts.config
  if not cfg then
    local cerr
    cfg, cerr = M.load_config()
    if not cfg then fail("invalid", "%s", cerr) end
  end
  local l = M.layout(dir)
  local s = M.session(ref, cfg)
  if opts.on_session then opts.on_session(s) end
  -- the manifest: by digest when pinned, else by tag
  local m, mt, digest, size, body = manifest(s, ref.digest or ref.tag, ref.digest)
  local top = { mediaType = mt, digest = digest, size = size }
  local bodies = { [digest] = body }
  if INDEX_TYPES[mt] then
    local d = check_descriptor(M.select_platform(m), "the linux/amd64 manifest", M.MANIFEST_MAX)
    if not MANIFEST_TYPES[d.mediaType] then
      fail("unsupported", "unsupported manifest media type %s", d.mediaType:sub(1, 200))
    end
    local mbody
    m, mt, digest, size, mbody = manifest(s, d.digest, d.digest, d.size)
    if not MANIFEST_TYPES[mt] then fail("unsupported", "an index inside an index is not supported") end
    bodies[digest] = mbody
  end
  local config = check_descriptor(m.config, "the image config", M.CONFIG_MAX)
  if not CONFIG_TYPES[config.mediaType] then
    fail("unsupported", "unsupported config media type %s", config.mediaType:sub(1, 200))
  end
  if type(m.layers) ~= "table" then fail("protocol", "the manifest lists no layers") end
  if #m.layers > M.LAYERS_MAX then fail("too_big", "more than %d layers", M.LAYERS_MAX) end
  local layers, total = {}, config.size
  for i, d in ipairs(m.layers) do
    check_descriptor(d, ("layer %d"):format(i), M.LAYER_MAX)
    if not LAYER_TYPES[d.mediaType] then
      fail("unsupported", "layer %d has an unsupported media type %s", i, d.mediaType:sub(1, 200))
    end
    layers[i] = { mediaType = d.mediaType, digest = d.digest, size = math.tointeger(d.size) }
    total = total + layers[i].size
  end
  -- blobs: config and layers, a few at once, with progress
  local progress = {}
  local timer
  if opts.on_progress then
    timer = uv.new_timer()
    timer:start(0, 200, function()
      local done = 0
      for _, t in pairs(progress) do done = done + t.done end
      for job, t in pairs(s.jobs) do if type(t) == "table" then t.done = job:progress() end end
      opts.on_progress(math.min(done, total), total)
    end)
  end
  local fns = {}
  for _, d in ipairs(layers) do
    fns[#fns + 1] = function() blob(s, l, d, progress) end
  end
  -- the small config first, then the layers in parallel: an image whose
  -- config is bad fails before any layer moves, and a layer that fails
  -- never races a config download into a kept partial file
  local ok, err = pcall(function()
    blob(s, l, { digest = config.digest, size = math.tointeger(config.size) }, progress)
    parallel(M.PARALLEL, fns, function() s:cancel() end)
  end)
  if timer then timer:stop(); timer:close() end
  if not ok then error(err, 0) end
  if opts.on_progress then opts.on_progress(total, total) end
  -- the manifests go in last: a ref in index.json means every blob is there
  for d, b in pairs(bodies) do put_blob(l, d, b) end
  if opts.record ~= false then M.record_ref(l, ref.name, top) end
  return { ref = ref.name, digest = top.digest, media_type = top.mediaType, manifest_digest = digest,
           manifest = m, config = { mediaType = config.mediaType, digest = config.digest,
           size = math.tointeger(config.size) }, layers = layers, size = total }
end

return M
