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

local M = {}

M.MANIFEST_MAX = 4 * 1024 * 1024        -- bytes of a manifest or index
M.CONFIG_MAX = 8 * 1024 * 1024          -- bytes of an image config
M.LAYER_MAX = 64 * 1024 * 1024 * 1024   -- bytes of one layer
M.LAYERS_MAX = 127                      -- layers of one image (the image store's cap)
M.TOKEN_MAX = 256 * 1024                -- bytes of a token answer
M.PARALLEL = 3                          -- blobs fetched at once
M.RETRIES = 2                           -- network retries of one blob (resumed)
M.MAX_REDIRECTS = 3
M.CONNECT_TIMEOUT = 30                  -- seconds
M.LOW_SPEED_TIME = 30                   -- seconds below LOW_SPEED_LIMIT ends a transfer
M.LOW_SPEED_LIMIT = 1024                -- bytes per second
M.SMALL_TIMEOUT = 120                   -- seconds for a manifest, config or token

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

--- A failure: a message, and a kind the daemon and the tests can tell apart
-- (not_found, auth, network, digest, unsupported, platform, protocol,
-- too_big, io, cancelled, invalid).
local function fail(kind, fmt, ...)
  error({ kind = kind, message = fmt:format(...) }, 0)
end
M.fail = fail

---------------------------------------------------------------- references

local DOCKER_HUB = "docker.io"

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

---------------------------------------------------------------- configuration

local function config_dir()
  local x = os.getenv("XDG_CONFIG_HOME")
  if x and x ~= "" then return x .. "/tupper" end
  return (os.getenv("HOME") or "/root") .. "/.config/tupper"
end

local function read_small(path, max)
  local fd = uv.fs_open(path, "r", 0)
  if not fd then return nil end
  local st = uv.fs_fstat(fd)
  local text
  if st and st.type == "file" and st.size <= max then text = uv.fs_read(fd, st.size, 0) end
  uv.fs_close(fd)
  return text
end

--- The client's settings: insecure registries (plain http), the CA file and
-- the credentials.  Read from the environment and from
-- $XDG_CONFIG_HOME/tupper/registries.json and auth.json (docs/images.md).
function M.load_config(env)
  env = env or os.getenv
  local cfg = { insecure = { ["localhost"] = true, ["127.0.0.1"] = true, ["::1"] = true, ["[::1]"] = true },
                auths = {} }
  local dir = config_dir()
  local reg_path = env("TUPPER_REGISTRIES_CONF")
  if not reg_path or reg_path == "" then reg_path = dir .. "/registries.json" end
  local text = read_small(reg_path, 1024 * 1024)
  if text then
    local t = json.decode(text)
    if type(t) ~= "table" then return nil, reg_path .. ": not a JSON object" end
    if type(t.insecure) == "table" then
      for _, h in ipairs(t.insecure) do if type(h) == "string" then cfg.insecure[h] = true end end
    end
    if type(t.ca_file) == "string" then cfg.ca_file = t.ca_file end
    local stall = math.tointeger(t.stall_seconds)
    if t.stall_seconds ~= nil and (not stall or stall < 1 or stall > 3600) then
      return nil, reg_path .. ": stall_seconds must be a whole number of seconds, 1..3600"
    end
    cfg.stall_seconds = stall
  end
  for h in (env("TUPPER_INSECURE_REGISTRIES") or ""):gmatch("[^,%s]+") do cfg.insecure[h] = true end
  local ca = env("TUPPER_CA_FILE")
  if ca and ca ~= "" then cfg.ca_file = ca end
  local auth_path = env("TUPPER_AUTH_FILE")
  if not auth_path or auth_path == "" then auth_path = dir .. "/auth.json" end
  text = read_small(auth_path, 1024 * 1024)
  if text then
    local t = json.decode(text)
    if type(t) ~= "table" or (t.auths ~= nil and type(t.auths) ~= "table") then
      return nil, auth_path .. ": not a docker-style auth file ({\"auths\": {...}})"
    end
    for host, a in pairs(t.auths or {}) do
      if type(host) == "string" and type(a) == "table" and type(a.auth) == "string" then
        local raw = core.b64decode(a.auth)
        local user, pass = (raw or ""):match("^([^:]*):(.*)$")
        if user then
          host = host:gsub("^https?://", ""):gsub("/.*$", "")
          if host == "index.docker.io" or host == "registry-1.docker.io" then host = DOCKER_HUB end
          cfg.auths[host] = { user = user, pass = pass }
        end
      end
    end
  end
  return cfg
end

local function is_insecure(cfg, host)
  if cfg.insecure[host] then return true end
  local bare = host:match("^(.*):%d+$")
  return bare ~= nil and cfg.insecure[bare] == true
end

---------------------------------------------------------------- HTTP and auth

local Session = {}
Session.__index = Session

--- One pull's connection state for a registry: base URL, tokens, creds.
function M.session(ref, cfg, hooks)
  local insecure = is_insecure(cfg, ref.registry) or is_insecure(cfg, ref.host)
  return setmetatable({ ref = ref, cfg = cfg, insecure = insecure,
    base = (insecure and "http://" or "https://") .. ref.host .. "/v2/",
    creds = cfg.auths[ref.registry] or cfg.auths[ref.host], auth_header = nil,
    jobs = {}, cancelled = false, hooks = hooks or {} }, Session)
end

-- Starts a request, recording its job (for progress and cancel) as soon as
-- it exists; returns what _get returns.
function Session:_request(opts, track)
  if self.cancelled then fail("cancelled", "cancelled") end
  opts.allow_http = self.insecure
  opts.ca_file = self.cfg.ca_file
  opts.connect_timeout = M.CONNECT_TIMEOUT
  opts.low_speed_time = self.cfg.stall_seconds or M.LOW_SPEED_TIME
  opts.low_speed_limit = M.LOW_SPEED_LIMIT
  opts.max_redirects = M.MAX_REDIRECTS
  local job
  local res, err, kind = async.wait(function(cb)
    local j, jerr = core.http_get(opts, cb)
    if not j then cb(nil, jerr, "io"); return end
    job = j
    self.jobs[j] = track or true
  end)
  if job then self.jobs[job] = nil end
  return res, err, kind
end

--- Parses a WWW-Authenticate challenge: scheme, { key = value }.
function M.parse_challenge(h)
  if type(h) ~= "string" or #h > 8192 then return nil end
  local scheme, rest = h:match("^%s*(%a+)%s*(.*)$")
  if not scheme then return nil end
  local params = {}
  local n = 0
  for k, v in rest:gmatch('([%w_]+)%s*=%s*"([^"]*)"') do
    params[k:lower()] = v
    n = n + 1
    if n > 16 then break end
  end
  for k, v in rest:gmatch('([%w_]+)%s*=%s*([^",%s][^,%s]*)') do
    if params[k:lower()] == nil then params[k:lower()] = v end
  end
  return scheme:lower(), params
end

local function urlencode(s)
  return (s:gsub("[^%w%-%._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local function basic_header(creds)
  return "Authorization: Basic " .. core.b64encode(creds.user .. ":" .. creds.pass)
end

-- Answers a 401: gets a bearer token from the challenge's realm (with the
-- credentials, if any) or switches to basic auth.
function Session:_authenticate(challenge)
  local scheme, params = M.parse_challenge(challenge)
  if scheme == "basic" then
    if not self.creds then
      fail("auth", "%s wants a user name and password: none in the auth file for %s (docs/images.md)",
           self.ref.registry, self.ref.registry)
    end
    if self.auth_header and self.auth_header:find("^Authorization: Basic ") then
      fail("auth", "%s refused the credentials for %s", self.ref.registry, self.ref.registry)
    end
    self.auth_header = basic_header(self.creds)
    return
  elseif scheme ~= "bearer" or not params.realm then
    fail("auth", "%s asks for an authentication scheme tupper does not speak (%s)",
         self.ref.registry, tostring(scheme))
  end
  -- a token that worked and then stopped working expired (Docker Hub's
  -- live five minutes, less than a long pull): get a new one; a fresh token
  -- refused is a refusal
  if self.tried_token and not self.token_worked then
    -- registries answer so for a repository that does not exist, too
    fail("auth", "%s refused access to %s: it does not exist, or %s", self.ref.registry, self.ref.repo,
         self.creds and "the credentials given are refused for it"
           or ("it needs credentials (none for %s in the auth file)"):format(self.ref.registry))
  end
  self.tried_token, self.token_worked = true, false
  local realm = params.realm
  if not realm:match("^https://") and not (self.insecure and realm:match("^http://")) then
    fail("auth", "%s sends for a token to %s: refused (https only)", self.ref.registry, realm:sub(1, 200))
  end
  local q = {}
  if params.service then q[#q + 1] = "service=" .. urlencode(params.service) end
  q[#q + 1] = "scope=" .. urlencode(params.scope or ("repository:" .. self.ref.repo .. ":pull"))
  local url = realm .. (realm:find("?", 1, true) and "&" or "?") .. table.concat(q, "&")
  local headers = {}
  if self.creds then headers[1] = basic_header(self.creds) end
  local res, err, kind = self:_request({ url = url, headers = headers, max_bytes = M.TOKEN_MAX,
                                         timeout = M.SMALL_TIMEOUT })
  if not res then fail(kind == "too_big" and "too_big" or "network", "token from %s: %s", realm:sub(1, 200), err) end
  if (res.status == 401 or res.status == 403) and self.creds then
    fail("auth", "%s refused the credentials (token service answered %d)", self.ref.registry, res.status)
  elseif res.status == 401 or res.status == 403 then
    fail("auth", "%s gives no anonymous access to %s: it needs credentials (none for %s in the auth file)",
         self.ref.registry, self.ref.repo, self.ref.registry)
  end
  if res.status ~= 200 then fail("auth", "token service %s answered %d", realm:sub(1, 200), res.status) end
  local t = json.decode(res.body or "")
  local token = type(t) == "table" and (t.token or t.access_token)
  if type(token) ~= "string" or #token == 0 or token:find("[%c%s]") then
    fail("auth", "the token service %s sent no usable token", realm:sub(1, 200))
  end
  self.auth_header = "Authorization: Bearer " .. token
end

-- GETs path below /v2/ with auth; one 401 is answered by authenticating.
function Session:fetch(path, opts, track)
  for _ = 1, 3 do
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.url = self.base .. path
    o.headers = {}
    for i, h in ipairs(opts.headers or {}) do o.headers[i] = h end
    local used = self.auth_header
    if used then o.headers[#o.headers + 1] = used end
    local res, err, kind = self:_request(o, track)
    if not res then
      if kind == "network" then fail("network", "%s: %s", self.ref.host, err) end
      if kind == "redirect" then fail("protocol", "%s: %s", self.ref.host, err) end
      fail(kind or "network", "%s", err)
    end
    if res.status ~= 401 then
      if self.auth_header then self.token_worked = true end
      return res
    end
    -- blobs fetch in parallel and meet a 401 together: one of them gets
    -- the token, the others wait for it, and a request refused with an
    -- older header than the current one just tries again
    if self.authenticating then
      async.wait(function(cb) self.authenticating[#self.authenticating + 1] = cb end)
    elseif self.auth_header == used then
      self.authenticating = {}
      local ok, e = pcall(self._authenticate, self, res.headers["www-authenticate"])
      local waiters = self.authenticating
      self.authenticating = nil
      for _, cb in ipairs(waiters) do cb() end
      if not ok then error(e, 0) end
    end
  end
  fail("auth", "%s keeps refusing access to %s", self.ref.registry, self.ref.repo)
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

-- Fetches a manifest or index by tag or digest; verifies a digest pin.
-- Returns body, media type, digest.
function Session:manifest(reference, want_digest, want_size)
  local res = self:fetch(self.ref.repo .. "/manifests/" .. reference,
    { headers = { ACCEPT }, max_bytes = want_size or M.MANIFEST_MAX, exact = want_size ~= nil,
      timeout = M.SMALL_TIMEOUT })
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

local mkdirs = require("tupper.util.paths").mkdirs -- 0755

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
  local t = json.decode(read_small(path, 16 * 1024 * 1024) or "") or {}
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
  local t = json.decode(read_small(dir .. "/index.json", 16 * 1024 * 1024) or "")
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

function Session:_download(l, d, progress)
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

function Session:blob(l, d, progress)
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
  local ok, err = pcall(self._download, self, l, d, progress)
  inflight[hex] = nil
  for _, cb in ipairs(waiters) do cb() end
  if not ok then error(err, 0) end
end

function Session:cancel()
  self.cancelled = true
  for job in pairs(self.jobs) do job:cancel() end
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
  local m, mt, digest, size, body = s:manifest(ref.digest or ref.tag, ref.digest)
  local top = { mediaType = mt, digest = digest, size = size }
  local bodies = { [digest] = body }
  if INDEX_TYPES[mt] then
    local d = check_descriptor(M.select_platform(m), "the linux/amd64 manifest", M.MANIFEST_MAX)
    if not MANIFEST_TYPES[d.mediaType] then
      fail("unsupported", "unsupported manifest media type %s", d.mediaType:sub(1, 200))
    end
    local mbody
    m, mt, digest, size, mbody = s:manifest(d.digest, d.digest, d.size)
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
    fns[#fns + 1] = function() s:blob(l, d, progress) end
  end
  -- the small config first, then the layers in parallel: an image whose
  -- config is bad fails before any layer moves, and a layer that fails
  -- never races a config download into a kept partial file
  local ok, err = pcall(function()
    s:blob(l, { digest = config.digest, size = math.tointeger(config.size) }, progress)
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
