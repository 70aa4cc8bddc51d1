-- The backend matrix: the shared API spec of the Lua client
-- (tests/spec/sdk_spec.lua: sandboxes, commands with output, exit codes,
-- stdin, env, cwd, background processes, signals, timeouts, files) run
-- again, unchanged, against the microvm backend.  The linux run is the
-- default suite's.  Boots a microVM per test under TCG: slow.
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
local chunk = assert(loadfile(root .. "/tests/spec/sdk_spec.lua", "t", _ENV))
chunk()

describe("the backend matrix", function()
  teardown(function()
    uv.os_unsetenv("TUPPER_TEST_BACKEND")
    helper.TIMEOUT_MS = saved
    if cache_dir then
      helper.rmrf(cache_dir)
      uv.os_unsetenv("TUPPER_VM_CACHE")
    end
  end)
  it("ran the shared spec on microvm", function()
    assert.are.equal("microvm", os.getenv("TUPPER_TEST_BACKEND"))
  end)
end)
