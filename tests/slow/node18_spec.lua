-- The TypeScript SDK on Debian 12's Node 18 and npm, what bootstrap.sh
-- installs on a machine without a node >= 18.20: a copy of sdk/js gets
-- `npm ci` and `npm test` (tsc, then the whole node:test suite against real
-- daemons: the SDK, the examples, the MCP server, the HTTP API) with them,
-- as `make test` does on a fresh Debian 12.  Any test failing there fails
-- this spec.
--
-- Debian's nodejs conflicts with NodeSource's (this host may have either),
-- so nothing is installed: `apt-get download` fetches nodejs, libnode108,
-- npm and those of their dependencies the host lacks (about 360 small
-- packages, 25 MB) into this spec's temp dir, `dpkg-deb -x` unpacks them
-- there, and npm runs in a private mount namespace (unshare -m) where a
-- read-only overlay puts that tree above /usr: /usr/bin/node is Debian's
-- there.  Debian's node loads parts of itself (undici for fetch, the CJS
-- lexer, acorn) from /usr/share/nodejs by absolute path, which is why it
-- needs the overlay rather than a PATH entry.  npm's cache and HOME are in
-- the temp dir too.  Nothing outlives the spec: the namespace dies with the
-- run, the temp dir is removed.
--
-- Needs root (the mount namespace; the SDK suite needs it anyway), the
-- host's apt mirror and the npm registry: when either cannot be reached
-- (offline), the spec is skipped and says why.  Bounded: each step has a
-- time limit, after which its process group is killed.
local uv = require("luv")
local helper = require("helper")

local APT_SECONDS = 600
local UNPACK_SECONDS = 600 -- a minute here
local CI_SECONDS = 600 -- 20 s here
local TEST_SECONDS = 1200 -- 2 to 3 minutes here on 2 busy cores

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

--- Debian's newest nodejs 18 in apt's lists, or nil.
local function node18_version()
  local _, out = sh("apt-cache madison nodejs")
  for v in out:gmatch("nodejs%s*|%s*(%S+)%s*|") do
    if v:match("^18%.") then return v end -- madison lists the newest first
  end
end

