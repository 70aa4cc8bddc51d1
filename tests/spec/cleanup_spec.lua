-- The suites' safety net (tests/spec/cleanup.lua, helper.cleanup_all): a
-- spec that fails half-way, its own cleanup never reached, leaves nothing
-- behind once its file has ended.  A child busted runs a small spec that
-- starts a daemon with a box, crashes a second daemon whose box keeps
-- running (left for a re-adopting daemon that never comes), starts a third
-- through the CLI's on-demand start, and then fails; afterwards no daemon,
-- agent, box process, cgroup or dir of that run may be left.
local uv = require("luv")
local helper = require("helper")

local ROOT = helper.ROOT

-- Runs argv with env (a "K=V" list); returns exit code, stdout, stderr.
local function run(argv, env, ms)
  local out, err = {}, {}
  local stdout, stderr = uv.new_pipe(false), uv.new_pipe(false)
  local code
  local handle, perr = uv.spawn(argv[1], { args = { table.unpack(argv, 2) }, env = env, cwd = ROOT,
    stdio = { nil, stdout, stderr } }, function(c, sig) code = sig ~= 0 and 128 + sig or c end)
  assert(handle, perr)
  local open = 2
  local function reader(t) return function(_, chunk)
    if chunk then t[#t + 1] = chunk else open = open - 1 end
  end end
  stdout:read_start(reader(out))
  stderr:read_start(reader(err))
  local deadline = helper.now() + ms
  local guard = uv.new_timer()
  guard:start(100, 100, function() end)
  while (code == nil or open > 0) and helper.now() < deadline do uv.run("once") end
  guard:close()
  if code == nil then uv.process_kill(handle, "sigkill") end
  handle:close()
  stdout:close()
  stderr:close()
  uv.run("nowait")
  return code, table.concat(out), table.concat(err)
end

local function sh(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  local s = p:read("a")
  p:close()
  return s
end

-- The processes whose command line holds s: "pid cmdline" lines.
local function procs_naming(s)
  local found = {}
  local scan = uv.fs_scandir("/proc")
  while true do
    local name = uv.fs_scandir_next(scan)
    if not name then break end
    if name:match("^%d+$") then
      local cmd = (helper.read_file("/proc/" .. name .. "/cmdline") or ""):gsub("%z", " ")
      if cmd:find(s, 1, true) then found[#found + 1] = name .. " " .. cmd end
    end
  end
  return table.concat(found, "\n")
end

-- what the child's test does before it fails: each line it records in
-- `facts` is "key value" (daemons' dirs, sockets, cgroup tags, box ids)
local CHILD = [[
local helper = require("helper")
local facts = assert(io.open(os.getenv("CLEANUP_FACTS"), "w"))
local function fact(k, v) facts:write(k, " ", v, "\n"); facts:flush() end

describe("a test that fails half-way", function()
  it("leaves its daemons and boxes to the net", function()
    local d = helper.start_daemon(nil, { pool = 0 })
    fact("dir", d.dir); fact("socket", d.socket); fact("tag", d.tag)
    local c = assert(d.connect())
    local id = assert(helper.call(c, "sandbox.create", {})).id
    assert(helper.call(c, "process.start", { sandbox = id, argv = { "sleep", "1000" } }))
    fact("box", id)

    local d2 = helper.start_daemon(nil, { pool = 0 })
    fact("dir", d2.dir); fact("socket", d2.socket); fact("tag", d2.tag)
    local c2 = assert(d2.connect())
    local id2 = assert(helper.call(c2, "sandbox.create", {})).id
    assert(helper.call(c2, "process.start", { sandbox = id2, argv = { "sleep", "1000" } }))
    fact("box", id2)
    c2:close()
    d2.crash() -- its box runs on, for a daemon that would re-adopt it

    local dir = helper.tmpdir()
    local env = { "TUPPER_SOCKET=" .. dir .. "/s.sock", "PATH=" .. os.getenv("PATH") }
    local code, out = helper.cli({ "--state-dir", dir .. "/state", "--autostart", "create" }, { env = env })
    assert.are.equal(0, code)
    fact("dir", dir); fact("socket", dir .. "/s.sock"); fact("tag", helper.cgroup_tag(dir .. "/state"))
    fact("box", out:match("%S+"))
    fact("failing", "now")

    assert.are.equal("what the test wanted", "what it got")
    c:close() -- never reached
    d.stop()
  end)
end)
]]

describe("the cleanup after each spec file", function()
  local dir

  before_each(function() dir = helper.tmpdir() end)
  after_each(function() helper.rmrf(dir) end)
  teardown(function() helper.drain() end)

  it("removes what a failed test left: daemons, crashed daemons' boxes, agents, cgroups, dirs", function()
    local spec = dir .. "/leaky_spec.lua"
    local f = assert(io.open(spec, "w"))
    f:write(CHILD)
    f:close()
    local env = {}
    for line in sh("env"):gmatch("[^\n]+") do
      if line:find("=", 1, true) and not line:match("^TMPDIR=") then env[#env + 1] = line end
    end
    env[#env + 1] = "TMPDIR=" .. dir
    env[#env + 1] = "CLEANUP_FACTS=" .. dir .. "/facts"
    local code, out, err = run({ "/usr/bin/lua5.4", "/usr/bin/busted", "--helper", ROOT .. "/tests/spec/cleanup.lua",
      "--lpath=" .. ROOT .. "/lua/?.lua;" .. ROOT .. "/tests/spec/?.lua", "-o", "utfTerminal", spec }, env, 60000)

    local facts = { dir = {}, socket = {}, tag = {}, box = {} }
    for k, v in (helper.read_file(dir .. "/facts") or ""):gmatch("(%S+) (%S+)") do
      facts[k] = facts[k] or {}
      table.insert(facts[k], v)
    end
    -- the child got as far as its failing assertion, failed there (no crash)
    assert.is_not_nil(facts.failing, "the child spec did not get to its failure: " .. out .. err)
    assert.are.equal(3, #facts.box)
    assert.are.equal(1, code, out .. err)
    assert.matches("0 successes / 1 failure / 0 errors", out)
    -- and said what it had to clean, on one line
    local line = err:match("cleanup after [^\n]*leaky_spec%.lua %(it leaked%)[^\n]*")
    assert.is_not_nil(line, err)
    assert.matches("stopped daemon", line)
    assert.matches("restarted and stopped daemon", line)
    assert.matches("started outside the helper", line)

    for _, socket in ipairs(facts.socket) do
      assert.are.equal("", procs_naming(socket), "a daemon on " .. socket .. " is left")
    end
    for _, id in ipairs(facts.box) do
      local n, pids = helper.box_pids(id)
      assert.are.equal(0, n, "box " .. id .. " has processes left: " .. pids)
    end
    for _, tag in ipairs(facts.tag) do
      assert.are.equal("", sh("find /sys/fs/cgroup -maxdepth 6 -type d -name '" .. tag .. "-*'"),
        "cgroups of tag " .. tag .. " are left")
    end
    for _, d in ipairs(facts.dir) do assert.is_nil(uv.fs_stat(d), d .. " is left") end
    -- nothing of the child's in its temp dir but what this test wrote
    assert.are.equal("facts\nleaky_spec.lua\n", sh("ls '" .. dir .. "'"))
  end)
end)
