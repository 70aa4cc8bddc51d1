-- Unit specs of the pure-Lua parts: JSON, schema validation, line framing.
local json = require("tupper.util.json")
local schema = require("tupper.wire.schema")
local helper = require("helper")

describe("json", function()
  it("encodes empty arrays as [] and integers below 10^14 exactly", function()
    local s = json.encode({ a = json.array({}), n = 99999999999999 })
    assert.truthy(s:find('"a":[]', 1, true))
    assert.truthy(s:find("99999999999999", 1, true))
  end)
  it("reports bad input instead of raising", function()
    local v, err = json.decode("{nope")
    assert.is_nil(v)
    assert.truthy(err)
  end)
  it("pretty-prints with sorted keys", function()
    assert.are.equal('{\n  "a": 1,\n  "b": [\n    true\n  ]\n}', json.pretty({ b = { true }, a = 1 }))
  end)
end)

describe("schema.validate", function()
  it("accepts good params and normalises integers", function()
    local p = assert(schema.validate("fs.read", { sandbox = "abc123", path = "/x", offset = 3.0 }))
    assert.are.equal(3, p.offset)
    assert.are.equal("integer", math.type(p.offset))
  end)
  it("refuses unknown, missing and mistyped params", function()
    assert.is_nil((schema.validate("fs.read", { sandbox = "abc", path = "/x", bogus = 1 })))
    assert.is_nil((schema.validate("fs.read", { sandbox = "abc" })))
    assert.is_nil((schema.validate("fs.read", { sandbox = "abc", path = 7 })))
    assert.is_nil((schema.validate("fs.read", { sandbox = "ABC/..", path = "/x" })))
    assert.is_nil((schema.validate("fs.read", { sandbox = "abc", path = "/x", offset = 1.5 })))
    assert.is_nil((schema.validate("fs.read", { sandbox = "abc", path = "/x", length = 2 ^ 21 })))
    assert.is_nil((schema.validate("fs.read", { sandbox = "abc", path = "/x\0y" })))
    assert.is_nil((schema.validate("sandbox.list", "nope")))
  end)
  it("wants exactly one of argv and cmd", function()
    assert.is_nil((schema.validate("process.start", { sandbox = "a" })))
    assert.is_nil((schema.validate("process.start", { sandbox = "a", cmd = "x", argv = { "x" } })))
    assert.truthy(schema.validate("process.start", { sandbox = "a", cmd = "x" }))
    assert.is_nil((schema.validate("process.start", { sandbox = "a", argv = {} })))
    assert.is_nil((schema.validate("process.start", { sandbox = "a", argv = { "a", n = 3 } })))
    assert.is_nil((schema.validate("process.start", { sandbox = "a", argv = { 1 } })))
  end)
  it("names the rule an env or metadata map broke", function()
    local function err_of(field, map)
      local p, e = schema.validate("sandbox.create", { [field] = map })
      assert.is_nil(p)
      return e
    end
    for _, field in ipairs({ "env", "metadata" }) do
      assert.are.equal(("'%s': name '%s...' is longer than 1024 bytes"):format(field, string.rep("k", 64)),
        err_of(field, { [string.rep("k", 1025)] = "v" }))
      assert.are.equal(("'%s.K' is longer than 31744 bytes"):format(field), err_of(field, { K = string.rep("v", 31745) }))
      local many = {}
      for i = 1, 1025 do many["K" .. i] = "v" end
      assert.are.equal(("'%s' has more than 1024 entries"):format(field), err_of(field, many))
      local big = {}
      for i = 1, 9 do big["K" .. i] = string.rep("v", 30000) end
      assert.are.equal(("'%s' is over 262144 bytes in all (names and values)"):format(field), err_of(field, big))
      assert.are.equal(("'%s': name 'A=B' must not contain '='"):format(field), err_of(field, { ["A=B"] = "c" }))
      assert.are.equal(("'%s': a name must not contain a NUL byte"):format(field), err_of(field, { ["A\0"] = "c" }))
      assert.are.equal(("'%s.A' must not contain a NUL byte"):format(field), err_of(field, { A = "c\0" }))
      assert.are.equal(("'%s.A' must be a string"):format(field), err_of(field, { A = 1 }))
      assert.are.equal(("'%s': a name must not be empty"):format(field), err_of(field, { [""] = "c" }))
      assert.are.equal(("'%s' must be an object of strings"):format(field), err_of(field, "x"))
      -- at the limits exactly: accepted
      local edge = {}
      for i = 1, 8 do edge[("K%d"):format(i)] = string.rep("v", 31744) end
      edge[string.rep("k", 1024)] = "v"
      assert.truthy(schema.validate("sandbox.create", { [field] = edge }))
    end
  end)
  it("checks env maps and signals", function()
    assert.is_nil((schema.validate("process.start", { sandbox = "a", cmd = "x", env = { ["A=B"] = "c" } })))
    assert.is_nil((schema.validate("process.start", { sandbox = "a", cmd = "x", env = { A = 1 } })))
    local p = assert(schema.validate("process.signal", { sandbox = "a", pid = 3, signal = "SIGTERM" }))
    assert.are.equal(15, p.signal)
    assert.is_nil((schema.validate("process.signal", { sandbox = "a", pid = 3, signal = "BOGUS" })))
    assert.is_nil((schema.validate("process.signal", { sandbox = "a", pid = 3, signal = 99 })))
  end)
end)

