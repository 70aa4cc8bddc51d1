--- The OCI image format as the image store reads and writes it: media
-- types, references (normalized as Docker does), digests, the pick of a
-- manifest from an index, image configs, and the manifests the store
-- writes for what it imports.  No state: image/store.lua and
-- image/import.lua share these.
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")

local M = {}

M.MAX_JSON = 4 * 1048576        -- a manifest, config or index.json
M.MAX_LAYERS = 127              -- the backend takes 128 layers; Docker's cap is 127

M.MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
M.MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
M.MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
M.MANIFEST_TYPES = { [M.MEDIA_MANIFEST] = true,
  ["application/vnd.docker.distribution.manifest.v2+json"] = true }
M.INDEX_TYPES = { ["application/vnd.oci.image.index.v1+json"] = true,
  ["application/vnd.docker.distribution.manifest.list.v2+json"] = true }

--- The timestamp of now as OCI annotations and configs write it (RFC 3339, UTC).
function M.now()
  return os.date("!%Y-%m-%dT%H:%M:%SZ")
end

--- The hex of a digest "sha256:<hex>" (its file name under blobs/sha256).
function M.hex(digest) return digest:sub(8) end

--- 1 if d is "sha256:<64 lowercase hex>".
function M.valid_digest(d) return core.digest_valid(d) end

--- The JSON object text holds (what names it in the error), or nil, err.
function M.decode_object(text, what)
  local v, err = json.decode(text)
  if type(v) ~= "table" then return nil, ("%s is not a JSON object (%s)"):format(what, tostring(err or "")) end
  return v
end

--- A list of strings (argv, env) of a config, or nil; anything else is
-- nil, err.
function M.string_list(v, what)
  if v == nil or v == json.null then return nil end
  if type(v) ~= "table" then return nil, what .. " is not a list" end
  local out = {}
  for i, s in ipairs(v) do
    if type(s) ~= "string" or #s > 32768 then return nil, what .. " has a bad entry" end
    out[i] = s
  end
  if #out > 4096 then return nil, what .. " is too long" end
  return out
end

--- Normalizes an image reference as Docker does: "alpine" ->
-- "docker.io/library/alpine:latest"; "ghcr.io/a/b" -> "ghcr.io/a/b:latest";
-- a digest reference ("name@sha256:...") keeps its digest.  "default" and
-- bare digests ("sha256:...") are left alone.  Returns nil, err for a name
-- that is not a reference.
function M.normalize(ref)
  if type(ref) ~= "string" or ref == "" or #ref > 256 then return nil, "bad image reference" end
  if ref == "default" or M.valid_digest(ref) then return ref end
  -- not a repository named "sha256" with a tag: a digest that is malformed
  if ref:match("^sha256:") then return nil, ("'%s' is not a digest (sha256:<64 lowercase hex digits>)"):format(ref) end
  if ref:find("[^%w%._/:@%-]") or ref:find("%.%.") or ref:find("//") or ref:match("^[/:@%.%-]") then
    return nil, ("'%s' is not an image reference"):format(ref)
  end
  local name, digest = ref:match("^([^@]+)@(.+)$")
  name = name or ref
  if digest and not M.valid_digest(digest) then return nil, ("'%s': bad digest"):format(ref) end
  local tag
  local last = name:match("[^/]+$")
  if last:find(":") then name, tag = name:match("^(.*):([^:/]+)$") end
  if tag and not tag:match("^[%w_][%w_%.%-]*$") then return nil, ("'%s': bad tag"):format(ref) end
  local first = name:match("^[^/]+")
  if not (name:find("/") and (first:find("[%.:]") or first == "localhost")) then
    name = "docker.io/" .. name
  end
  if name:match("^docker%.io/[^/]+$") then name = name:gsub("^docker%.io/", "docker.io/library/") end
  if name:find("[A-Z]") then return nil, ("'%s': repository names are lowercase"):format(ref) end
  if digest then return name .. "@" .. digest end
  return name .. ":" .. (tag or "latest")
end

--- The config of an image the way a box starts it: { env, entrypoint, cmd,
-- workdir (absolute), user } from an OCI config's `config`.
function M.config_of(cfg)
  local c = type(cfg.config) == "table" and cfg.config or {}
  local env = M.string_list(c.Env, "Env") or {}
  local entrypoint = M.string_list(c.Entrypoint, "Entrypoint")
  local cmd = M.string_list(c.Cmd, "Cmd")
  local workdir = type(c.WorkingDir) == "string" and c.WorkingDir ~= "" and c.WorkingDir or "/"
  if workdir:sub(1, 1) ~= "/" then workdir = "/" .. workdir end
  local user = type(c.User) == "string" and c.User ~= "" and c.User or "root"
  return { env = env, entrypoint = entrypoint and #entrypoint > 0 and entrypoint or nil,
           cmd = cmd and #cmd > 0 and cmd or nil, workdir = workdir, user = user }
end

--- This host's architecture in OCI's words (amd64, arm64, ...).
function M.host_arch()
  local m = uv.os_uname().machine
  return ({ x86_64 = "amd64", aarch64 = "arm64", armv7l = "arm", i686 = "386" })[m] or m
end

--- Picks the manifest descriptor of an OCI index for ref's tag, else the
-- one for this host (linux/<arch>).  Returns it, or nil, err (what names
-- the index).
function M.pick(index, tag, what)
  if type(index.manifests) ~= "table" or #index.manifests == 0 then return nil, what .. " lists no manifests" end
  local arch, chosen = M.host_arch(), {}
  for _, d in ipairs(index.manifests) do
    if type(d) == "table" then
      local ann = type(d.annotations) == "table" and d.annotations["org.opencontainers.image.ref.name"]
      local p = type(d.platform) == "table" and d.platform
      if tag and ann and (ann == tag or ann:match(":([^:/]+)$") == tag) then return d end
      if not p or (p.os == "linux" and p.architecture == arch) then chosen[#chosen + 1] = d end
    end
  end
  if #chosen == 1 then return chosen[1] end
  if #chosen == 0 then return nil, what .. " has no image for linux/" .. arch end
  return nil, what .. " holds several images: name one (tupper import PATH NAME:TAG)"
end

--- The text of an OCI image manifest of a config blob and layer blobs
-- ({ digest, size, media_type }).
function M.manifest_for(config_digest, config_size, layers)
  local ls = {}
  for i, l in ipairs(layers) do
    ls[i] = { mediaType = l.media_type or M.MEDIA_LAYER, digest = l.digest, size = l.size }
  end
  return json.encode({ schemaVersion = 2, mediaType = M.MEDIA_MANIFEST,
    config = { mediaType = M.MEDIA_CONFIG, digest = config_digest, size = config_size }, layers = ls })
end

return M
