-- The backend matrix: the shared API spec of the Lua client
-- (tests/spec/sdk_spec.lua: sandboxes, commands with output, exit codes,
-- stdin, env, cwd, background processes, signals, timeouts, files) and the
-- daemon's socket API and CLI end to end (tests/spec/daemon_spec.lua) run
-- again against the microvm backend; TUPPER_TEST_BACKEND makes every
-- create of theirs a microVM.  The linux run is the default suite's.
-- Boots a microVM per test under TCG: slow.
local uv = require("luv")
local helper = require("helper")

local cache_dir
if not os.getenv("TUPPER_VM_CACHE") then
  cache_dir = helper.tmpdir()
  uv.os_setenv("TUPPER_VM_CACHE", cache_dir)
end
uv.os_setenv("TUPPER_TEST_BACKEND", "microvm")
local saved = helper.TIMEOUT_MS
helper.TIMEOUT_MS = 300000

local root = os.getenv("TUPPER_ROOT") or "."
for _, name in ipairs({ "sdk_spec", "daemon_spec" }) do
  local chunk = assert(loadfile(root .. "/tests/spec/" .. name .. ".lua", "t", _ENV))
  chunk()
end

describe("the backend matrix", function()
  teardown(function()
    uv.os_unsetenv("TUPPER_TEST_BACKEND")
    helper.TIMEOUT_MS = saved
    if cache_dir then
      helper.rmrf(cache_dir)
      uv.os_unsetenv("TUPPER_VM_CACHE")
    end
  end)
  it("ran the shared specs on microvm", function()
    assert.are.equal("microvm", os.getenv("TUPPER_TEST_BACKEND"))
  end)

  -- The TypeScript SDK's tests whose sandbox takes TUPPER_TEST_BACKEND
  -- (sdk/js/test/daemon.mjs withSandbox, account.test.mjs): commands (a
  -- tree kill with a setsid grandchild among them), files, terminals,
  -- watches and accounts.  The
  -- others create linux boxes whatever the variable says.  Needs sdk/js
  -- built (npm ci, npm run build; tests/run.sh's sdk/js suite does it
  -- first).  Bounded: a hang fails here instead of eating the step.
  it("passes the TypeScript SDK's sandbox tests on microvm", function()
    local dir = root .. "/sdk/js"
    assert(uv.fs_stat(dir .. "/dist/index.js"), "sdk/js is not built: npm ci && npm run build in sdk/js")
    local files = { "test/commands.test.mjs", "test/files.test.mjs", "test/pty.test.mjs", "test/watch.test.mjs",
                    "test/account.test.mjs" }
    -- a per-test bound where this node has one (20.11 and later; Debian
    -- 12's node 18 has not): the 20 minutes below bound the whole run anyway
    local args = { "--test" }
    if os.execute("node --test-timeout=600000 -e 0 >/dev/null 2>&1") then
      args[#args + 1] = "--test-timeout=600000"
    end
    for _, f in ipairs(files) do args[#args + 1] = f end
    -- its own process group: a timeout stops the runner, its test files
    -- and the daemons they started, all of them
    local code, text = helper.run_host({ "node", table.unpack(args) }, { cwd = dir, ms = 20 * 60 * 1000 })
    assert.are.equal(0, code, text:sub(-6000))
    assert.matches("# fail 0", text)
  end)
end)
