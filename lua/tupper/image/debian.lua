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
local sha256 = require("tupper.util.sha256")

local M = {}

M.MMDEBSTRAP = "/usr/bin/mmdebstrap"
M.APT_DIR = "/etc/apt"
M.EPOCH = 1686355200          -- SOURCE_DATE_EPOCH: 2023-06-10, the day bookworm was released
M.TIMEOUT = 3600              -- seconds one build may take before it is killed
M.MAX_PACKAGES = 1024         -- names a recipe may ask for
M.MAX_LOCKED = 8192           -- name=version pairs a lock may hold
M.MAX_SOURCE_FILE = 1024 * 1024
M.MAX_SOURCE_FILES = 256
M.MAX_STATUS = 64 * 1024 * 1024
M.FORMAT = 1                  -- bump when the build's output changes for the same inputs

-- The one uid the image's agent user has, as E2B's "user".
M.USER, M.UID, M.HOME = "user", 1000, "/home/user"

local SUITE_PATTERN = "^[a-z][a-z0-9]*$"
-- Debian policy 5.6.1: lowercase letters, digits, '+', '-', '.'; two or
-- more; starting with a letter or digit.  A trailing '-' is refused too:
-- apt reads "pkg-" as "remove pkg" (a trailing '+', "install", is g++).
local PACKAGE_PATTERN = "^[a-z0-9][a-z0-9+.-]*[a-z0-9.+]$"
-- Debian policy 5.6.12: [epoch:]upstream[-revision], of [A-Za-z0-9.+~:-].
local VERSION_PATTERN = "^[0-9][A-Za-z0-9.+~:-]*$"

local function is_array(t)
  local n = #t
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end
M.is_array = is_array -- shared with tupper.recipe

-- ------------------------------------------------------------ the spec

--- Whether s is a Debian package name tupper passes to apt.
function M.valid_package(s)
  return type(s) == "string" and #s >= 2 and #s <= 128 and s:match(PACKAGE_PATTERN) ~= nil
end

--- Whether s is a Debian version.
function M.valid_version(s)
  return type(s) == "string" and #s >= 1 and #s <= 256 and s:match(VERSION_PATTERN) ~= nil
end