describe("the checked-in schema", function()
  teardown(function() helper.drain() end)

  it("is what the daemon exports", function()
    local code, out = helper.cli({ "schema" })
    assert.are.equal(0, code)
    local file = assert(helper.read_file(helper.ROOT .. "/docs/protocol.schema.json"),
      "docs/protocol.schema.json is missing")
    assert.are.equal(file, out)
  end)
  it("is documented method by method in docs/protocol.md", function()
    local doc = assert(helper.read_file(helper.ROOT .. "/docs/protocol.md"))
    for name in pairs(schema.methods) do
      assert.truthy(doc:find("### `" .. name .. "`", 1, true), name .. " is not documented")
    end
    for name in pairs(schema.notifications) do
      assert.truthy(doc:find("### `" .. name .. "`", 1, true), name .. " is not documented")
    end
  end)
end)

describe("units", function()
  local units = require("tupper.util.units")
  it("parses sizes", function()
    assert.are.equal(256 * 1024 * 1024, units.size("256M"))
    assert.are.equal(1536 * 1024 * 1024, units.size("1.5G"))
    assert.are.equal(4096, units.size(4096))
    assert.are.equal(512 * 1024, units.size("512k"))
    assert.is_nil((units.size("12Q")))
    assert.is_nil((units.size("-1")))
    assert.is_nil((units.size(-5)))
    assert.is_nil((units.size("99999999T")))
    assert.is_nil((units.size({})))
  end)
  it("parses durations", function()
    assert.are.equal(600, units.duration("10m"))
    assert.are.equal(5400, units.duration("1h30m"))
    assert.are.equal(0.5, units.duration("500ms"))
    assert.are.equal(90, units.duration(90))
    assert.are.equal(30, units.duration("30"))
    assert.is_nil((units.duration("10x")))
    assert.is_nil((units.duration(-1)))
    assert.is_nil((units.duration("")))
    assert.is_nil((units.duration(0 / 0)))
  end)
  it("checks limits in the schema", function()
    local p = assert(schema.validate("sandbox.create", { limits = { memory = "64M", timeout = "2s" } }))
    assert.are.equal(64 * 1024 * 1024, p.limits.memory)
    assert.are.equal(2, p.limits.timeout)
    assert.is_nil((schema.validate("sandbox.create", { limits = { memory = "1k" } })))
    assert.is_nil((schema.validate("sandbox.create", { limits = { bogus = 1 } })))
    assert.is_nil((schema.validate("sandbox.create", { limits = { cpus = "lots" } })))
  end)
end)

describe("inputs the fuzzer found", function()
  it("refuses NaN and Infinity", function()
    assert.is_nil((json.decode('{"id":NaN}')))
    assert.is_nil((json.decode('{"id":Infinity}')))
  end)
  it("refuses NUL bytes in any string that is not data", function()
    assert.is_nil((schema.validate("process.start", { sandbox = "a", cmd = "echo\0hi" })))
    assert.is_nil((schema.validate("hello", { client = "a\0b" })))
    assert.truthy(schema.validate("fs.write", { sandbox = "a", path = "/f", data = "a\0b", encoding = "utf8" }))
  end)
  it("keeps strings within what the agent accepts", function()
    assert.is_nil((schema.validate("process.start", { sandbox = "a", argv = { string.rep("x", 40000) } })))
    assert.is_nil((schema.validate("process.start", { sandbox = "a", cmd = string.rep("x", 40000) })))
    assert.is_nil((schema.validate("process.start", { sandbox = "a", cmd = "x", env = { A = string.rep("x", 40000) } })))
  end)
end)

