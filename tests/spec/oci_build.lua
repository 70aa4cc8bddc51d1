--- Test images made by hand: a ustar writer and an OCI image layout of
-- given layers (gzip'ed), for the specs that import images (images_spec,
-- the slow microvm_images_spec).
local uv = require("luv")
local json = require("tupper.util.json")

local M = {}

local function pad(s, n) return s .. ("\0"):rep(n - #s) end
local function octal(n, width) return ("%0" .. (width - 1) .. "o"):format(n) .. "\0" end

-- e = { name, type = "0" file | "1" hardlink | "2" symlink | "3" char | "5" dir,
--       data, link, mode, uid, gid, major, minor }
local function header(e)
  local size = (e.type or "0") == "0" and #(e.data or "") or 0
  local h = pad(e.name, 100) .. octal(e.mode or (e.type == "5" and 493 or 420), 8) ..
    octal(e.uid or 0, 8) .. octal(e.gid or e.uid or 0, 8) .. octal(e.size or size, 12) ..
    octal(1700000000, 12) .. "        " .. (e.type or "0") .. pad(e.link or "", 100) ..
    "ustar\0" .. "00" .. pad("", 32) .. pad("", 32) .. octal(e.major or 0, 8) ..
    octal(e.minor or 0, 8) .. pad("", 155) .. pad("", 12)
  assert(#h == 512)
  local sum = 0
  for i = 1, 512 do sum = sum + h:byte(i) end
  return h:sub(1, 148) .. ("%06o\0 "):format(sum) .. h:sub(157)
end

M.header = header

--- A tar of entries (as header's e) with its end blocks.
function M.tar(entries)
  local out = {}
  for _, e in ipairs(entries) do
    out[#out + 1] = header(e)
    local data = (e.type or "0") == "0" and (e.data or "") or ""
    out[#out + 1] = data
    if #data % 512 ~= 0 then out[#out + 1] = ("\0"):rep(512 - #data % 512) end
  end
  out[#out + 1] = ("\0"):rep(1024)
  return table.concat(out)
end

function M.write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

function M.sh(cmd)
  local p = io.popen(cmd)
  local out = p:read("a")
  p:close()
  return out
end

function M.sha256(path) return "sha256:" .. M.sh("sha256sum '" .. path .. "'"):match("^(%x+)") end

function M.gzip(path) assert(os.execute("gzip -n -f '" .. path .. "'")); return path .. ".gz" end

--- Writes an OCI image layout of the given layers (lists of tar entries,
-- gzip'ed) at dir.  Returns { manifest, diffs, layers }.
function M.oci_layout(dir, layers, config, ref_name)
  os.execute("mkdir -p '" .. dir .. "/blobs/sha256'")
  local function blob(path)
    local d = M.sha256(path)
    assert(os.rename(path, dir .. "/blobs/sha256/" .. d:sub(8)))
    return d
  end
  local diffs, descs = {}, {}
  for i, entries in ipairs(layers) do
    local p = dir .. "/layer" .. i .. ".tar"
    M.write(p, type(entries) == "string" and entries or M.tar(entries))
    diffs[i] = M.sha256(p)
    local gz = M.gzip(p)
    local size = uv.fs_stat(gz).size
    descs[i] = { mediaType = "application/vnd.oci.image.layer.v1.tar+gzip", digest = blob(gz), size = size }
  end
  local cfg = json.encode({ architecture = "amd64", os = "linux", config = config,
                            rootfs = { type = "layers", diff_ids = diffs } })
  M.write(dir .. "/config.json", cfg)
  local cdigest = blob(dir .. "/config.json")
  local m = json.encode({ schemaVersion = 2, mediaType = "application/vnd.oci.image.manifest.v1+json",
    config = { mediaType = "application/vnd.oci.image.config.v1+json", digest = cdigest, size = #cfg },
    layers = descs })
  M.write(dir .. "/manifest.json", m)
  local mdigest = blob(dir .. "/manifest.json")
  M.write(dir .. "/index.json", json.encode({ schemaVersion = 2, manifests = { {
    mediaType = "application/vnd.oci.image.manifest.v1+json", digest = mdigest, size = #m,
    annotations = ref_name and { ["org.opencontainers.image.ref.name"] = ref_name } or nil } } }))
  M.write(dir .. "/oci-layout", '{"imageLayoutVersion":"1.0.0"}')
  return { manifest = mdigest, diffs = diffs, layers = descs }
end

--- The entries of a busybox-static base layer: /bin/busybox and applet
-- links, /etc/passwd with root and app (1234:1235), /tmp, /root, /home/app.
function M.busybox_base(applets)
  local bb = assert(io.open("/bin/busybox", "rb"), "needs /bin/busybox (busybox-static)")
  local data = bb:read("a")
  bb:close()
  local base = {
    { name = "./", type = "5" },
    { name = "bin/", type = "5" },
    { name = "bin/busybox", data = data, mode = 493 },
    { name = "etc/", type = "5" },
    { name = "etc/passwd", data = "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1235:app:/home/app:/bin/sh\n" },
    { name = "etc/group", data = "root:x:0:\napp:x:1235:\nstaff:x:50:\n" },
    { name = "tmp/", type = "5", mode = 1023 },
    { name = "root/", type = "5", mode = 448 },
    { name = "home/app/", type = "5", uid = 1234, gid = 1235 },
  }
  for _, applet in ipairs(applets or { "sh", "cat", "ls", "id", "echo", "pwd", "env", "test" }) do
    base[#base + 1] = { name = "bin/" .. applet, type = "2", link = "busybox" }
  end
  return base
end

return M