--- Checks an image spec { debian = "bookworm", packages = { names } } (the
-- recipe field, hostile).  Returns nil, the normalised spec (packages
-- sorted); or err, nil, path (the field's keys, for the file:line).
function M.check_spec(v, name)
  name = name or "image"
  if type(v) ~= "table" then
    return ("'%s' must be { debian = \"bookworm\", packages = { ... } }"):format(name), nil, { name }
  end
  for k in pairs(v) do
    if k ~= "debian" and k ~= "packages" then
      return ("'%s' has an unknown field '%s' (expected debian, packages)"):format(name, tostring(k)), nil,
             { name, k }
    end
  end
  local suite = v.debian
  if type(suite) ~= "string" or #suite > 32 or not suite:match(SUITE_PATTERN) then
    return ("'%s.debian' must be a Debian suite's codename like \"bookworm\""):format(name), nil,
           { name, "debian" }
  end
  local pkgs = v.packages
  if pkgs == nil then pkgs = {} end
  if type(pkgs) ~= "table" or not is_array(pkgs) then
    return ("'%s.packages' must be a list of package names"):format(name), nil, { name, "packages" }
  end
  if #pkgs > M.MAX_PACKAGES then
    return ("'%s.packages' has more than %d entries"):format(name, M.MAX_PACKAGES), nil, { name, "packages" }
  end
  local out, seen = {}, {}
  for i = 1, #pkgs do
    local p = pkgs[i]
    if not M.valid_package(p) then
      return ("'%s.packages[%d]' must be a Debian package name (lowercase letters, digits, '+', '-', '.'), not %s")
               :format(name, i, type(p) == "string" and ("%q"):format(p:sub(1, 64)) or "a " .. type(p)),
             nil, { name, "packages" }
    end
    if seen[p] then
      return ("'%s.packages' names %q twice"):format(name, p), nil, { name, "packages" }
    end
    seen[p] = true
    out[#out + 1] = p
  end
  table.sort(out)
  return nil, { debian = suite, packages = out }
end

-- ------------------------------------------------------- apt sources

local function words(s)
  local t = {}
  for w in s:gmatch("%S+") do t[#t + 1] = w end
  return t
end

--- Parses deb822 sources text (a .sources file).  Returns a list of
-- entries { types, uris, suites, components, signed_by (a path or nil),
-- enabled, file, line }.
function M.parse_deb822(text, file)
  local entries, cur, last = {}, nil, nil
  local n = 0
  local function close()
    if cur then entries[#entries + 1] = cur end
    cur, last = nil, nil
  end
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:match("^%s*$") then
      close()
    elseif line:match("^#") then
      -- a comment, inside a paragraph or between them
    elseif line:match("^[ \t]") then
      -- a continuation of the last field (an inline Signed-By key)
      if cur and last then cur.fields[last] = cur.fields[last] .. "\n" .. line end
    else
      local k, v = line:match("^([%w%-]+):%s*(.-)%s*$")
      if k then
        cur = cur or { fields = {}, file = file, line = n }
        last = k:lower()
        cur.fields[last] = v
      end
    end
  end
  close()
  local out = {}
  for _, e in ipairs(entries) do
    local f = e.fields
    local signed = f["signed-by"]
    if signed and not signed:match("^/[^%s]+$") then signed = nil end -- an inline key or fingerprints
    out[#out + 1] = {
      types = words(f.types or ""), uris = words(f.uris or ""), suites = words(f.suites or ""),
      components = words(f.components or ""), signed_by = signed,
      enabled = (f.enabled or "yes"):lower() ~= "no", file = e.file, line = e.line,
    }
  end
  return out
end

--- Parses one-line sources text (sources.list, *.list).
function M.parse_list(text, file)
  local out, n = {}, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    line = line:gsub("#.*$", "")
    local typ, rest = line:match("^%s*(deb%S*)%s+(.*)$")
    if typ == "deb" or typ == "deb-src" then
      local opts = {}
      local o, after = rest:match("^%[([^%]]*)%]%s*(.*)$")
      if o then
        rest = after
        for k, v in o:gmatch("([%w%-]+)=(%S+)") do opts[k:lower()] = v end
      end
      local w = words(rest)
      if #w >= 2 then
        local comps = {}
        for i = 3, #w do comps[#comps + 1] = w[i] end
        local signed = opts["signed-by"]
        if signed and not signed:match("^/[^%s,]+$") then signed = nil end
        out[#out + 1] = { types = { typ }, uris = { w[1] }, suites = { w[2] }, components = comps,
                          signed_by = signed, enabled = true, file = file, line = n }
      end
    end
  end
  return out
end

local function read_small(path)
  local fd = uv.fs_open(path, "r", 0)
  if not fd then return nil end
  local st = uv.fs_fstat(fd)
  local text
  if st and st.type == "file" and st.size <= M.MAX_SOURCE_FILE then text = uv.fs_read(fd, st.size, 0) end
  uv.fs_close(fd)
  return text
end

--- The apt sources of this host: sources.list, then sources.list.d's
-- *.list and *.sources in name order, as apt reads them.  apt_dir
-- defaults to /etc/apt.
function M.host_sources(apt_dir)
  apt_dir = apt_dir or M.APT_DIR
  local out = {}
  local function add(list)
    for _, e in ipairs(list) do out[#out + 1] = e end
  end
  local main = read_small(apt_dir .. "/sources.list")
  if main then add(M.parse_list(main, apt_dir .. "/sources.list")) end
  local names = {}
  local dir = uv.fs_scandir(apt_dir .. "/sources.list.d")
  while dir do
    local name = uv.fs_scandir_next(dir)
    if not name then break end
    if (name:match("%.list$") or name:match("%.sources$")) and name:match("^[%w_.%-]+$") then
      names[#names + 1] = name
    end
    if #names >= M.MAX_SOURCE_FILES then break end
  end
  table.sort(names)
  for _, name in ipairs(names) do
    local path = apt_dir .. "/sources.list.d/" .. name
    local text = read_small(path)
    if text then
      add(name:match("%.sources$") and M.parse_deb822(text, path) or M.parse_list(text, path))
    end
  end
  return out
end

local function valid_uri(u)
  return type(u) == "string" and #u <= 1024 and u:match("^https?://[%w%-._~%%!$&'()*+,;=:@/%[%]]+$") ~= nil
end

--- The mirror for a suite, from apt source entries: every enabled "deb"
-- entry of the suite itself and of its -updates and -security suites (not
-- backports or proposed-updates).  Returns a list of
-- { uri, suites, components, signed_by }, or nil, err.
function M.select_mirror(entries, suite)
  local want = { [suite] = true, [suite .. "-updates"] = true, [suite .. "-security"] = true }
  local out, base = {}, false
  for _, e in ipairs(entries) do
    local deb = false
    for _, t in ipairs(e.types) do deb = deb or t == "deb" end
    if deb and e.enabled then
      local suites = {}
      for _, s in ipairs(e.suites) do
        if want[s] then suites[#suites + 1] = s end
        if s == suite then base = true end
      end
      if #suites > 0 then
        local comps = {}
        for _, c in ipairs(e.components) do
          if c:match("^[%w%-]+$") then comps[#comps + 1] = c end
        end
        for _, uri in ipairs(e.uris) do
          if valid_uri(uri) and #comps > 0 then
            out[#out + 1] = { uri = uri, suites = suites, components = comps, signed_by = e.signed_by }
          end
        end
      end
    end
  end
  if not base or #out == 0 then
    return nil, ("this host's apt sources (%s) have no http(s) entry for suite %q")
                  :format(M.APT_DIR, suite)
  end
  return out
end

--- The one-line apt sources of a mirror entry: one line per suite (the
-- one-line format takes one suite; more words would be components).
function M.source_lines(m)
  local opt = m.signed_by and ("[signed-by=%s] "):format(m.signed_by) or ""
  local out = {}
  for i, suite in ipairs(m.suites) do
    out[i] = ("deb %s%s %s %s"):format(opt, m.uri, suite, table.concat(m.components, " "))
  end
  return out
end

-- ----------------------------------------------------- lock and status

--- Parses a dpkg status file: the sorted "name=version" of every package
-- whose status is "install ok installed".
function M.parse_status(text)
  local out = {}
  for para in (text .. "\n\n"):gmatch("(.-)\n\n+") do
    local name = para:match("^Package: (%S+)") or para:match("\nPackage: (%S+)")
    local version = para:match("\nVersion: (%S+)")
    local status = para:match("\nStatus: ([^\n]+)")
    if name and version and status == "install ok installed" then
      out[#out + 1] = name .. "=" .. version
    end
  end
  table.sort(out)
  return out
end

--- The lock of a build: what build_locked takes back.
function M.lock_of(img)
  local mirror = {}
  for i, m in ipairs(img.mirror) do
    mirror[i] = { uri = m.uri, suites = m.suites, components = m.components }
  end
  return { debian = img.suite, packages = img.packages, mirror = mirror, epoch = img.epoch,
           include = img.include }
end

--- Checks a lock (read from a file: hostile).  Returns the normalised lock,
-- or nil, err.
function M.check_lock(lock)
  if type(lock) ~= "table" then return nil, "a Debian image lock must be a table" end
  for k in pairs(lock) do
    if k ~= "debian" and k ~= "packages" and k ~= "mirror" and k ~= "epoch" and k ~= "include" then
      return nil, ("the lock has an unknown field '%s'"):format(tostring(k))
    end
  end
  if type(lock.debian) ~= "string" or #lock.debian > 32 or not lock.debian:match(SUITE_PATTERN) then
    return nil, "the lock's 'debian' must be a suite's codename"
  end
  local epoch = math.tointeger(lock.epoch) -- JSON numbers decode as floats
  if not epoch or epoch < 0 or epoch > 1 << 40 then
    return nil, "the lock's 'epoch' must be a time in seconds"
  end
  local pkgs = lock.packages
  if type(pkgs) ~= "table" or not is_array(pkgs) or #pkgs == 0 or #pkgs > M.MAX_LOCKED then
    return nil, ("the lock's 'packages' must be a list of 1 to %d \"name=version\""):format(M.MAX_LOCKED)
  end
  local seen, out = {}, {}
  for i, p in ipairs(pkgs) do
    local name, version
    if type(p) == "string" then name, version = p:match("^([^=]+)=(.+)$") end
    if not (name and M.valid_package(name) and M.valid_version(version)) then
      return nil, ("the lock's 'packages[%d]' must be \"name=version\""):format(i)
    end
    if seen[name] then return nil, ("the lock names package %q twice"):format(name) end
    seen[name] = true
    out[i] = p
  end
  table.sort(out)
  local include = lock.include or {}
  local err, spec = M.check_spec({ debian = lock.debian, packages = include }, "include")
  if err then return nil, "the lock's " .. err end
  for _, p in ipairs(spec.packages) do
    if not seen[p] then return nil, ("the lock's 'include' names %q, which its packages lack"):format(p) end
  end
  local mirror = {}
  if lock.mirror ~= nil then
    if type(lock.mirror) ~= "table" or not is_array(lock.mirror) or #lock.mirror > 64 then
      return nil, "the lock's 'mirror' must be a list of { uri, suites, components }"
    end
    for i, m in ipairs(lock.mirror) do
      if type(m) ~= "table" or not valid_uri(m.uri) or type(m.suites) ~= "table"
        or type(m.components) ~= "table" then
        return nil, ("the lock's 'mirror[%d]' must be { uri = \"http(s)://...\", suites = {...}, components = {...} }")
                      :format(i)
      end
      mirror[i] = { uri = m.uri, suites = m.suites, components = m.components }
    end
  end
  return { debian = lock.debian, packages = out, mirror = mirror, epoch = epoch, include = spec.packages }
end

-- ------------------------------------------------------------ children

local running = {} -- pid -> stop(), of the children running now

--- Stops every build this process runs (the daemon's shutdown): each
-- child's process group gets SIGTERM, SIGKILL 10 s later; the builds fail
-- and remove their work dirs.
function M.cancel_all()
  for _, stop in pairs(running) do stop("cancel") end
end

local function close(h)
  if h and not h:is_closing() then h:close() end
end

--- Runs argv (argv[1] an absolute path) with environment env (a list of
-- "K=V"); waits in the calling coroutine.  Keeps at most stdout_max bytes
-- of stdout (more fails the run).  After timeout seconds its whole process
-- group is killed.  Returns { code, signal, stdout, over, stopped =
-- "timeout"|"cancel"|nil }, or nil, err.
local function run(argv, env, stdout_max, timeout)
  local null = uv.fs_open("/dev/null", "r", 0)
  if not null then return nil, "cannot open /dev/null" end
  local res = async.wait(function(cb)
    local out = uv.new_pipe(false)
    local chunks, size, over = {}, 0, false
    local code, sig, pending = nil, nil, 2
    local handle, pid, timer, killer, why
    local function finish()
      pending = pending - 1
      if pending > 0 then return end
      close(timer); close(killer)
      cb({ code = code, signal = sig, stdout = table.concat(chunks), over = over,
           stopped = why })
    end
    local args = {}
    for i = 2, #argv do args[#args + 1] = argv[i] end
    handle, pid = uv.spawn(argv[1], { args = args, env = env, stdio = { null, out, 2 }, detached = true },
      function(c, s)
        code, sig = c, s
        running[pid] = nil
        close(handle)
        finish()
      end)
    if not handle then
      close(out)
      cb({ err = ("cannot run %s: %s"):format(argv[1], tostring(pid)) })
      return
    end
    local function stop(reason)
      why = why or reason
      if killer then return end
      uv.kill(-pid, "sigterm")
      killer = uv.new_timer()
      killer:start(10000, 0, function() uv.kill(-pid, "sigkill") end)
    end
    running[pid] = stop
    timer = uv.new_timer()
    timer:start(math.floor(timeout * 1000), 0, function() stop("timeout") end)
    out:read_start(function(err, data)
      if data and not over then
        size = size + #data
        if size > stdout_max then
          over = true
          chunks = {}
          uv.kill(-pid, "sigkill")
        else
          chunks[#chunks + 1] = data
        end
      elseif not data then
        close(out)
        finish()
      end
    end)
  end)
  uv.fs_close(null)
  if res.err then return nil, res.err end
  return res
end

-- ------------------------------------------------------------- files

local mkdirs = require("tupper.util.paths").mkdirs

--- Removes a tree without following symlinks.
local function rmtree(path)
  local st = uv.fs_lstat(path)
  if not st then return end
  if st.type == "directory" then
    local dir = uv.fs_scandir(path)
    while dir do
      local name = uv.fs_scandir_next(dir)
      if not name then break end
      rmtree(path .. "/" .. name)
    end
    uv.fs_rmdir(path)
  else
    uv.fs_unlink(path)
  end
end
M.rmtree = rmtree

local function write_file(path, text, mode)
  local fd, err = uv.fs_open(path, "w", mode or tonumber("644", 8))
  if not fd then return nil, err end
  local ok
  ok, err = uv.fs_write(fd, text, 0)
  uv.fs_close(fd)
  if not ok then return nil, err end
  return true
end

local function read_file(path, max)
  local fd, err = uv.fs_open(path, "r", 0)
  if not fd then return nil, err end
  local st = uv.fs_fstat(fd)
  local text
  if st and st.size <= max then text = uv.fs_read(fd, st.size, 0) end
  uv.fs_close(fd)
  if not text then return nil, path .. ": too large or unreadable" end
  return text
end

-- The last lines of mmdebstrap's log that say what failed ("E: ...").
local function log_errors(path)
  local fd = uv.fs_open(path, "r", 0)
  if not fd then return "" end
  local st = uv.fs_fstat(fd)
  local from = math.max(0, (st and st.size or 0) - 16384)
  local text = uv.fs_read(fd, 16384, from) or ""
  uv.fs_close(fd)
  local errs = {}
  for line in text:gmatch("[^\n]+") do
    if line:match("^E: ") then
      errs[#errs + 1] = #line > 300 and line:sub(1, 300) .. "..." or line
    end
  end
  if #errs == 0 then
    for line in text:gmatch("[^\n]+") do errs[#errs + 1] = line end
    while #errs > 5 do table.remove(errs, 1) end
  end
  while #errs > 12 do table.remove(errs, 1) end
  return table.concat(errs, "\n")
end

-- ------------------------------------------------------------- build

-- The customize hook: the account, sudo rule, locale and host files an agent
-- expects, written the same way on every build.
local CUSTOMIZE = [[
#!/bin/sh
# Written by tupper (lua/tupper/image/debian.lua): what an agent expects of a
# general-purpose sandbox.  $1 is the chroot.
set -eu
root=$1
if ! chroot "$root" getent passwd @USER@ >/dev/null; then
  chroot "$root" useradd --uid @UID@ --user-group --create-home --home-dir @HOME@ --shell /bin/bash @USER@
fi
if [ -e "$root/usr/bin/sudo" ]; then
  printf '@USER@ ALL=(ALL:ALL) NOPASSWD: ALL\n' > "$root/etc/sudoers.d/tupper-@USER@"
  chmod 0440 "$root/etc/sudoers.d/tupper-@USER@"
fi
printf 'tupper\n' > "$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"
chmod 0644 "$root/etc/hostname" "$root/etc/hosts"
rm -f "$root/etc/resolv.conf"
printf 'LANG=C.UTF-8\n' > "$root/etc/default/locale"
rm -f "$root/etc/apt/preferences.d/tupper-lock"
]]

-- The setup hook of a locked build: pins every package at its locked
-- version, so that even the essential set (which mmdebstrap picks before
-- any --include) comes at the lock's versions.  The --include stays the
-- recipe's names, as in the first build: naming every package would mark
-- them all as installed by hand, and the image would differ from the first
-- build in /var/lib/apt/extended_states.
local function pin_hook(packages)
  local lines = {}
  for _, p in ipairs(packages) do
    local name, version = p:match("^([^=]+)=(.+)$")
    lines[#lines + 1] = ("Package: %s\nPin: version %s\nPin-Priority: 1001\n"):format(name, version)
  end
  return "#!/bin/sh\n# Written by tupper: the lock's versions.\nset -eu\n" ..
    "mkdir -p \"$1/etc/apt/preferences.d\"\n" ..
    "cat > \"$1/etc/apt/preferences.d/tupper-lock\" <<'TUPPER_LOCK_EOF'\n" ..
    table.concat(lines, "\n") .. "TUPPER_LOCK_EOF\n"
end

-- The host's apt options that mmdebstrap's own apt should share: a host on
-- a snapshot mirror turns off the Valid-Until check, or nothing would build.
local function host_aptopts()
  local res = run({ "/usr/bin/apt-config", "shell", "V", "Acquire::Check-Valid-Until", "D",
                    "Acquire::Check-Date" }, { "PATH=/usr/bin:/bin" }, 4096, 30)
  local out = {}
  if res and res.code == 0 then
    if res.stdout:match("V='false'") then out[#out + 1] = 'Acquire::Check-Valid-Until "false"' end
    if res.stdout:match("D='false'") then out[#out + 1] = 'Acquire::Check-Date "false"' end
  end
  return out
end

local function key_of(suite, mirror, include, pins)
  local parts = { "tupper-debian", tostring(M.FORMAT), tostring(M.EPOCH), suite }
  for _, m in ipairs(mirror) do
    for _, line in ipairs(M.source_lines(m)) do parts[#parts + 1] = line end
  end
  parts[#parts + 1] = "include"
  for _, p in ipairs(include) do parts[#parts + 1] = p end
  if pins then
    parts[#parts + 1] = "pins"
    for _, p in ipairs(pins) do parts[#parts + 1] = p end
  end
  return sha256.hex(table.concat(parts, "\n"))
end
M.key_of = key_of

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
    if name:match("^build%-") and not building[path] then rmtree(path) end
  end
end

-- The record of a build in the cache (image.json), with its tar if that is
-- still there (an import into the image store removes it).
local function record(dir)
  local text = read_file(dir .. "/image.json", 16 * 1024 * 1024)
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
  local key = key_of(job.suite, job.mirror, job.include, job.pins)
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
  local ok, err = mkdirs(opts.cache, tonumber("700", 8))
  if not ok then return nil, ("cannot create %s: %s"):format(opts.cache, err) end
  local work
  work, err = uv.fs_mkdtemp(opts.cache .. "/build-XXXXXX")
  if not work then return nil, ("cannot create a build dir in %s: %s"):format(opts.cache, err) end
  building[work] = true
  -- whatever happens in the build, its work dir goes unless it became the image
  local res, a, b = pcall(build_in, job, key, dir, opts, work)
  building[work] = nil
  if not res then a, b = nil, "internal error building a Debian image: " .. tostring(a) end
  if not a then rmtree(work) end
  return a, b
end

build_in = function(job, key, dir, opts, work)
  local ok, err
  local function fail(msg) return nil, msg end
  local hooks = work .. "/hooks"
  uv.fs_mkdir(hooks, tonumber("755", 8))
  uv.fs_chmod(work, tonumber("755", 8))
  local customize = CUSTOMIZE:gsub("@(%u+)@", { USER = M.USER, UID = tostring(M.UID), HOME = M.HOME })
  ok, err = write_file(hooks .. "/customize50-tupper.sh", customize, tonumber("755", 8))
  if ok and job.pins then
    ok, err = write_file(hooks .. "/setup50-tupper-lock.sh", pin_hook(job.pins), tonumber("755", 8))
  end
  if not ok then return fail("cannot write the build's hooks: " .. tostring(err)) end

  local aptopts = opts.aptopts or host_aptopts()
  local env = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "SOURCE_DATE_EPOCH=" .. M.EPOCH, "TMPDIR=" .. work,
                "HOME=" .. work, "LC_ALL=C.UTF-8" }
  -- one mmdebstrap run; target "/dev/null" with simulate: apt only resolves
  local function mmdebstrap(what, include, target, extra)
    local log = work .. "/" .. what .. ".log"
    local argv = { M.MMDEBSTRAP, "--mode=unshare", "--variant=apt", "--logfile=" .. log, "--verbose" }
    for _, a in ipairs(extra) do argv[#argv + 1] = a end
    for _, o in ipairs(aptopts) do argv[#argv + 1] = "--aptopt=" .. o end
    if #include > 0 then argv[#argv + 1] = "--include=" .. table.concat(include, ",") end
    argv[#argv + 1] = "--"
    argv[#argv + 1] = job.suite
    argv[#argv + 1] = target
    for _, m in ipairs(job.mirror) do
      for _, line in ipairs(M.source_lines(m)) do argv[#argv + 1] = line end
    end
    if opts.on_start then opts.on_start(argv) end
    local res, rerr = run(argv, env, 1024 * 1024, opts.timeout or M.TIMEOUT)
    if not res then return nil, rerr end
    if res.stopped == "cancel" then return nil, "the build was stopped (the daemon is shutting down)" end
    if res.stopped == "timeout" then
      return nil, ("mmdebstrap took longer than %s s and was killed"):format(opts.timeout or M.TIMEOUT)
    end
    if res.code ~= 0 or res.signal ~= 0 then
      return nil, ("mmdebstrap failed (exit %d%s):\n%s"):format(res.code or -1,
        (res.signal or 0) ~= 0 and (", signal " .. res.signal) or "", log_errors(log))
    end
    uv.fs_unlink(log)
    return true
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

  res, err = run({ "/usr/bin/tar", "-xOf", tar, "./var/lib/dpkg/status" }, { "PATH=/usr/bin:/bin" },
                 M.MAX_STATUS, 300)
  if not res or res.code ~= 0 or res.over then
    return fail("cannot read the image's dpkg status: " .. tostring(err or "tar failed"))
  end
  local packages = M.parse_status(res.stdout)
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
  ok, err = write_file(work .. "/image.json", json.encode(rec), tonumber("644", 8))
  if not ok then return fail("cannot write image.json: " .. tostring(err)) end
  rmtree(hooks)
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
  return M.select_mirror(M.host_sources(opts.apt_dir), suite)
end

-- What to build for a spec, or for a lock (opts.lock): { suite, mirror,
-- include, pins }, or nil, err.
local function job_of(spec, opts)
  local err, s = M.check_spec(spec)
  if err then return nil, err end
  local l
  if opts.lock ~= nil then
    l, err = M.check_lock(opts.lock)
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
  img.debian = M.lock_of(rec)
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
  local key = key_of(job.suite, job.mirror, job.include, job.pins)
  local ref, dir = M.ref(job.suite, key), opts.cache .. "/" .. key
  return once("image " .. key, function()
    if job.pins then
      -- the image built without the lock, when it has exactly the lock's
      -- versions (its record is ours, the lock's claims are not trusted)
      local k1 = key_of(job.suite, job.mirror, job.include)
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
  local l, err = M.check_lock(lock)
  if not l then return nil, err end
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.lock = lock
  return M.build({ debian = l.debian, packages = l.include }, o)
end

return M