describe("deadlines", function()
  local uv = require("luv")
  local deadlines = require("tupper.util.deadlines")

  it("calls each entry at its own time on one timer, earliest first, a cancelled one never", function()
    local set = deadlines.new()
    local got, t0 = {}, helper.now()
    local function at(name) return function() got[#got + 1] = { name = name, ms = helper.now() - t0 } end end
    set:add(300, at("late"))
    local first = set.timer
    set:add(100, at("early")) -- sooner than the armed one: armed again
    local gone = set:add(200, at("cancelled"))
    set:cancel(gone)
    assert.are.equal(first, set.timer, "one timer for all")
    helper.sync(function()
      while #got < 2 do require("tupper.util.async").sleep(10) end
    end)
    assert.are.equal("early", got[1].name)
    assert.are.equal("late", got[2].name)
    assert.truthy(got[1].ms >= 90 and got[1].ms < 290, "early at " .. got[1].ms)
    assert.truthy(got[2].ms >= 290, "late at " .. got[2].ms)
    assert.is_nil(set.timer, "closed with nothing left")
    -- and made again for the next entry
    local again = false
    set:add(10, function() again = true end)
    helper.sync(function() while not again do require("tupper.util.async").sleep(5) end end)
    assert.is_true(again)
    local called = false
    set:cancel(set:add(10, function() called = true end))
    helper.sync(function() require("tupper.util.async").sleep(50) end)
    assert.is_false(called, "a cancelled entry was called")
    assert.is_nil(set.timer)
    uv.run("nowait")
  end)
end)

-- The caps' running totals (daemon/caps.lua) against a walk of the
-- tables they sum, after a random run of creates, replacements (a pause to
-- disk, a resume), kills and removals.
describe("the daemon's caps totals", function()
  local D = require("tupper.daemon.caps")
  local function daemon(caps)
    local d = setmetatable({ sandboxes = {}, creating = {}, dying = {}, caps = caps }, { __index = D })
    d:_caps_init()
    return d
  end
  local function sb(mem, dormant) return { limits = mem and { memory = mem } or nil, dormant = dormant } end

  it("equal a walk after a random run of creates, replacements, kills and removals", function()
    for seed = 1, 20 do
      math.randomseed(seed)
      local d, tokens = daemon({ sandboxes = 0, memory = 0 }), {}
      for _ = 1, 500 do
        local id = ("s%d"):format(math.random(40))
        local op, mem = math.random(7), ({ nil, 0, 4194304, 67108864, 1 << 33 })[math.random(5)]
        if op == 1 then -- a create starts
          local t = {}
          tokens[#tokens + 1] = t
          d:_creating_put(t, mem or 0)
        elseif op == 2 and #tokens > 0 then -- one ends
          d:_creating_put(table.remove(tokens, math.random(#tokens)), nil)
        elseif op == 3 then -- a sandbox made, or one that takes an id's place (pause, resume)
          d:_sb_put(id, sb(mem, math.random(4) == 1))
        elseif op == 4 and d.sandboxes[id] then -- a kill
          local s = d.sandboxes[id]
          d:_sb_put(id, nil)
          d:_dying_put(id, not s.dormant and s.limits and s.limits.memory or 0)
        elseif op == 5 then -- a removal ends (or none was under way)
          d:_dying_put(id, nil)
        elseif op == 6 then -- an id put to nothing twice
          d:_sb_put(id, nil)
        end
        local n, m = d:_caps_walk()
        assert.are.equal(n, d.cap_n)
        assert.are.equal(m, d.cap_mem)
      end
    end
  end)

  it("deny at the caps, and count a replaced sandbox out", function()
    local d = daemon({ sandboxes = 2, memory = 100 * 1048576 })
    d:_sb_put("a", sb(40 * 1048576))
    assert.is_true(d:_check_caps({ memory = 60 * 1048576 }))
    local ok, err, data = d:_check_caps({ memory = 61 * 1048576 })
    assert.is_nil(ok)
    assert.matches("memory limits would total 101M", err, 1, true)
    assert.are.equal("memory", data.cap)
    d:_creating_put("t", 0)
    ok, err = d:_check_caps({})
    assert.is_nil(ok)
    assert.matches("too many sandboxes (2 live)", err, 1, true)
    -- the create that resumes "a" takes its place
    assert.is_true(d:_check_caps({ memory = 100 * 1048576 }, "a"))
    d:_creating_put("t", nil)
    d:_sb_put("a", sb(40 * 1048576, true)) -- paused to disk: no memory committed
    assert.is_true(d:_check_caps({ memory = 100 * 1048576 }))
    assert.are.same({ 1, 0 }, { d:_caps_walk() })
  end)
end)

-- schema.validate runs each method's params compiled into closures
-- (wire/schema.lua); validate_interpreted is check alone, spec by spec, as
-- before.  Random hostile params, method by method: the same answer from
-- both, the same error message to the byte.
describe("schema.validate compiled", function()
  local hostile = { 0, -1, 1, 1.5, 0 / 0, 1 / 0, -1 / 0, 2 ^ 53, math.maxinteger, math.mininteger, "",
    "0", "unlimited", "abc", "ABC/..", "a\0b", "x=y", ("a"):rep(64), ("b"):rep(300), ("c"):rep(5000),
    ("d"):rep(40000), "64M", "-5M", "1.5G", "10s", "5m", "bogus", "kvm", "base64", "utf8", "KILL",
    "SIGTERM", "none", "all", "/", "/x", true, false, {}, { 1, 2 }, { "a", "b\0" }, { "true" },
    { a = "b" }, { [1] = "x", [3] = "y" }, { memory = "64M", cpus = 0.5 }, { memory = 1 },
    { bogus = 1 }, { source = "x", name = "y" }, { ["a=b"] = "c" }, { [""] = "x" }, { k = 1 },
    { allow = { "10.0.0.0/8" } }, { deny = { "bad rule" } }, { timeout = "nope" }, { pids = 0 },
    { disk = "unlimited" }, { cpus = 0 / 0 } }
  local function pick(t) return t[math.random(#t)] end
  it("gives the same answer as the interpreted check to random hostile params", function()
    local names = {}
    for name in pairs(schema.methods) do names[#names + 1] = name end
    table.sort(names)
    local compared, refused = 0, 0
    for seed = 1, 30 do
      math.randomseed(seed)
      for _, method in ipairs(names) do
        local keys = { "bogus", "required", "one_of", 1 }
        for k in pairs(schema.methods[method].params) do keys[#keys + 1] = k end
        table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
        for _ = 1, 10 do
          local p = {}
          for _ = 1, math.random(0, 4) do
            local k = pick(keys)
            if math.random(4) > 1 and k ~= 1 then p[k] = pick(hostile) end
          end
          if math.random(20) == 1 then p = pick({ "nope", 7, true }) end
          local a, aerr = schema.validate(method, p)
          local b, berr = schema.validate_interpreted(method, p)
          assert.are.same(b, a, method)
          assert.are.equal(berr, aerr, method)
          compared = compared + 1
          if aerr then refused = refused + 1 end
        end
      end
    end
    -- the run is hostile: most params are refused, and some are not
    assert.is_true(refused > compared / 2 and refused < compared, refused .. " of " .. compared)
    assert.are.same({ nil, "unknown method" }, { schema.validate("no.such", {}) })
  end)
end)

-- Every backend's box has the methods the daemon calls on any box
-- (backend/registry.lua's BOX_METHODS): core's box, which the linux backend
-- returns, and the microVM backend's wrapper around it.  A method missing
-- from one was once an internal error in every microVM create.  The
-- backends load in the tupper binary only (tupper.core): through its REPL.
describe("the box contract", function()
  it("holds for core's box and the microVM backend's", function()
    local code, out, err = helper.cli({ "repl", "-e", [[
      local registry = require("tupper.backend.registry")
      require("tupper.core")
      local mt = debug.getregistry()["tupper.box"]
      local calls = {}
      local inner = setmetatable({}, { __index = function(_, name)
        return function() calls[#calls + 1] = name; return name end
      end })
      local w = require("tupper.backend.microvm")._wrap(inner, 0, nil, nil)
      local missing = {}
      for _, name in ipairs(registry.BOX_METHODS) do
        if type(mt.__index[name]) ~= "function" then missing[#missing + 1] = "core:" .. name end
        if type(w[name]) ~= "function" then missing[#missing + 1] = "microvm:" .. name end
      end
      -- the plain ones reach the inner box
      print(#registry.BOX_METHODS, table.concat(missing, ","), w:resolv(), w:pid(), table.concat(calls, ","))
    ]] })
    assert.are.equal(0, code, err)
    assert.are.equal("10\t\tresolv\tpid\tresolv,pid\n", out)
  end)
end)
