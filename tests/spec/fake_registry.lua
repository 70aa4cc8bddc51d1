-- A scripted registry that lies, for pull_spec.lua: lua5.4 fake_registry.lua
-- PORT STATE_DIR.  Listens on 127.0.0.1:PORT; the repository name picks
-- the misbehaviour.  Every request line is appended to STATE_DIR/requests.log
-- (with its Range header), so the spec can see what tupper asked for.
local uv = require("luv")

local port, state = tonumber(arg[1]), arg[2]
os.execute("mkdir -p '" .. state .. "'")

local function sha256(data)
  local path = state .. "/hash.tmp"
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
  local p = io.popen("sha256sum '" .. path .. "'")
  local hex = p:read("a"):match("^(%x+)")
  p:close()
  os.remove(path)
  return "sha256:" .. hex
end

local function log(line)
  local f = io.open(state .. "/requests.log", "a")
  f:write(line, "\n")
  f:close()
end

-- each repository's image: a real one (the daemon's store unpacks what it
-- pulls), with one layer of its own (so that no scenario finds its layer in
-- the store already from another): a file named after the repository and
-- 180 KiB of random bytes, as a reproducible tar.gz; its config names the
-- layer's diff id
local CONFIG, CONFIG_D, LAYER, LAYER_D, OTHER
local images = {}
local function read(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("a")
  f:close()
  return data
end
local function pick(repo)
  if repo == "redirect-blob" then repo = "ok" end
  repo = repo:gsub("[^%w%-]", "_")
  if not images[repo] then
    local d = state .. "/img-" .. repo
    assert(os.execute(("mkdir -p '%s/root' && head -c 184320 /dev/urandom > '%s/root/filler' && "
      .. "echo '%s' > '%s/root/name' && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner "
      .. "-C '%s/root' -cf '%s/layer.tar' ."):format(d, d, repo, d, d, d)))
    local diff_id = sha256(read(d .. "/layer.tar"))
    assert(os.execute(("gzip -n -f '%s/layer.tar'"):format(d)))
    local layer = read(d .. "/layer.tar.gz")
    local config = ('{"architecture":"amd64","os":"linux","config":{"Cmd":["/bin/sh"]},'
      .. '"rootfs":{"type":"layers","diff_ids":["%s"]}}'):format(diff_id)
    images[repo] = { layer, sha256(layer), config, sha256(config) }
  end
  LAYER, LAYER_D, CONFIG, CONFIG_D = table.unpack(images[repo])
  -- same length, another digest
  OTHER = LAYER:sub(1, -2) .. string.char((LAYER:byte(-1) + 1) % 256)
end

local function manifest(layer_size, mt)
  return ('{"schemaVersion":2,"mediaType":"%s","config":{"mediaType":'
    .. '"application/vnd.oci.image.config.v1+json","digest":"%s","size":%d},"layers":[{"mediaType":'
    .. '"application/vnd.oci.image.layer.v1.tar+gzip","digest":"%s","size":%d}]}'):format(
    mt or "application/vnd.oci.image.manifest.v1+json", CONFIG_D, #CONFIG, LAYER_D, layer_size or #LAYER)
end

local function respond(c, status, headers, body)
  local h = { ("HTTP/1.1 %d X"):format(status), "Connection: close" }
  for _, kv in ipairs(headers or {}) do h[#h + 1] = kv end
  if body then h[#h + 1] = "Content-Length: " .. #body end
  c:write(table.concat(h, "\r\n") .. "\r\n\r\n" .. (body or ""), function() c:shutdown(function() c:close() end) end)
end

-- streams chunks of `chunk` every ms until the client goes (or n chunks)
local function stream(c, chunk, n, then_stall)
  local t = uv.new_timer()
  local sent = 0
  t:start(0, 1, function()
    if c:is_closing() then t:close(); return end
    if n and sent >= n then
      t:close()
      if not then_stall then c:shutdown(function() c:close() end) end
      return
    end
    sent = sent + 1
    c:write(chunk, function(err) if err and not c:is_closing() then c:close() end end)
  end)
end

local function bearer_ok(hdrs) return hdrs["authorization"] == "Bearer goodtoken" end
local tokens_issued = 0

local function handle(c, method, path, hdrs)
  log(method .. " " .. path .. (hdrs["range"] and (" " .. hdrs["range"]) or ""))
  if path == "/v2/" then return respond(c, 200, {}, "{}") end
  if path:match("^/token") then
    if hdrs["authorization"] == "Basic Ym9iOnB3" then -- bob:pw
      if path:find("scope=repository%3Aexpire", 1, true) then
        tokens_issued = tokens_issued + 1
        return respond(c, 200, { "Content-Type: application/json" }, ('{"token":"tok%d"}'):format(tokens_issued))
      end
      return respond(c, 200, { "Content-Type: application/json" }, '{"token":"goodtoken"}')
    end
    if not hdrs["authorization"] and path:find("scope=repository%3Aprivate", 1, true) then
      return respond(c, 200, { "Content-Type: application/json" }, '{"token":"anon"}')
    end
    return respond(c, 401, {}, '{"details":"bad credentials"}')
  end
  local repo, kind, ref = path:match("^/v2/(.-)/(%a+)/([^/]+)$")
  if not repo then return respond(c, 404, {}, "{}") end
  pick(repo)
  local mt = "Content-Type: application/vnd.oci.image.manifest.v1+json"
  if (repo == "bearer" or repo == "private") and not bearer_ok(hdrs) then
    return respond(c, 401, { ('WWW-Authenticate: Bearer realm="http://127.0.0.1:%d/token",service="fake",'
      .. 'scope="repository:%s:pull"'):format(port, repo) }, '{"errors":[{"code":"UNAUTHORIZED"}]}')
  end
  if repo == "expire" then
    -- the first token is good for the manifest only, then "expires"
    local tok = tonumber((hdrs["authorization"] or ""):match("^Bearer tok(%d+)$") or "")
    if not tok or (kind == "blobs" and tok < 2) then
      return respond(c, 401, { ('WWW-Authenticate: Bearer realm="http://127.0.0.1:%d/token",service="fake",'
        .. 'scope="repository:expire:pull"'):format(port) }, '{"errors":[{"code":"UNAUTHORIZED"}]}')
    end
  end
  if kind == "manifests" then
    if repo == "huge" then
      c:write("HTTP/1.1 200 OK\r\nConnection: close\r\n" .. mt .. "\r\n\r\n")
      return stream(c, ("{"):rep(65536), 1024) -- 64 MiB, no length
    elseif repo == "hugeheaders" then
      local h = {}
      for i = 1, 2000 do h[i] = ("X-Filler-%d: %s"):format(i, ("x"):rep(100)) end
      return respond(c, 200, h, manifest())
    elseif repo == "loop" then
      return respond(c, 302, { "Location: " .. path }, "")
    elseif repo == "schema1" then
      return respond(c, 200, { "Content-Type: application/vnd.docker.distribution.manifest.v1+prettyjws" },
        '{"schemaVersion":1,"name":"schema1","tag":"latest","fsLayers":[]}')
    elseif repo == "weird" then
      return respond(c, 200, { "Content-Type: application/vnd.example.weird" },
        '{"schemaVersion":2,"mediaType":"application/vnd.example.weird"}')
    elseif repo == "liar" then
      return respond(c, 200, { mt }, manifest(1000)) -- the blob is far longer
    elseif repo == "short" then
      return respond(c, 200, { mt }, manifest(#LAYER + 10)) -- the blob is shorter
    end
    return respond(c, 200, { mt }, manifest())
  elseif kind == "blobs" then
    if ref == CONFIG_D then return respond(c, 200, {}, CONFIG) end
    if ref ~= LAYER_D then return respond(c, 404, {}, '{"errors":[{"code":"BLOB_UNKNOWN"}]}') end
    if repo == "forever" then
      c:write("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
      return stream(c, ("z"):rep(65536), nil)
    elseif repo == "drip" then -- a byte every 100 ms, for ever
      c:write(("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"):format(#LAYER))
      local t = uv.new_timer()
      t:start(100, 100, function()
        if c:is_closing() then t:close(); return end
        c:write("x", function(err) if err and not c:is_closing() then c:close() end end)
      end)
      return
    elseif repo == "wrongdigest" then
      return respond(c, 200, {}, OTHER)
    elseif repo == "stall" then
      local from = tonumber((hdrs["range"] or ""):match("^bytes=(%d+)%-$") or "")
      if from then
        return respond(c, 206, { ("Content-Range: bytes %d-%d/%d"):format(from, #LAYER - 1, #LAYER) },
          LAYER:sub(from + 1))
      end
      -- the first half, then nothing until the client goes
      c:write(("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"):format(#LAYER))
      local half = LAYER:sub(1, #LAYER // 2)
      return c:write(half, function() log("stalled " .. #half) end)
    elseif repo:match("^slow") then -- in 16 parts, 50 ms apart: a pull that takes a while
      c:write(("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"):format(#LAYER))
      local part, i = #LAYER // 16 + 1, 0
      local t = uv.new_timer()
      t:start(50, 50, function()
        if c:is_closing() or i * part >= #LAYER then t:close(); return end
        c:write(LAYER:sub(i * part + 1, (i + 1) * part))
        i = i + 1
        if i * part >= #LAYER then c:shutdown(function() c:close() end) end
      end)
      return
    elseif repo == "redirect-blob" then
      return respond(c, 307, { "Location: /v2/ok/blobs/" .. ref }, "")
    end
    return respond(c, 200, {}, LAYER)
  end
  respond(c, 404, {}, "{}")
end

-- built before serving: a build takes a while on a loaded machine, which
-- the specs with a one-second stall limit would take for a stall
for _, repo in ipairs({ "ok", "bearer", "private", "expire", "stall", "drip", "slow", "slow-pipe",
                        "slow-bar", "liar", "short", "forever", "wrongdigest" }) do
  pick(repo)
end

local server = uv.new_tcp()
assert(server:bind("127.0.0.1", port))
server:listen(64, function()
  local c = uv.new_tcp()
  server:accept(c)
  local buf = ""
  c:read_start(function(err, chunk)
    if err or not chunk then
      if not c:is_closing() then c:close() end
      return
    end
    buf = buf .. chunk
    if #buf > 65536 then c:close(); return end
    local head = buf:match("^(.-)\r\n\r\n")
    if not head then return end
    c:read_stop()
    local method, path = head:match("^(%u+) (%S+) HTTP/1%.%d")
    local hdrs = {}
    for k, v in head:gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do hdrs[k:lower()] = v end
    handle(c, method or "?", path or "/", hdrs)
  end)
end)
local sig = uv.new_signal()
sig:start("sigterm", function() os.exit(0) end)
-- a client that hangs up mid-write must not kill the server
local pipe = uv.new_signal()
pipe:start("sigpipe", function() end)
uv.run()
