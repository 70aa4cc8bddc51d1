-- The shipped code-interpreter recipe end to end (slow: its first use builds
-- a Debian image with python3, ipykernel, jupyter-client, numpy, pandas and
-- matplotlib from this host's apt mirror).  One daemon, one build: the
-- image has what the driver needs, then the TypeScript SDK's
-- code-interpreter tests (sdk/js/test/code-interpreter.test.mjs: runCode,
-- contexts, timeouts, the MCP tool and the HTTP route) and the Python
-- SDK's (sdk/python/tests/test_code_interpreter.py) run against it through
-- TUPPER_CODE_SOCKET, sharing the recipe's cached image and layer.  Needs
-- sdk/js built (tests/run.sh's sdk/js suite does it first).
local uv = require("luv")
local helper = require("helper")
local json = require("tupper.util.json")

local root = os.getenv("TUPPER_ROOT") or "."

--- Runs argv in cwd with env added to this process's PATH and HOME, in its
-- own process group, bounded by ms; returns its exit code and output.
local function run(argv, cwd, env, ms)
  local full = { "PATH=" .. (os.getenv("PATH") or "/usr/bin:/bin"), "HOME=" .. (os.getenv("HOME") or "/root") }
  for k, v in pairs(env) do full[#full + 1] = k .. "=" .. v end
  return helper.run_host(argv, { cwd = cwd, env = full, ms = ms })
end

describe("recipes/code-interpreter.lua", function()
  local d

  setup(function()
    d = helper.start_daemon(nil, { pool = 0 })
  end)
  teardown(function()
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  local function sandboxes()
    local code, out, err = helper.cli({ "--socket", d.socket, "ls", "--json" })
    assert.are.equal(0, code, err)
    return json.decode(out)
  end

  it("builds an image with Jupyter's kernel, numpy, pandas and matplotlib, and the driver", function()
    local saved = helper.TIMEOUT_MS
    helper.TIMEOUT_MS = 3600 * 1000 -- the first build downloads and installs
    local t0 = helper.now()
    local code, out, err = helper.cli({ "--socket", d.socket, "run", "--recipe", "code-interpreter", "--", "python3", "-c",
      "import ipykernel, jupyter_client, numpy, pandas, matplotlib, os; "
      .. "print(os.getuid(), os.path.isfile('/usr/local/lib/tupper/interp.py'))" })
    helper.TIMEOUT_MS = saved
    assert.are.equal(0, code, err)
    assert.are.equal("1000 True\n", out)
    io.stderr:write(("code-interpreter: first run (build included) %.0f s\n"):format((helper.now() - t0) / 1000))
    -- the driver is valid Python (the recipe carries it as a Lua string)
    code, out, err = helper.cli({ "--socket", d.socket, "run", "--recipe", "code-interpreter", "--", "python3", "-c",
      "import ast; ast.parse(open('/usr/local/lib/tupper/interp.py').read())" })
    assert.are.equal(0, code, out .. err)
  end)

  it("passes the TypeScript SDK's code interpreter tests", function()
    local dir = root .. "/sdk/js"
    assert(uv.fs_stat(dir .. "/dist/code-interpreter.js"), "sdk/js is not built: npm ci && npm run build in sdk/js")
    local code, text = run({ "node", "--test", "test/code-interpreter.test.mjs" }, dir,
      { TUPPER_CODE_SOCKET = d.socket, TUPPER_BIN = helper.BIN, TMPDIR = os.getenv("TMPDIR") or "/tmp" }, 20 * 60 * 1000)
    assert.are.equal(0, code, text:sub(-6000))
    assert.matches("# fail 0", text)
    assert.matches("# skipped 0", text)
  end)

  it("passes the Python SDK's code interpreter tests", function()
    local code, text = run({ "/usr/bin/python3", "-m", "pytest", "-q", "-p", "no:cacheprovider",
      "sdk/python/tests/test_code_interpreter.py" }, root,
      { TUPPER_CODE_SOCKET = d.socket, TUPPER_BIN = helper.BIN, PYTHONDONTWRITEBYTECODE = "1",
        TMPDIR = os.getenv("TMPDIR") or "/tmp" }, 20 * 60 * 1000)
    assert.are.equal(0, code, text:sub(-6000))
    assert.matches("passed", text)
    assert.not_matches("skipped", text)
  end)

  it("left no sandbox behind", function()
    assert.are.same({}, sandboxes())
  end)
end)
