--- The registry client's settings and its session with one registry
-- (image/registry.lua pulls through it): insecure registries, the CA file
-- and credentials from the environment and the config files; requests
-- with the pull's bounds; and the answer to a 401, a bearer token from the
-- challenge's realm or basic auth.  A registry's answers are hostile.
local core = require("tupper.core")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")

local M = {}

M.TOKEN_MAX = 256 * 1024                -- bytes of a token answer
M.MAX_REDIRECTS = 3
M.CONNECT_TIMEOUT = 30                  -- seconds
M.LOW_SPEED_TIME = 30                   -- seconds below LOW_SPEED_LIMIT ends a transfer
M.LOW_SPEED_LIMIT = 1024                -- bytes per second
M.SMALL_TIMEOUT = 120                   -- seconds for a manifest, config or token

M.DOCKER_HUB = "docker.io"
local DOCKER_HUB = M.DOCKER_HUB

--- A failure: a message, and a kind the daemon and the tests can tell apart
-- (not_found, auth, network, digest, unsupported, platform, protocol,
-- too_big, io, cancelled, invalid).
local function fail(kind, fmt, ...)
  error({ kind = kind, message = fmt:format(...) }, 0)
end
M.fail = fail

---------------------------------------------------------------- configuration

local function config_dir()
  local x = os.getenv("XDG_CONFIG_HOME")
  if x and x ~= "" then return x .. "/tupper" end
  return (os.getenv("HOME") or "/root") .. "/.config/tupper"
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
  local text = paths.read_file(reg_path, 1024 * 1024)
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
  text = paths.read_file(auth_path, 1024 * 1024)
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

--- Cancels every request of the session; the pull fails as "cancelled".
function Session:cancel()
  self.cancelled = true
  for job in pairs(self.jobs) do job:cancel() end
end

return M
