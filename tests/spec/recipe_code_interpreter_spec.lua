-- The shipped code-interpreter recipe without building it (that is
-- tests/slow/code_interpreter_spec.lua): it loads in the recipe VM, asks
-- Debian for Jupyter's kernel machinery and the data packages, runs as
-- `user`, and carries the driver, which is valid Python that speaks the
-- protocol's first line (ready) and refuses bad requests without any
-- kernel: what the SDKs rely on.
local uv = require("luv")
local helper = require("helper")
local json = require("tupper.util.json")

describe("recipes/code-interpreter.lua", function()
  local recipe = require("tupper.recipe.file")
  local r = assert(recipe.load_embedded("code-interpreter"))

  it("is a Debian image with the kernel, numpy, pandas and matplotlib, as user", function()
    assert.are.equal("bookworm", r.image.debian)
    for _, p in ipairs({ "python3", "python3-ipykernel", "python3-jupyter-client", "python3-numpy", "python3-pandas",
                         "python3-matplotlib" }) do
      local found = false
      for _, q in ipairs(r.image.packages) do found = found or q == p end
      assert.is_true(found, p)
    end
    assert.are.equal("user", r.user)
    assert.are.equal("/home/user", r.workdir)
  end)

  it("carries a driver that starts, says ready, and refuses bad requests", function()
    local driver = r.files["/usr/local/lib/tupper/interp.py"]
    assert.is_string(driver)
    local dir = helper.tmpdir()
    local path = dir .. "/interp.py"
    local f = assert(io.open(path, "wb"))
    f:write(driver)
    f:close()
    -- the host's python3 without jupyter_client: nothing here needs a kernel
    local requests = table.concat({
      "not json",
      json.encode({ id = 1, op = "nope" }),
      json.encode({ id = 2, op = "execute", code = 42 }),
      json.encode({ id = 3, op = "execute", code = "1", language = "cobol" }),
      json.encode({ id = 4, op = "execute", code = ("x"):rep((1 << 20) + 1) }),
      json.encode({ id = 5, op = "remove_context", context = "gone" }),
      json.encode({ id = 6, op = "execute", code = "1", envs = { ["A=B"] = "x" } }),
      json.encode({ id = 7, op = "list_contexts" }),
      ("y"):rep((2 << 20) + 10),
      json.encode({ id = 8, op = "restart_context", context = "" }),
    }, "\n") .. "\n"
    local out = {}
    local stdin, stdout = uv.new_pipe(false), uv.new_pipe(false)
    local code
    local h = assert(uv.spawn("python3", { args = { path }, stdio = { stdin, stdout, 2 } },
      function(c) code = c end))
    stdout:read_start(function(_, chunk) if chunk then out[#out + 1] = chunk end end)
    stdin:write(requests)
    stdin:shutdown(function() stdin:close() end)
    local deadline = helper.now() + 20000
    while code == nil and helper.now() < deadline do uv.run("once") end
    h:close()
    stdout:close()
    uv.run("nowait")
    helper.rmrf(dir)
    assert.are.equal(0, code)
    local events = {}
    for line in table.concat(out):gmatch("[^\n]+") do events[#events + 1] = json.decode(line) end
    assert.are.equal("ready", events[1].type)
    local by = {}
    local anon = {}
    for i = 2, #events do
      local e = events[i]
      if type(e.id) == "number" then by[e.id] = e else anon[#anon + 1] = e end
    end
    -- "not json" and the over-long line: answered with no id
    assert.are.equal(2, #anon)
    assert.matches("not JSON", anon[1].message)
    assert.matches("at most 2097152 bytes", anon[2].message)
    assert.matches("unknown op", by[1].message)
    assert.matches("code must be a string", by[2].message)
    assert.matches("not supported", by[3].message)
    assert.matches("at most 1048576 bytes", by[4].message)
    assert.are.equal("not_found", by[5].kind)
    assert.are.equal("invalid", by[6].kind)
    assert.are.equal("reply", by[7].type)
    assert.are.same({}, by[7].value)
    assert.are.equal("invalid", by[8].kind)
    for _, i in ipairs({ 1, 2, 3, 4, 6, 8 }) do assert.are.equal("invalid", by[i].kind, i) end
  end)
end)
