-- The TypeScript SDK on Debian 12's Node 18 (what bootstrap.sh installs on a
-- machine without a node >= 18): sdk/js is type-checked and built by tsc
-- and its whole node:test suite (real daemons, the MCP server, the HTTP API)
-- is run with that node.  Any test failing there fails this spec.
--
-- Debian's nodejs conflicts with NodeSource's (this host may have either),
-- so it is not installed: `apt-get download` fetches nodejs, libnode108 and
-- those of their dependencies the host lacks into this spec's temp dir
-- (about 12 MB), `dpkg-deb -x` unpacks them there, and the suite runs in a
-- private mount namespace (unshare -m) where a read-only overlay puts that
-- tree above /usr.  Debian's node loads parts of itself (undici for fetch,
-- the CJS lexer, acorn) from /usr/share/nodejs by absolute path, which is
-- why it needs the overlay rather than a PATH entry.  Nothing outlives the
-- spec: the namespace dies with the run, the temp dir is removed.
--
-- Needs root (the mount namespace; the SDK suite needs it anyway) and the
-- host's apt mirror: when apt cannot download the packages (offline), the
-- spec is skipped and says why.  The built sdk/js/node_modules must be
-- there (tests/run.sh's sdk/js step runs `npm ci` before the slow specs).
-- Bounded: RUN_SECONDS for the suite, then its process group is killed.
local uv = require("luv")
local helper = require("helper")

local RUN_SECONDS = 1200 -- about 2 to 3 minutes here on 2 busy cores
local APT_SECONDS = 300

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

--- Runs a shell command; returns ok, its output (stdout and stderr).
local function sh(cmd)
  local p = assert(io.popen("(" .. cmd .. ") 2>&1", "r"))
  local out = p:read("a")
  local ok = p:close()
  return ok == true, out
end

local function installed(pkg)
  local ok, out = sh("dpkg-query -W -f='${Status}' " .. q(pkg))
  return ok and out:find("install ok installed", 1, true) ~= nil
end

--- Debian's newest nodejs 18 in apt's lists, or nil.
local function node18_version()
  local _, out = sh("apt-cache madison nodejs")
  for v in out:gmatch("nodejs%s*|%s*(%S+)%s*|") do
    if v:match("^18%.") then return v end -- madison lists the newest first
  end
end

--- nodejs=V, libnode108=V and, recursively, those of their dependencies
-- that are not installed here: what `apt-get install nodejs` would add.
local function packages(version)
  local want = { "nodejs=" .. version, "libnode108=" .. version }
  local seen = { nodejs = true, libnode108 = true }
  local i = 1
  while want[i] do
    assert(#want < 100, "more than 100 packages to fetch for nodejs: " .. table.concat(want, " "))
    local ok, out = sh("apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks "
      .. "--no-replaces --no-enhances " .. q(want[i]))
    assert(ok, out)
    local alt = false
    for line in out:gmatch("[^\n]+") do
      -- "|Depends: a" then "Depends: b" are alternatives: the first is taken
      local bar, name = line:match("^%s*(|?)Depends:%s*(%S+)")
      if name then
        local first = not alt
        alt = bar == "|"
        name = name:gsub(":any$", "")
        if first and not name:match("^<") and not seen[name] then
          seen[name] = true
          if not installed(name) then want[#want + 1] = name end
        end
      end
    end
    i = i + 1
  end
  return want
end

--- The top-level test() calls in dir/*.test.mjs.
local function count_tests(dir)
  local n = 0
  local scan = assert(uv.fs_scandir(dir))
  while true do
    local name = uv.fs_scandir_next(scan)
    if not name then break end
    if name:match("%.test%.mjs$") then
      for line in io.lines(dir .. "/" .. name) do
        if line:match("^test%(") then n = n + 1 end
      end
    end
  end
  return n
end

describe("the TypeScript SDK on Debian's Node 18", function()
  local dir

  setup(function()
    dir = helper.tmpdir()
  end)

  teardown(function()
    if dir then helper.rmrf(dir) end
  end)

  it("passes the whole sdk/js suite (tsc and node --test) on node 18", function()
    local version = node18_version()
    if not version then
      pending("no nodejs 18 in apt's lists (not Debian 12, or `apt-get update` never ran)")
      return
    end
    local pkgs = packages(version)
    local debs = dir .. "/debs"
    local root = dir .. "/root"
    assert(uv.fs_mkdir(debs, 493) and uv.fs_mkdir(root, 493))
    -- apt's sandbox user cannot write to a 0700 temp dir: fetch as root
    local ok, out = sh("cd " .. q(debs) .. " && timeout " .. APT_SECONDS
      .. " apt-get download -q -o APT::Sandbox::User=root " .. table.concat(pkgs, " "))
    if not ok then
      pending("apt cannot download Debian's nodejs " .. version .. " (offline?): " .. out:sub(-400))
      return
    end
    ok, out = sh("for f in " .. q(debs) .. "/*.deb; do dpkg-deb -x \"$f\" " .. q(root) .. " || exit 1; done")
    assert.is_true(ok, out)
    assert.is_truthy(uv.fs_stat(root .. "/usr/bin/node"), "no usr/bin/node in " .. table.concat(pkgs, " "))
    -- overlayfs takes ':' and ',' as separators in lowerdir
    assert.is_nil(root:find("[:,]"), root)

    local sdk = helper.ROOT .. "/sdk/js"
    assert.is_truthy(uv.fs_stat(sdk .. "/node_modules/typescript"),
      "sdk/js/node_modules is missing: run `npm ci` in sdk/js first (tests/run.sh does)")
    -- what runs in the namespace: Debian's node is /usr/bin/node there, the
    -- first `node` on PATH, and process.execPath for the suite's children
    local inner = table.concat({
      "mount -t overlay overlay -o lowerdir=" .. root .. "/usr:/usr /usr || exit 97",
      "cd " .. q(sdk) .. " || exit 97",
      "export PATH=/usr/bin:/bin:$PATH",
      "echo \"node: $(node -p 'process.version + \" \" + process.execPath')\"",
      "node node_modules/typescript/bin/tsc -p tsconfig.json || exit 98",
      "node node_modules/typescript/bin/tsc -p test/tsconfig.json || exit 98",
      "exec node --test test/*.test.mjs",
    }, "\n")
    local log = dir .. "/sdk.log"
    local t0 = uv.hrtime()
    -- timeout(1) signals its whole process group: node, the test files'
    -- processes and their daemons (which kill their sandboxes on SIGTERM)
    ok = sh("timeout -k 30 " .. RUN_SECONDS .. " unshare -m sh -c " .. q(inner) .. " >" .. q(log) .. " 2>&1")
    local secs = (uv.hrtime() - t0) / 1e9
    local text = helper.read_file(log) or ""
    local failures = {}
    for line in text:gmatch("[^\n]+") do
      if line:match("^not ok") then failures[#failures + 1] = line end
    end
    local summary = ("%s\n%.0f s; failures:\n%s\n--- tail:\n%s"):format(text:match("node: [^\n]*") or "no node line",
      secs, table.concat(failures, "\n"), text:sub(-3000))
    assert.is_truthy(("\n" .. text):find("\nnode: v18%.%d+%.%d+ /usr/bin/node\n"), summary)
    assert.is_true(ok, summary)
    assert.are.same({}, failures, summary)
    local pass, fail, cancelled = text:match("\n# pass (%d+)\n# fail (%d+)\n# cancelled (%d+)\n")
    assert.is_truthy(pass, summary)
    assert.are.equal("0", fail, summary)
    assert.are.equal("0", cancelled, summary)
    -- every top-level test() of the suite's files ran and passed: a run
    -- that lost a file (a load error, a runner that skipped it) fails here
    assert.are.equal(count_tests(sdk .. "/test"), tonumber(pass), summary)
  end)
end)
