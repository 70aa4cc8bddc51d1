--- Debian images: a root filesystem built from Debian's archive with
-- mmdebstrap, as a reproducible tar, cached, and pinned by a lock.
--
-- A recipe asks for one with
--
--     image = { debian = "bookworm", packages = { "python3", "git" } }
--
-- and the builder makes the rootfs from the apt mirror this host already
-- uses (its /etc/apt sources, never an address of our own), with what an
-- agent expects of a general-purpose sandbox: a `user` account (uid 1000,
-- /home/user, bash), passwordless sudo for it when sudo is installed,
-- LANG=C.UTF-8, a fixed /etc/hostname and /etc/hosts.  docs/images.md,
-- "Debian images".
--
--     local debian = require("tupper.image.debian")
--     -- in a coroutine (tupper.async): the build waits on the loop
--     local img, err = debian.build(spec, { cache = state .. "/debian" })
--     -- img = { tar = "/abs/rootfs.tar", key = "<sha256 hex>", suite = "bookworm",
--     --         mirror = { { uri =, suites = {...}, components = {...} }, ... },
--     --         packages = { "name=version", ... },  -- every installed package, sorted
--     --         epoch = 1686355200, cached = true|false }
--     local again = debian.build_locked(debian.lock_of(img), { cache = ... })
--     -- what the daemon uses: the image in the store (tupper.images), built
--     -- and imported on first use; opts.lock builds at a lock's versions
--     local image = debian.image(store, spec, { cache = ..., lock = lock })
--     -- image = store:resolve's { ref, digest, layers, config }, plus
--     --         packages (as above) and debian (the lock: debian.lock_of)
--
-- The builder runs mmdebstrap as a child process (luv), in its "unshare"
-- mode: as root that is a private mount namespace for the chroot's mounts
-- (they die with it, even if it is killed), package scripts run as root in
-- the chroot.  Only packages from the archive's signed indexes are
-- installed; names are validated before they reach apt.
local uv = require("luv")
local async = require("tupper.util.async")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")
local digest = require("tupper.util.digest")
local apt = require("tupper.image.debian_apt")
local locks = require("tupper.image.debian_lock")
local driver = require("tupper.image.debian_run")

local M = {}

M.MMDEBSTRAP = "/usr/bin/mmdebstrap"
M.EPOCH = 1686355200          -- SOURCE_DATE_EPOCH: 2023-06-10, the day bookworm was released
M.TIMEOUT = 3600              -- seconds one build may take before it is killed
M.MAX_STATUS = 64 * 1024 * 1024
M.FORMAT = 1                  -- bump when the build's output changes for the same inputs

-- The one uid the image's agent user has, as E2B's "user".
M.USER, M.UID, M.HOME = "user", 1000, "/home/user"

