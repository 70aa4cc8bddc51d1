-- `tupper repl` against a real daemon: -e, a script file, and the
-- interactive prompt through a real pty (a private tmux server: its socket,
-- the history file and everything else stay in the spec's temp dir).
local uv = require("luv")
local helper = require("helper")

local function sh_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function has_tmux()
  return os.execute("command -v tmux >/dev/null 2>&1") == true
end

describe("tupper repl", function()
  local d

  setup(function()
    d = helper.start_daemon()
  end)

  teardown(function()
    if d then assert.are.equal(0, d.stop()) end
    helper.drain()
  end)

  local function repl(args, opts)
    local argv = { "--socket", d.socket, "repl" }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    return helper.cli(argv, opts)
  end

  it("prints what -e returns", function()
    local code, out, err = repl({ "-e", "return 1+1" })
    assert.are.equal(0, code, err)
    assert.are.equal("2\n", out)
    code, out = repl({ "-e", "x = { b = { 1, 'two' }, a = true }", "-e", "x", "-e", "'raw\\tstring'" })
    assert.are.equal(0, code)
    assert.are.equal('{ a = true, b = { 1, "two" } }\nraw\tstring\n', out)
  end)

  it("fails with the message on stderr and exit code 1", function()
    local code, out, err = repl({ "-e", "tupper.connect('abc')" })
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.are.equal("tupper: no sandbox 'abc'\n", err)
    code, _, err = repl({ "-e", "return (" })
    assert.are.equal(1, code)
    assert.truthy(err:match("<eof>"), err)
  end)

  it("runs a script file with arguments", function()
    local path = d.dir .. "/script.lua"
    local f = assert(io.open(path, "w"))
    f:write([[
local who = ...
local box = tupper.create{ envs = { WHO = who } }
local r = box:run("echo hello $WHO from $(hostname)")
assert(box:kill())
print(r.stdout == "hello " .. arg[1] .. " from " .. box.id .. "\n", r.stdout)
]])
    f:close()
    local code, out, err = repl({ path, "world" })
    assert.are.equal(0, code, err)
    assert.truthy(out:match("^true\thello world from %x+\n\n$"), out)
  end)

  describe("interactively", function()
    local dir, tmux

    local function run(cmd)
      local p = io.popen(tmux .. " " .. cmd .. " 2>&1")
      local text = p:read("a")
      local ok = p:close()
      return ok, text
    end

    local function screen()
      local _, text = run("capture-pane -p -S -200 -t repl")
      return text
    end

    -- waits until the screen matches pattern (tmux drops trailing blanks);
    -- returns the screen
    local function wait_for(pattern, timeout_ms)
      local deadline = helper.now() + (timeout_ms or 10000)
      local text
      repeat
        text = screen()
        if text:find(pattern) then return text end
        uv.sleep(30)
        uv.update_time()
      until helper.now() > deadline
      error(("the screen never showed %q:\n%s"):format(pattern, text), 2)
    end

    local prompts = 0
    local function count(text, pat)
      local n = 0
      for _ in text:gmatch(pat) do n = n + 1 end
      return n
    end
    -- types a line and waits for the next prompt
    local function line(text, prompt)
      run("send-keys -t repl -l " .. sh_quote(text))
      run("send-keys -t repl Enter")
      prompts = prompts + 1
      local pat = prompt or "tupper>"
      local deadline = helper.now() + 20000
      repeat
        local s = screen()
        if count(s, "tupper>") + count(s, "%.%.>") > prompts then return s end
        uv.sleep(30)
        uv.update_time()
      until helper.now() > deadline
      error("no prompt after " .. text .. " (" .. pat .. "):\n" .. screen())
    end

    setup(function()
      if not has_tmux() then return end
      dir = d.dir .. "/pty"
      assert(uv.fs_mkdir(dir, 448))
      tmux = "env -u TMUX TERM=xterm tmux -S " .. sh_quote(dir .. "/tmux.sock") .. " -f /dev/null"
      local cmd = ("env HOME=%s %s --socket %s repl"):format(sh_quote(dir), sh_quote(helper.BIN), sh_quote(d.socket))
      assert(run("new-session -d -s repl -x 150 -y 60 " .. sh_quote(cmd)))
    end)

    teardown(function()
      if tmux then run("kill-server") end
    end)

    it("creates a box, runs commands, completes names, and ^C and ^D work", function()
      if not tmux then return pending("tmux is not installed (bootstrap.sh test)") end
      wait_for("tupper>")
      line("box = tupper.create{}")
      local s = line("box:run('hostname').stdout == box.id .. '\\n'")
      assert.truthy(s:find("\ntrue\n"), s)
      s = line("box:run('echo hello-from-box').stdout")
      assert.truthy(s:find("\nhello%-from%-box\n"), s)
      -- a multi-line function definition
      line("function double(x)")
      line("  return x * 2")
      line("end")
      s = line("double(21)")
      assert.truthy(s:find("%.%.> end\ntupper> double%(21%)\n42\n"), s)
      -- completion of a method, then ^C at the prompt clears the line
      run("send-keys -t repl -l 'box:ru'")
      run("send-keys -t repl Tab")
      wait_for("tupper> box:run\n")
      run("send-keys -t repl C-c")
      prompts = prompts + 1
      wait_for("box:run%^C\ntupper>")
      s = line("1 + 2")
      assert.truthy(s:find("tupper> 1 %+ 2\n3\n"), s)
      -- ^C during a long call: back at the prompt, the command gone
      local t0 = helper.now()
      run("send-keys -t repl -l 'box:run(\"sleep 30\")'")
      run("send-keys -t repl Enter")
      uv.sleep(300)
      run("send-keys -t repl C-c")
      prompts = prompts + 1
      wait_for("\ninterrupted\ntupper>", 15000)
      uv.update_time()
      assert.truthy(helper.now() - t0 < 15000) -- not the sleep's 30 s
      s = line("#box.commands:list()")
      assert.truthy(s:find("\n0\n"), s)
      s = line("box:kill()")
      assert.truthy(s:find("tupper> box:kill%(%)\ntrue\n"), s)
      -- ^D leaves: the session ends and with it the tmux server
      run("send-keys -t repl C-d")
      local deadline = helper.now() + helper.WAIT_MS
      while run("has-session -t repl") and helper.now() < deadline do
        uv.sleep(30)
        uv.update_time()
      end
      assert.is_falsy((run("has-session -t repl")))
      -- the history, bounded and private, in the temp HOME
      local hist = assert(helper.read_file(dir .. "/.tupper_history"))
      assert.truthy(hist:find("box:kill()", 1, true))
      assert.are.equal(384, uv.fs_stat(dir .. "/.tupper_history").mode & 511)
    end)
  end)
end)
