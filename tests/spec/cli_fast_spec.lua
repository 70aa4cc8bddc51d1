-- The C client of exec and run (runtime/client, docs/cli.md "The C
-- client"): for each command line it takes, the same output, errors and
-- exit code as the Lua CLI (TUPPER_CLIENT=c against TUPPER_CLIENT=lua, on
-- one real daemon); each command line it leaves to the Lua CLI is left
-- (TUPPER_CLIENT=c refuses it) and runs as before.
local uv = require("luv")
local helper = require("helper")

local function write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

describe("the C client of exec and run", function()
  local d, dir, id

  -- Runs the CLI with TUPPER_CLIENT=which (nil: unset); stdin from a file
  -- path (opts.stdin_file), a pipe with opts.stdin, else /dev/null; the
  -- command's stdout into a pipe.  Returns code, stdout, stderr.
  local function cli(args, which, opts)
    opts = opts or {}
    local env = { "TUPPER_SOCKET=" .. d.socket, "PATH=" .. os.getenv("PATH"), "HOME=" .. dir }
    if which then env[#env + 1] = "TUPPER_CLIENT=" .. which end
    for _, e in ipairs(opts.env or {}) do env[#env + 1] = e end
    if opts.stdin then return helper.cli(args, { env = env, stdin = opts.stdin, cwd = opts.cwd }) end
    local fd = assert(uv.fs_open(opts.stdin_file or "/dev/null", "r", 0))
    local out, err = {}, {}
    local stdout, stderr = uv.new_pipe(false), uv.new_pipe(false)
    local code
    local h = assert(uv.spawn(helper.BIN, { args = args, env = env, cwd = opts.cwd, stdio = { fd, stdout, stderr } },
      function(c, sig) code = sig ~= 0 and 128 + sig or c end))
    uv.fs_close(fd)
    local open = 2
    local function reader(t) return function(_, chunk) if chunk then t[#t + 1] = chunk else open = open - 1 end end end
    stdout:read_start(reader(out))
    stderr:read_start(reader(err))
    local deadline = helper.now() + helper.TIMEOUT_MS
    local guard = uv.new_timer()
    guard:start(100, 100, function() end)
    while (code == nil or open > 0) and helper.now() < deadline do uv.run("once") end
    guard:close()
    if code == nil then uv.process_kill(h, "sigkill") end
    h:close()
    stdout:close()
    stderr:close()
    uv.run("nowait")
    assert(code, "tupper " .. table.concat(args, " ") .. " timed out")
    return code, table.concat(out), table.concat(err)
  end

  -- The same results both ways; the C client's are returned.
  local function same(args, opts)
    local code_c, out_c, err_c = cli(args, "c", opts)
    local code_l, out_l, err_l = cli(args, "lua", opts)
    local what = table.concat(args, " ")
    assert.are.equal(code_l, code_c, what .. ": exit code\nC: " .. err_c .. "\nLua: " .. err_l)
    assert.are.equal(out_l, out_c, what .. ": stdout")
    assert.are.equal(err_l, err_c, what .. ": stderr")
    return code_c, out_c, err_c
  end

  setup(function()
    dir = helper.tmpdir()
    d = helper.start_daemon(dir)
    local code, out, err = cli({ "create", "--timeout", "0" })
    assert(code == 0, err)
    id = out:match("%S+")
  end)

  teardown(function() helper.release(d) end)

  it("gives exec's output and exit code as the Lua CLI does", function()
    local code, out = same({ "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3" })
    assert.are.equal(3, code)
    assert.are.equal("out\n", out)
    same({ "exec", id, "true" })
    same({ "exec", "--", id, "echo", "--", "-x", "a\"b\\c", "é\t" })
    -- what JSON must escape, in argv and in env, arrives as it was given
    local odd = "q\"b\\s/\1\31\127\n\r\té\u{10FFFF}"
    code, out = same({ "exec", "-e", "V=" .. odd, "-e", odd:gsub("[^%w]", "") .. "=k", id, "--",
      "sh", "-c", "printf '%s|' \"$@\" \"$V\"; env | grep '=k$'", "sh", odd, "" })
    assert.are.equal(0, code)
    assert.are.equal(odd .. "||" .. odd .. "|qbs=k\n", out)
    code, out = same({ "exec", "-e", "A=1", "-eB=2", "--env", "A=3", "--env=C=", "-w", "/tmp", id, "--",
      "sh", "-c", "echo $A$B$C; pwd" })
    assert.are.equal("32\n/tmp\n", out)
    code = same({ "exec", "--workdir=/nonexistent", id, "pwd" })
    assert.are_not.equal(0, code)
    -- a big output goes through the pump with credit, in order
    code, out = same({ "exec", id, "sh", "-c", "seq 1 200000" })
    assert.are.equal(0, code)
    assert.are.equal(1288895, #out)
  end)

  it("gives the errors and their exit codes as the Lua CLI does", function()
    local code, _, err = same({ "exec", id, "--", "nosuchcommand" })
    assert.are.equal(127, code)
    assert.truthy(err:find("nosuchcommand", 1, true))
    code = same({ "exec", id, "--", "/etc/passwd" })
    assert.are.equal(126, code)
    code, _, err = same({ "exec", "nosuchbox", "--", "true" })
    assert.are.equal(125, code)
    assert.truthy(err:find("nosuchbox", 1, true))
    code = same({ "exec", id, "--", "sh", "-c", "kill -9 $$" })
    assert.are.equal(137, code)
  end)

  it("passes stdin from a pipe with -i, within the stream's credit", function()
    local data = {}
    for i = 1, 300000 do data[#data + 1] = ("line %d\n"):format(i) end
    data = table.concat(data)
    local code, out = same({ "exec", "-i", id, "--", "wc", "-c" }, { stdin = data })
    assert.are.equal(0, code)
    assert.are.equal(#data .. "\n", out)
    -- a process that does not read it ends all the same (what it left
    -- fits in the pipe: this test's writer must not meet an EPIPE)
    code = same({ "exec", "-i", id, "--", "true" }, { stdin = data:sub(1, 4096) })
    assert.are.equal(0, code)
  end)

  it("passes stdin from a regular file with -i", function()
    local path = dir .. "/input"
    local data = {}
    for i = 1, 50000 do data[#data + 1] = ("line %d\n"):format(i) end
    write(path, table.concat(data))
    local code, out = same({ "exec", "-i", id, "--", "md5sum" }, { stdin_file = path })
    assert.are.equal(0, code)
    local p = io.popen("md5sum < " .. path)
    assert.are.equal(p:read("a"), out)
    p:close()
    -- without -i the process reads /dev/null, whatever our stdin is
    code, out = same({ "exec", id, "--", "wc", "-c" }, { stdin_file = path })
    assert.are.equal("0\n", out)
  end)

  it("ends as a SIGPIPE would when its reader goes (141), and the box lives on", function()
    for _, which in ipairs({ "c", "lua" }) do
      local p = io.popen(("bash -c 'TUPPER_SOCKET=%s TUPPER_CLIENT=%s %s exec %s -- sh -c \"yes | head -c 50000000\" | head -c 2; " ..
        "echo \" ${PIPESTATUS[0]}\"'"):format(d.socket, which, helper.BIN, id))
      local out = p:read("a")
      p:close()
      assert.are.equal("y\n 141\n", out, which)
      assert.are.equal(0, (cli({ "exec", id, "true" }, which)))
    end
  end)

  it("forwards SIGTERM to the process, as the Lua CLI does", function()
    for _, which in ipairs({ "c", "lua" }) do
      local env = { "TUPPER_SOCKET=" .. d.socket, "PATH=" .. os.getenv("PATH"), "TUPPER_CLIENT=" .. which }
      local stdout, stderr = uv.new_pipe(false), uv.new_pipe(false)
      local code, got = nil, {}
      local h = assert(uv.spawn(helper.BIN, { args = { "exec", id, "--", "sh", "-c",
        "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.05; done" }, env = env,
        stdio = { nil, stdout, stderr } }, function(c) code = c end))
      stdout:read_start(function(_, chunk) if chunk then got[#got + 1] = chunk end end)
      stderr:read_start(function() end) -- the shell's word on its killed sleep
      local sent = false
      local deadline = helper.now() + helper.TIMEOUT_MS
      local guard = uv.new_timer()
      guard:start(20, 20, function() end)
      while code == nil and helper.now() < deadline do
        uv.run("once")
        if not sent and table.concat(got):find("ready") then
          uv.process_kill(h, "sigterm")
          sent = true
        end
      end
      guard:close()
      h:close()
      stdout:close()
      stderr:close()
      uv.run("nowait")
      assert.are.equal(7, code, which)
      assert.are.equal("ready\nterm\n", table.concat(got), which)
    end
  end)

  it("runs run's command in a new box that goes with it, as the Lua CLI does", function()
    local code, out = same({ "run", "--", "sh", "-c", "echo $X; hostname | wc -c; exit 4" },
      { env = { "X=not-passed" } })
    assert.are.equal(4, code)
    assert.are.equal("\n13\n", out)
    code, out = same({ "run", "--rm", "--image", "default", "-e", "X=y", "-w", "/tmp", "sh", "-c", "echo $X; pwd" })
    assert.are.equal("y\n/tmp\n", out)
    -- the limits: a timeout ends the box; a memory limit is the box's
    code = same({ "run", "--timeout", "1", "--", "sleep", "10" })
    assert.are.equal(125, code)
    local err
    code, _, err = same({ "run", "--memory", "32M", "--", "tail", "/dev/zero" })
    assert.are.equal(137, code)
    assert.truthy(err:find("out of memory", 1, true), err)
    code, out = same({ "run", "--memory", "64M", "--cpus", "0.5", "--disk", "1G", "--timeout", "1m", "--", "echo", "ok" })
    assert.are.equal("ok\n", out)
    code = same({ "run", "--no-policy", "nosuchcommand" })
    assert.are.equal(127, code)
    code = same({ "run", "--image", "NOT A REFERENCE", "--", "true" })
    assert.are.equal(125, code)
    -- the boxes went (their kill is a notification: the daemon may still
    -- be at it when the client has gone): only the exec box is left
    local ls
    local deadline = helper.now() + 10000
    repeat
      ls = select(2, cli({ "ls", "-q" }))
    until ls == id .. "\n" or helper.now() > deadline
    assert.are.equal(id .. "\n", ls)
  end)

  it("leaves every other command line to the Lua CLI, which runs it as before", function()
    local path = dir .. "/input"
    write(path, "abc")
    local cases = {
      { args = { "exec", id } },                                          -- no command
      { args = { "exec", "--help" } },
      { args = { "exec", "-x", id, "true" } },                            -- an unknown option
      { args = { "exec", "-e", "NOEQUALS", id, "true" } },
      { args = { "exec", id, "echo", "a\255b" } },                          -- not UTF-8: lua-cjson
      { args = { "exec", "-e", "A=\195", id, "true" } },                  -- sends it as it is
      { args = { "--socket", d.socket, "exec", "-t", id, "true" } },       -- a terminal asked for
      { args = { "run", "--cpus", "1e0", "--", "echo", "x" } },            -- a spelling of its own
      { args = { "run", "--memory", "99999T", "--", "true" } },            -- refused by the parser
      { args = { "run", "--timeout", "1y", "--", "echo", "x" } },
      { args = { "run", "--", "echo", "policy" }, policy = true },         -- a tupper.lua here
      { args = { "--state-dir", dir .. "/s", "exec", id, "true" } },
      { args = { "ls" } },
    }
    for _, case in ipairs(cases) do
      local opts = { stdin = case.stdin }
      if case.policy then
        opts.cwd = dir .. "/withpolicy"
        uv.fs_mkdir(opts.cwd, 448)
        write(opts.cwd .. "/tupper.lua", "return {}\n")
      end
      local what = table.concat(case.args, " ")
      local code, _, err = cli(case.args, "c", opts)
      assert.are.equal(125, code, what)
      assert.truthy(err:find("TUPPER_CLIENT=c: the C client does not take this command line", 1, true), what .. ": " .. err)
      local code1, out1, err1 = cli(case.args, nil, opts)
      local code2, out2, err2 = cli(case.args, "lua", opts)
      if case.args[1] ~= "ls" then
        assert.are.same({ code2, out2, err2 }, { code1, out1, err1 }, what)
      end
    end
    -- a daemon that does not answer: the Lua CLI says so in its words
    local code, _, err = cli({ "--socket", dir .. "/nobody.sock", "exec", id, "true" }, "c")
    assert.are.equal(125, code)
    assert.truthy(err:find("TUPPER_CLIENT=c", 1, true))
    code, _, err = cli({ "--socket", dir .. "/nobody.sock", "exec", id, "true" })
    assert.are.equal(125, code)
    assert.truthy(err:find("no tupper daemon answers at " .. dir .. "/nobody.sock", 1, true), err)
  end)
  -- a closed stdout or stderr is a clear error, never an abort: the next fd
  -- opened must not take its number (libuv asserts when it closes one there)
  it("says when its stdout or stderr is closed, with either client", function()
    for _, which in ipairs({ "lua", "" }) do
      for _, redir in ipairs({ ">&-", "2>&-" }) do
        local line = ("TUPPER_SOCKET='%s' TUPPER_CLIENT=%s '%s' exec %s -- echo hi %s 2>/dev/null; echo \"rc=$?\""):format(
          d.socket, which, helper.BIN, id, redir)
        if redir == "2>&-" then
          line = ("TUPPER_SOCKET='%s' TUPPER_CLIENT=%s '%s' exec %s -- sh -c 'echo hi >&2' 2>&-; echo \"rc=$?\""):format(
            d.socket, which, helper.BIN, id)
        end
        local p = assert(io.popen(line))
        local out = p:read("a")
        p:close()
        assert.truthy(out:find("rc=125", 1, true), which .. " " .. redir .. ": " .. out)
      end
      local p = assert(io.popen(("TUPPER_SOCKET='%s' TUPPER_CLIENT=%s '%s' ls >&- 2>/dev/null; echo \"rc=$?\""):format(
        d.socket, which, helper.BIN)))
      local out = p:read("a")
      p:close()
      assert.is_nil(out:find("rc=134", 1, true), which .. " ls: " .. out)
    end
  end)
end)
