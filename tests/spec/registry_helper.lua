--- Helpers of the pull specs: a real registry (Debian's docker-registry) on
-- 127.0.0.1, OCI image layouts built by the test, skopeo to push them, and
-- a scripted hostile registry (fake_registry.lua).
local uv = require("luv")
local async = require("tupper.util.async")
local helper = require("helper")

local M = {}

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok, out, code
end
M.sh = sh

local function must(cmd)
  local ok, out = sh(cmd)
  assert(ok, cmd .. "\n" .. out)
  return out
end
M.must = must

local function write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end
M.write = write

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
M.q = q

--- A free TCP port on 127.0.0.1 (bound, read, released).
function M.free_port(host)
  local t = uv.new_tcp()
  assert(t:bind(host or "127.0.0.1", 0))
  local port = t:getsockname().port
  t:close()
  uv.run("nowait")
  return port
end

--- The environment of this process with extra "K=V" entries.
function M.env(extra)
  local out, seen = {}, {}
  for _, kv in ipairs(extra or {}) do
    out[#out + 1] = kv
    seen[kv:match("^[^=]*")] = true
  end
  local f = io.open("/proc/self/environ", "rb")
  for kv in f:read("a"):gmatch("[^%z]+") do
    if not seen[kv:match("^[^=]*")] then out[#out + 1] = kv end
  end
  f:close()
  return out
end

-- Waits until host:port accepts connections (or the process died).
local function wait_port(host, port, proc)
  helper.sync(function()
    local deadline = uv.now() + 15000
    while uv.now() < deadline do
      local t = uv.new_tcp()
      local err = async.wait(function(cb) t:connect(host, port, function(e) cb(e) end) end)
      t:close()
      if not err then return end
      if proc.exit_code then break end
      async.sleep(20)
    end
    error("server on " .. host .. ":" .. port .. " did not start: " .. tostring(helper.read_file(proc.log)))
  end)
end

local function spawn(proc, bin, args, env)
  local log = uv.fs_open(proc.log, "w", tonumber("644", 8))
  local handle, pid = uv.spawn(bin, { args = args, env = env, stdio = { nil, log, log } },
    function(code, sig) proc.exit_code = sig ~= 0 and 128 + sig or code end)
  uv.fs_close(log)
  assert(handle, pid)
  proc.handle, proc.pid = handle, pid
  helper.track(proc, bin) -- ended after the spec file if its teardown never ran
  function proc.stop()
    if not proc.exit_code then
      uv.kill(pid, "sigterm")
      helper.sync(function() while not proc.exit_code do async.sleep(5) end end)
    end
    if not proc.handle:is_closing() then proc.handle:close() end
  end
  return proc
end

--- Starts docker-registry serving dir/data on 127.0.0.1:<free port>.
-- opts.htpasswd = { user = pass }: basic auth.  opts.tls = { cert, key }.
-- Returns { host = "127.0.0.1:port", port, stop() }.
function M.start_registry(dir, opts)
  opts = opts or {}
  local host = opts.host or "127.0.0.1"
  local port = M.free_port(host)
  must("mkdir -p " .. q(dir .. "/data"))
  local auth = ""
  if opts.htpasswd then
    local lines = {}
    for user, pass in pairs(opts.htpasswd) do
      lines[#lines + 1] = must("htpasswd -Bbn " .. q(user) .. " " .. q(pass)):gsub("%s+$", "")
    end
    write(dir .. "/htpasswd", table.concat(lines, "\n") .. "\n")
    auth = ("auth:\n  htpasswd:\n    realm: test-realm\n    path: %s\n"):format(dir .. "/htpasswd")
  end
  local tls = ""
  if opts.tls then
    tls = ("  tls:\n    certificate: %s\n    key: %s\n"):format(opts.tls.cert, opts.tls.key)
  end
  write(dir .. "/config.yml", ([[
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s/data
http:
  addr: %s:%d
%s%s]]):format(dir, host, port, tls, auth))
  local proc = spawn({ log = dir .. "/registry.log" }, "/usr/bin/docker-registry",
                     { "serve", dir .. "/config.yml" })
  wait_port(host, port, proc)
  proc.host, proc.port = host .. ":" .. port, port
  return proc
end

--- Starts the scripted hostile registry (fake_registry.lua) on a free port.
function M.start_fake(dir, root)
  local port = M.free_port()
  local proc = spawn({ log = dir .. "/fake.log" }, "lua5.4",
    { root .. "/tests/spec/fake_registry.lua", tostring(port), dir .. "/fake-state" })
  wait_port("127.0.0.1", port, proc)
  proc.host, proc.port = "127.0.0.1:" .. port, port
  return proc
end

--- A throwaway CA and a server certificate for IP ip, in dir: returns
-- { ca = path, cert = path, key = path }.
function M.make_certs(dir, ip)
  must("mkdir -p " .. q(dir))
  local d = q(dir)
  must(("openssl req -x509 -newkey rsa:2048 -nodes -keyout %s/ca.key -out %s/ca.crt -days 1 "
    .. "-subj /CN=tupper-test-ca"):format(d, d))
  must(("openssl req -newkey rsa:2048 -nodes -keyout %s/srv.key -out %s/srv.csr -subj /CN=%s"):format(d, d, ip))
  write(dir .. "/ext.cnf", "subjectAltName=IP:" .. ip .. "\n")
  must(("openssl x509 -req -in %s/srv.csr -CA %s/ca.crt -CAkey %s/ca.key -CAcreateserial -out %s/srv.crt "
    .. "-days 1 -extfile %s/ext.cnf"):format(d, d, d, d, d))
  return { ca = dir .. "/ca.crt", cert = dir .. "/srv.crt", key = dir .. "/srv.key" }
end

--- Starts tls_redirect.py: https on host:port, every request sent to
-- target (plain http).
function M.start_tls_redirect(dir, root, host, certs, target)
  local port = M.free_port(host)
  local proc = spawn({ log = dir .. "/tls-redirect.log" }, "python3",
    { root .. "/tests/spec/tls_redirect.py", host, tostring(port), certs.cert, certs.key, target })
  wait_port(host, port, proc)
  proc.host, proc.port = host .. ":" .. port, port
  return proc
end

local function sha256_file(path)
  return (must("sha256sum " .. q(path)):match("^(%x+)"))
end
M.sha256_file = sha256_file

-- Puts path's content into the layout as a blob; returns digest, size.
local function add_blob(layout, path)
  local hex = sha256_file(path)
  must(("mkdir -p %s/blobs/sha256 && cp %s %s/blobs/sha256/%s"):format(q(layout), q(path), q(layout), hex))
  local st = uv.fs_stat(path)
  return "sha256:" .. hex, st.size
end

local function add_json(layout, tmp, text)
  write(tmp, text)
  return add_blob(layout, tmp)
end

--- Builds a layer from a directory: a reproducible tar.gz.  Returns
-- { digest, size, diff_id }.
function M.layer(layout, dir)
  local tar = layout .. "/../layer.tar"
  must(("tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C %s -cf %s ."):format(q(dir), q(tar)))
  local diff_id = "sha256:" .. sha256_file(tar)
  must(("gzip -n -f %s"):format(q(tar)))
  local digest, size = add_blob(layout, tar .. ".gz")
  os.remove(tar .. ".gz")
  return { digest = digest, size = size, diff_id = diff_id }
end

--- Adds an image manifest for layers (from M.layer) to the layout; returns
-- its descriptor (not yet in index.json).  opts: arch, cmd, env.
function M.image(layout, layers, opts)
  opts = opts or {}
  local json = require("tupper.util.json")
  local diff_ids, descs = {}, {}
  for i, l in ipairs(layers) do
    diff_ids[i] = l.diff_id
    descs[i] = { mediaType = "application/vnd.oci.image.layer.v1.tar+gzip", digest = l.digest, size = l.size }
  end
  local cfg = { architecture = opts.arch or "amd64", os = "linux",
    config = { Env = opts.env or { "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" },
               Cmd = opts.cmd or { "/bin/sh" } },
    rootfs = { type = "layers", diff_ids = diff_ids } }
  local cdig, csize = add_json(layout, layout .. "/../config.json", json.encode(cfg))
  local m = { schemaVersion = 2, mediaType = "application/vnd.oci.image.manifest.v1+json",
    config = { mediaType = "application/vnd.oci.image.config.v1+json", digest = cdig, size = csize },
    layers = descs }
  local mdig, msize = add_json(layout, layout .. "/../manifest.json", json.encode(m))
  return { mediaType = m.mediaType, digest = mdig, size = msize,
           platform = { os = "linux", architecture = opts.arch or "amd64" } }
end

--- Adds an image index over manifests; returns its descriptor.
function M.index(layout, manifests)
  local json = require("tupper.util.json")
  local ix = { schemaVersion = 2, mediaType = "application/vnd.oci.image.index.v1+json", manifests = manifests }
  local dig, size = add_json(layout, layout .. "/../index-blob.json", json.encode(ix))
  return { mediaType = ix.mediaType, digest = dig, size = size }
end

--- Writes oci-layout and index.json naming each descriptor by its tag.
function M.finish_layout(layout, tagged)
  local json = require("tupper.util.json")
  local ms = {}
  for tag, d in pairs(tagged) do
    ms[#ms + 1] = { mediaType = d.mediaType, digest = d.digest, size = d.size,
                    annotations = { ["org.opencontainers.image.ref.name"] = tag } }
  end
  write(layout .. "/oci-layout", '{"imageLayoutVersion":"1.0.0"}')
  write(layout .. "/index.json", json.encode({ schemaVersion = 2, manifests = ms }))
end

--- skopeo copy oci:layout:tag -> docker://host/repo:tag.  opts.all: an
-- index with every platform; opts.creds "user:pass".
function M.push(layout, tag, host, repo, opts)
  opts = opts or {}
  local cmd = ("skopeo copy --quiet --dest-tls-verify=false %s%s oci:%s:%s docker://%s/%s:%s"):format(
    opts.all and "--all " or "", opts.creds and ("--dest-creds " .. q(opts.creds) .. " ") or "",
    q(layout), tag, host, repo, tag)
  must(cmd)
end

--- A busybox root: /bin/busybox and a few applet links, plus files.
function M.busybox_root(dir, files)
  must(("mkdir -p %s/bin %s/etc && cp /bin/busybox %s/bin/busybox"):format(q(dir), q(dir), q(dir)))
  for _, a in ipairs({ "sh", "cat", "ls", "echo", "test" }) do
    must(("ln -sf busybox %s/bin/%s"):format(q(dir), a))
  end
  for path, data in pairs(files or {}) do
    must("mkdir -p " .. q((dir .. "/" .. path):match("^(.*)/")))
    write(dir .. "/" .. path, data)
  end
end

return M