--- Stops every build this process runs (the daemon's shutdown): each
-- child's process group gets SIGTERM, SIGKILL 10 s later; the builds fail
-- and remove their work dirs.  (image/debian_run.lua)
M.cancel_all = driver.cancel_all
--- Removes a tree without following symlinks.  (image/debian_run.lua)
M.rmtree = driver.rmtree
--- Checks an image spec (image/debian_lock.lua): what recipes call.
M.check_spec = locks.check_spec
--- The lock of a build, what build_locked takes back (image/debian_lock.lua).
M.lock_of = locks.lock_of

--- The cache key of a build: of the format, the epoch, the suite, its
-- mirror's source lines, the names asked for and a lock's pins.
function M.key_of(suite, mirror, include, pins)
  local parts = { "tupper-debian", tostring(M.FORMAT), tostring(M.EPOCH), suite }
  for _, m in ipairs(mirror) do
    for _, line in ipairs(apt.source_lines(m)) do parts[#parts + 1] = line end
  end
  parts[#parts + 1] = "include"
  for _, p in ipairs(include) do parts[#parts + 1] = p end
  if pins then
    parts[#parts + 1] = "pins"
    for _, p in ipairs(pins) do parts[#parts + 1] = p end
  end
  return digest.sha256(table.concat(parts, "\n"))
end

local inflight = {} -- key -> list of waiting callbacks, while a build of that key runs
local building = {} -- work dirs of the builds running in this process
local swept = {}    -- cache dirs swept of what crashed builds left

-- Removes the work dirs of builds that are not running (a crash's): once
-- per cache dir and process; one daemon owns its state dir.
local function sweep(cache)
  if swept[cache] then return end
  swept[cache] = true
  local dir = uv.fs_scandir(cache)
  while dir do
    local name = uv.fs_scandir_next(dir)
    if not name then break end
    local path = cache .. "/" .. name
    if name:match("^build%-") and not building[path] then driver.rmtree(path) end
  end
end

-- The record of a build in the cache (image.json), with its tar if that is
-- still there (an import into the image store removes it).
local function record(dir)
  local text = paths.read_file(dir .. "/image.json", 16 * 1024 * 1024)
  if not text then return nil end
  local rec = json.decode(text)
  if type(rec) ~= "table" then return nil end
  rec.dir, rec.cached = dir, true
  if uv.fs_stat(dir .. "/rootfs.tar") then rec.tar = dir .. "/rootfs.tar" end
  return rec
end

local function cached(dir)
  local rec = record(dir)
  return rec and rec.tar and rec or nil
end

-- Runs fn() once per key at a time: a second caller with the same key
-- waits for the first and then runs fn itself (finding its result cached).
local function once(key, fn)
  while inflight[key] do
    async.wait(function(cb) table.insert(inflight[key], cb) end)
  end
  inflight[key] = {}
  local ok, a, b = pcall(fn)
  local waiters = inflight[key]
  inflight[key] = nil
  for _, cb in ipairs(waiters) do cb() end
  if not ok then return nil, "internal error: " .. tostring(a) end
  return a, b
end

-- Builds into cache/<key> unless it is there.  job = { suite, mirror,
-- include (names), pins (name=version or nil) }.
local function build(job, opts)
  local cache = opts.cache
  if type(cache) ~= "string" or cache:sub(1, 1) ~= "/" then return nil, "debian.build: opts.cache must be an absolute path" end
  local key = M.key_of(job.suite, job.mirror, job.include, job.pins)
  local dir = cache .. "/" .. key
  return once("build " .. key, function()
    local hit = cached(dir)
    if hit then return hit end
    return M._build_into(job, key, dir, opts)
  end)
end

local build_in

function M._build_into(job, key, dir, opts)
  if not uv.fs_access(M.MMDEBSTRAP, "X") then
    return nil, ("building a Debian image needs mmdebstrap (%s): apt-get install mmdebstrap"):format(M.MMDEBSTRAP)
  end
  local ok, err = paths.mkdirs(opts.cache, tonumber("700", 8))
  if not ok then return nil, ("cannot create %s: %s"):format(opts.cache, err) end
  local work
  work, err = uv.fs_mkdtemp(opts.cache .. "/build-XXXXXX")
  if not work then return nil, ("cannot create a build dir in %s: %s"):format(opts.cache, err) end
  building[work] = true
  -- whatever happens in the build, its work dir goes unless it became the image
  local res, a, b = pcall(build_in, job, key, dir, opts, work)
  building[work] = nil
  if not res then a, b = nil, "internal error building a Debian image: " .. tostring(a) end
  if not a then driver.rmtree(work) end
  return a, b
end

build_in = function(job, key, dir, opts, work)
  local ok, err
  local function fail(msg) return nil, msg end
  local hooks
  hooks, err = driver.write_hooks(work, { user = M.USER, uid = M.UID, home = M.HOME }, job.pins)
  if not hooks then return fail("cannot write the build's hooks: " .. tostring(err)) end

  local aptopts = opts.aptopts or driver.host_aptopts()
  local env = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "SOURCE_DATE_EPOCH=" .. M.EPOCH, "TMPDIR=" .. work,
                "HOME=" .. work, "LC_ALL=C.UTF-8" }
  local function mmdebstrap(what, include, target, extra)
    -- M.MMDEBSTRAP read now: the specs point it at a stand-in
    return driver.mmdebstrap({ bin = M.MMDEBSTRAP, work = work, what = what, suite = job.suite,
      mirror = job.mirror, include = include, target = target, extra = extra, aptopts = aptopts,
      env = env, timeout = opts.timeout or M.TIMEOUT, on_start = opts.on_start })
  end
  if job.pins then
    -- a locked build first asks apt, in half a minute, whether the mirror
    -- still has every locked version, instead of failing minutes in
    ok, err = mmdebstrap("check", job.pins, "/dev/null", { "--simulate", "--format=null" })
    if not ok then return fail("the mirror cannot give the lock's versions: " .. err) end
  end
  local tar = work .. "/rootfs.tar"
  ok, err = mmdebstrap("build", job.include, tar, { "--format=tar", "--skip=output/dev", "--hook-dir=" .. hooks })
  if not ok then return fail(err) end

  local res
  res, err = driver.run({ "/usr/bin/tar", "-xOf", tar, "./var/lib/dpkg/status" }, { "PATH=/usr/bin:/bin" },
                 M.MAX_STATUS, 300)
  if not res or res.code ~= 0 or res.over then
    return fail("cannot read the image's dpkg status: " .. tostring(err or "tar failed"))
  end
  local packages = locks.parse_status(res.stdout)
  if job.pins then
    -- a locked build must come out exactly as locked
    local want, got = {}, {}
    for _, p in ipairs(job.pins) do want[p] = true end
    for _, p in ipairs(packages) do got[p] = true end
    local diff = {}
    for _, p in ipairs(job.pins) do if not got[p] then diff[#diff + 1] = "missing " .. p end end
    for _, p in ipairs(packages) do if not want[p] then diff[#diff + 1] = "unlocked " .. p end end
    if #diff > 0 then
      while #diff > 20 do table.remove(diff) end
      return fail("the locked build came out different from its lock:\n" .. table.concat(diff, "\n"))
    end
  end
  local mirror = {}
  for i, m in ipairs(job.mirror) do mirror[i] = { uri = m.uri, suites = m.suites, components = m.components } end
  local rec = { key = key, suite = job.suite, mirror = mirror, packages = packages, epoch = M.EPOCH,
                include = job.include, format = M.FORMAT }
  ok, err = driver.write_file(work .. "/image.json", json.encode(rec), tonumber("644", 8))
  if not ok then return fail("cannot write image.json: " .. tostring(err)) end
  driver.rmtree(hooks)
  ok, err = uv.fs_rename(work, dir)
  if not ok then
    -- another process built the same key meanwhile: keep its copy
    local other = cached(dir)
    if other then return other end
    return nil, ("cannot move the image into %s: %s"):format(dir, tostring(err))
  end
  rec.tar, rec.dir, rec.cached = dir .. "/rootfs.tar", dir, false
  return rec
end

local function mirror_for(suite, opts)
  if opts.mirror then return opts.mirror end
  return apt.select_mirror(apt.host_sources(opts.apt_dir), suite)
end

-- What to build for a spec, or for a lock (opts.lock): { suite, mirror,
-- include, pins }, or nil, err.
local function job_of(spec, opts)
  local err, s = locks.check_spec(spec)
  if err then return nil, err end
  local l
  if opts.lock ~= nil then
    l, err = locks.check_lock(opts.lock)
    if not l then return nil, err end
    if l.epoch ~= M.EPOCH then
      return nil, ("the lock was made with SOURCE_DATE_EPOCH %s; this tupper builds with %s"):format(l.epoch, M.EPOCH)
    end
    if l.debian ~= s.debian or table.concat(l.include, ",") ~= table.concat(s.packages, ",") then
      return nil, "the lock is of another Debian image (suite or packages differ): build again"
    end
  end
  local mirror
  mirror, err = mirror_for(s.debian, opts)
  if not mirror then return nil, err end
  return { suite = s.debian, mirror = mirror, include = s.packages, pins = l and l.packages }
end

--- The image store's name of a build: "localhost/tupper/debian-<suite>:<key>".
function M.ref(suite, key)
  return ("localhost/tupper/debian-%s:%s"):format(suite, key:sub(1, 32))
end

local function decorate(img, rec)
  img.packages = rec.packages
  img.debian = locks.lock_of(rec)
  return img
end

--- The image of spec in the image store (tupper.images): found by its
-- name, else built (or taken from the build cache) and imported, and the
-- cached tar dropped (the store keeps it).  Call in a coroutine.  opts: as
-- for M.build, plus lock (a lock: build at its versions).  Returns the
-- store's image ({ ref, digest, layers, config }) with packages and debian
-- (its lock) added, or nil, err.
function M.image(store, spec, opts)
  opts = opts or {}
  opts.on_start = opts.on_start or function(argv)
    io.stderr:write(os.date("!%Y-%m-%dT%H:%M:%SZ "), "building a Debian image (minutes): ",
      table.concat(argv, " "):sub(1, 400), "\n")
  end
  if type(opts.cache) ~= "string" or opts.cache:sub(1, 1) ~= "/" then
    return nil, "debian.image: opts.cache must be an absolute path"
  end
  local job, err = job_of(spec, opts)
  if not job then return nil, err end
  sweep(opts.cache)
  local key = M.key_of(job.suite, job.mirror, job.include, job.pins)
  local ref, dir = M.ref(job.suite, key), opts.cache .. "/" .. key
  return once("image " .. key, function()
    if job.pins then
      -- the image built without the lock, when it has exactly the lock's
      -- versions (its record is ours, the lock's claims are not trusted)
      local k1 = M.key_of(job.suite, job.mirror, job.include)
      local rec = record(opts.cache .. "/" .. k1)
      if rec and type(rec.packages) == "table" and table.concat(rec.packages, "\n") == table.concat(job.pins, "\n") then
        local img = store:resolve(M.ref(job.suite, k1))
        if img then return decorate(img, rec) end
      end
    end
    local rec = record(dir)
    local img = rec and store:resolve(ref)
    if img then return decorate(img, rec) end
    rec, err = build(job, opts)
    if not rec then return nil, err end
    local out
    out, err = store:import(rec.tar, ref)
    if not out then return nil, ("importing the Debian image %s: %s"):format(ref, tostring(err)) end
    uv.fs_unlink(rec.tar)
    img, err = store:resolve(ref)
    if not img then return nil, err end
    return decorate(img, rec)
  end)
end

--- Builds (or finds in the cache) the image of spec { debian, packages }.
-- Call in a coroutine.  opts: cache (absolute dir, required), apt_dir
-- (default /etc/apt), mirror (entries instead of the host's), timeout (s),
-- on_start(argv), lock (build at a lock's versions).  Returns the image
-- record (see the top of this file), or nil, err.
function M.build(spec, opts)
  opts = opts or {}
  local job, err = job_of(spec, opts)
  if not job then return nil, err end
  return build(job, opts)
end

--- Rebuilds the image a lock describes, each package at its locked version,
-- from this host's mirror (the lock's mirror is a record, never an address
-- to fetch from: a lock is input like any other).  Fails, naming the
-- packages, when the mirror no longer has a version or the result differs.
function M.build_locked(lock, opts)
  local l, err = locks.check_lock(lock)
  if not l then return nil, err end
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.lock = lock
  return M.build({ debian = l.debian, packages = l.include }, o)
end

return M
