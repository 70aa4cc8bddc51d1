-- The MCP server's long-call test (sdk/js/test/slow/mcp-long.test.mjs): a
-- 5-minute command under the official client's default 60 s timeout, kept
-- alive by progress notifications.  Five minutes by design, so it runs here
-- rather than in `npm test` (which keeps a fast test of the same mechanism:
-- a 6 s command under a 2 s timeout).  Needs sdk/js built (npm ci, npm run
-- build; tests/run.sh's sdk/js suite does it first).  Bounded: a hang fails
-- here instead of eating the step.
local uv = require("luv")
local helper = require("helper")

describe("the MCP server's long calls", function()
  it("carries a 5-minute command under the client's 60 s timeout", function()
    local root = os.getenv("TUPPER_ROOT") or "."
    local dir = root .. "/sdk/js"
    assert(uv.fs_stat(dir .. "/dist/cli-mcp.js"), "sdk/js is not built: npm ci && npm run build in sdk/js")
    local out = {}
    local stdout, stderr = uv.new_pipe(false), uv.new_pipe(false)
    local code
    -- its own process group: a timeout stops the runner, its daemon and server, all of them
    local handle, pid = uv.spawn("node", { args = { "--test", "test/slow/mcp-long.test.mjs" }, cwd = dir,
      stdio = { nil, stdout, stderr }, detached = true }, function(c, sig) code = sig ~= 0 and 128 + sig or c end)
    assert(handle, pid)
    local open = 2
    local function reader(_, chunk) if chunk then out[#out + 1] = chunk else open = open - 1 end end
    stdout:read_start(reader)
    stderr:read_start(reader)
    local deadline = helper.now() + 12 * 60 * 1000
    local guard = uv.new_timer()
    guard:start(1000, 1000, function() end)
    while (code == nil or open > 0) and helper.now() < deadline do uv.run("once") end
    guard:close()
    if code == nil then
      uv.kill(-pid, "sigterm")
      local grace = helper.now() + 15000
      while code == nil and helper.now() < grace do uv.run("once") end
      uv.kill(-pid, "sigkill")
      while code == nil do uv.run("once") end
    end
    handle:close()
    if not stdout:is_closing() then stdout:close() end
    if not stderr:is_closing() then stderr:close() end
    uv.run("nowait")
    local text = table.concat(out)
    assert.are.equal(0, code, text:sub(-6000))
    assert.matches("# pass 1", text)
    assert.matches("# fail 0", text)
  end)
end)