--- The packages `apt-get install nodejs=V npm` would add here: those
-- named and, recursively, the dependencies the host lacks (the first of
-- alternatives; virtual names are provided by a package in the set).
local function packages(version)
  local installed = {}
  local _, out = sh("dpkg-query -W -f='${Package} ${Status}\\n'")
  for name, status in out:gmatch("([^%s]+) ([^\n]*)") do
    if status:find("install ok installed", 1, true) then installed[name] = true end
  end
  local want = { "nodejs=" .. version, "libnode108=" .. version, "npm" }
  local seen = { nodejs = true, libnode108 = true, npm = true }
  local level = want
  while #level > 0 do
    assert(#want < 1000, "more than 1000 packages to fetch for nodejs and npm")
    local quoted = {}
    for i, p in ipairs(level) do quoted[i] = q(p) end
    local ok
    ok, out = sh("apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks "
      .. "--no-replaces --no-enhances " .. table.concat(quoted, " "))
    assert(ok, out)
    local next_level = {}
    local function add(name)
      if seen[name] then return end
      seen[name] = true
      if not installed[name] then
        want[#want + 1] = name
        next_level[#next_level + 1] = name
      end
    end
    -- a virtual name ("Depends: <node-color-support>") is followed by the
    -- packages that provide it, one per line: the first is taken unless
    -- one of them is installed or already taken
    local providers
    local function resolve()
      if not providers then return end
      local have = #providers == 0
      for _, p in ipairs(providers) do have = have or installed[p] or seen[p] end
      if not have then add(providers[1]) end
      providers = nil
    end
    local alt = false
    for line in out:gmatch("[^\n]+") do
      local provider = line:match("^    (%S+)$")
      if provider and providers then
        providers[#providers + 1] = provider
      elseif not provider then
        resolve()
        -- "|Depends: a" then "Depends: b" are alternatives: the first is taken
        local bar, name = line:match("^%s*(|?)Depends:%s*(%S+)")
        if not name then bar, name = line:match("^%s*(|?)PreDepends:%s*(%S+)") end
        if name then
          local first = not alt
          alt = bar == "|"
          name = name:gsub(":any>?$", function(e) return e:sub(-1) == ">" and ">" or "" end)
          if first and name:match("^<.*>$") then
            providers = {}
          elseif first then
            add(name)
          end
        else
          alt = false -- a package's header line
        end
      end
    end
    resolve()
    level = next_level
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

  it("passes `npm ci && npm test` with Debian 12's node 18 and npm", function()
    local version = node18_version()
    if not version then
      pending("no nodejs 18 in apt's lists (not Debian 12, or `apt-get update` never ran)")
      return
    end
    local pkgs = packages(version)
    -- the package at sdk/js of the copy, docs/ beside it: tests read docs/http.md
    local debs, root, pkg = dir .. "/debs", dir .. "/root", dir .. "/sdk/js"
    assert(uv.fs_mkdir(debs, 493) and uv.fs_mkdir(root, 493) and uv.fs_mkdir(dir .. "/home", 448))
    -- apt's sandbox user cannot write to a 0700 temp dir: fetch as root
    local ok, out = sh("cd " .. q(debs) .. " && timeout -k 10 " .. APT_SECONDS
      .. " apt-get download -q -o APT::Sandbox::User=root " .. table.concat(pkgs, " "))
    if not ok then
      pending("apt cannot download Debian's nodejs " .. version .. " and npm (offline?): " .. out:sub(-400))
      return
    end
    ok, out = sh("cd " .. q(debs) .. " && timeout -k 10 " .. UNPACK_SECONDS .. " sh -c "
      .. q("for f in *.deb; do dpkg-deb -x \"$f\" " .. q(root) .. " || exit 1; done"))
    assert.is_true(ok, out)
    assert.is_truthy(uv.fs_stat(root .. "/usr/bin/node"), "no usr/bin/node in " .. table.concat(pkgs, " "))
    assert.is_truthy(uv.fs_stat(root .. "/usr/bin/npm"), "no usr/bin/npm in " .. table.concat(pkgs, " "))
    -- overlayfs takes ':' and ',' as separators in lowerdir
    assert.is_nil(root:find("[:,]"), root)

    -- a copy of the package, without what the host's node built in it (nor
    -- test/runtimes.sh's bun and deno, 200 MB)
    ok, out = sh("mkdir -p " .. q(pkg) .. " && tar -C " .. q(helper.ROOT .. "/sdk/js")
      .. " --exclude=./node_modules --exclude=./dist --exclude=./.runtimes -cf - . | tar -C " .. q(pkg) .. " -xf -"
      .. " && tar -C " .. q(helper.ROOT) .. " -cf - docs | tar -C " .. q(dir) .. " -xf -")
    assert.is_true(ok, out)
    assert.is_truthy(uv.fs_stat(pkg .. "/package-lock.json"), out)
    local bin = assert(uv.fs_realpath(helper.BIN))

    --- Runs `script` in the namespace, in the copy, bounded; returns ok and
    -- its output.  Debian's node and npm are /usr/bin's there and first in
    -- PATH; the suite's children run process.execPath, the same node.
    local function in_debian_node(script, seconds, log)
      local inner = table.concat({
        "mount -t overlay overlay -o lowerdir=" .. root .. "/usr:/usr /usr || exit 97",
        "cd " .. q(pkg) .. " || exit 97",
        "export PATH=/usr/bin:/bin:$PATH HOME=" .. q(dir .. "/home") .. " TUPPER_BIN=" .. q(bin),
        "export npm_config_cache=" .. q(dir .. "/npm-cache") .. " npm_config_update_notifier=false",
        script,
      }, "\n")
      -- timeout(1) signals its whole process group: npm, node, the test
      -- files' processes and their daemons (which kill their sandboxes on
      -- SIGTERM)
      local done = sh("timeout -k 30 " .. seconds .. " unshare -m sh -c " .. q(inner) .. " >" .. q(log) .. " 2>&1")
      return done, helper.read_file(log) or ""
    end

    local ci_ok, ci = in_debian_node(table.concat({
      "echo \"node: $(node -p 'process.version + \" \" + process.execPath')\"",
      "echo \"npm: $(npm --version) $(readlink -f \"$(command -v npm)\")\"",
      "exec npm ci --no-audit --no-fund",
    }, "\n"), CI_SECONDS, dir .. "/ci.log")
    if not ci_ok and ci:find("npm ERR! code E[A-Z]*") and
      (ci:find("ENOTFOUND") or ci:find("EAI_AGAIN") or ci:find("ECONNREFUSED") or ci:find("ENETUNREACH")
        or ci:find("ETIMEDOUT")) then
      pending("npm cannot reach its registry (offline?): " .. ci:sub(-400))
      return
    end
    assert.is_true(ci_ok, ci)
    assert.is_truthy(("\n" .. ci):find("\nnode: v18%.%d+%.%d+ /usr/bin/node\n"), ci)
    -- Debian's npm (NodeSource's, 10 or 11, needs node 20 and would not run)
    assert.is_truthy(ci:find("\nnpm: %d+%.%d+%.%d+ /usr/share/nodejs/npm/"), ci)

    local t0 = uv.hrtime()
    local test_ok, text = in_debian_node("exec npm test", TEST_SECONDS, dir .. "/test.log")
    local secs = (uv.hrtime() - t0) / 1e9
    local failures = {}
    for line in text:gmatch("[^\n]+") do
      if line:match("^not ok") then failures[#failures + 1] = line end
    end
    local summary = ("%s%s\nnpm test: %.0f s; failures:\n%s\n--- tail:\n%s"):format(
      ci:match("node: [^\n]*\n") or "", ci:match("npm: [^\n]*") or "", secs,
      table.concat(failures, "\n"), text:sub(-3000))
    assert.is_true(test_ok, summary)
    assert.are.same({}, failures, summary)
    local pass, fail, cancelled = text:match("\n# pass (%d+)\n# fail (%d+)\n# cancelled (%d+)\n")
    assert.is_truthy(pass, summary)
    assert.are.equal("0", fail, summary)
    assert.are.equal("0", cancelled, summary)
    -- every test ran and passed or was skipped on purpose (a file's
    -- describe() blocks add theirs), and at least every top-level test() of
    -- the suite's files is among them: a run that lost a file (a load
    -- error, a runner that skipped it) fails here
    local tests = tonumber(text:match("\n# tests (%d+)\n"))
    local skipped = tonumber(text:match("\n# skipped (%d+)\n") or "0")
    assert.is_truthy(tests, summary)
    assert.are.equal(tests, tonumber(pass) + skipped, summary)
    assert.is_true(tests >= count_tests(pkg .. "/test"), summary)
  end)
end)
