-- The command line: the verb table's parser, every verb's --help, the
-- errors of bad options, the listings (ls, images, stats) against a real
-- daemon, the bash and zsh completions, the man pages, and tupper doctor.
local uv = require("luv")
local json = require("cjson")
local helper = require("helper")
local cli_table = require("tupper.client.cli_table")
local cli_args = require("tupper.client.cli_args")
local wclient = require("tupper.wire.client")

local BUILD = helper.BIN:match("^(.*)/[^/]*$") or "."

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return out, ok and 0 or code
end

local function have(prog)
  return select(2, sh("command -v " .. prog)) == 0
end

-- a daemonless env: a socket nobody listens on, in a dir of this test
local function no_daemon_env(dir)
  return { "TUPPER_SOCKET=" .. dir .. "/none.sock", "PATH=" .. os.getenv("PATH") }
end

-- zsh -f drive.zsh COMPFILE INPUT WANT: types INPUT and a TAB into an
-- interactive zsh on a pty with COMPFILE loaded; exit 0 when the line
-- shows WANT (escapes stripped) within 10 s
local ZSH_DRIVER = [==[
zmodload zsh/zpty
setopt extendedglob
zpty z zsh -f -i
zpty -w z "PS1='%% '; autoload -Uz compinit; compinit -u -D -d \$HOME/zcd; source $1; print READY"
local out="" chunk
local -i end=$(( SECONDS + 10 ))
while (( SECONDS < end )); do
  zpty -r -t z chunk && out+=$chunk
  [[ $out == *READY*READY* || $out == *$'\n'READY* ]] && break
  sleep 0.05
done
out=""
zpty -w -n z "$2"$'\t'
while (( SECONDS < end )); do
  zpty -r -t z chunk && out+=$chunk
  [[ ${out//$'\033'\[[0-9;?]#[a-zA-Z]/} == *"$3"* ]] && break
  sleep 0.05
done
zpty -d z
out=${out//$'\033'\[[0-9;?]#[a-zA-Z]/}
print -r -- "${(q)out}" >&2
[[ $out == *"$3"* ]]
]==]

describe("the verb table's parser", function()
  local function parse(verb, args)
    return cli_args.parse(cli_table.verb(verb), args)
  end

  it("bundles short flags and takes a value attached, after =, or as the next word", function()
    local p = assert(parse("exec", { "-it", "-eA=1", "-e", "B=2", "--env=C=3", "-w/tmp", "abc", "sh", "-c", "x" }))
    assert.is_true(p.opts.interactive)
    assert.is_true(p.opts.tty)
    assert.are.same({ A = "1", B = "2", C = "3" }, p.opts.env)
    assert.are.equal("/tmp", p.opts.workdir)
    assert.are.same({ "abc" }, p.args)
    assert.are.same({ "sh", "-c", "x" }, p.cmd)
    p = assert(parse("exec", { "-ti", "abc", "--", "-weird" }))
    assert.is_true(p.opts.interactive and p.opts.tty)
    assert.are.same({ "-weird" }, p.cmd)
    -- a bundle ends at the letter that takes a value
    p = assert(parse("run", { "-ieK=V", "--", "true" }))
    assert.are.same({ K = "V" }, p.opts.env)
    assert.is_true(p.opts.interactive)
  end)

  it("stops at the command: what follows is the command's own", function()
    local p = assert(parse("run", { "--memory", "1G", "sh", "-c", "--help", "--memory" }))
    assert.are.equal("1G", p.opts.memory)
    assert.are.same({ "sh", "-c", "--help", "--memory" }, p.cmd)
    assert.is_nil(p.help)
    p = assert(parse("run", { "--", "--help" }))
    assert.are.same({ "--help" }, p.cmd)
    p = assert(parse("repl", { "-e", "return 1", "-e", "return 2", "script.lua", "-e", "x" }))
    assert.are.same({ "return 1", "return 2" }, p.opts.eval)
    assert.are.same({ "script.lua", "-e", "x" }, p.cmd)
  end)

  it("takes options anywhere in verbs without a command", function()
    local p = assert(parse("logs", { "abc", "--network", "--json" }))
    assert.are.same({ "abc" }, p.args)
    assert.is_true(p.opts.network and p.opts.json)
    p = assert(parse("stats", { "a", "--json", "b" }))
    assert.are.same({ "a", "b" }, p.args)
    -- cp: -R is -r, and - (a tar stream) is an argument, not an option
    p = assert(parse("cp", { "-Ra", "-", "abc:/dir" }))
    assert.is_true(p.opts.recursive and p.opts.archive)
    assert.are.same({ "-", "abc:/dir" }, p.args)
  end)

  it("refuses what does not fit, saying what", function()
    local cases = {
      { "run", { "--bogus" }, "unknown option --bogus" },
      { "run", { "-x" }, "unknown option -x" },
      { "exec", { "-iz", "abc", "true" }, "unknown option -z (in -iz)" },
      { "run", { "--env" }, "option --env needs a value (K=V)" },
      { "run", { "-e", "novalue", "true" }, "--env wants K=V, got \"novalue\"" },
      { "run", { "--json=1" }, "unknown option --json" },
      { "ls", { "--json=1" }, "option --json takes no value" },
      { "run", { "--backend", "xen" }, "--backend wants linux or microvm, got \"xen\"" },
      { "run", { "--memory", "12Q" }, "--memory: bad size \"12Q\"" },
      { "run", { "--timeout", "forever" }, "--timeout: bad duration \"forever\"" },
      { "run", { "--cpus", "lots" }, "--cpus wants a number" },
      { "daemon", { "--pool", "65" }, "--pool wants a whole number in 0..64, got \"65\"" },
      { "daemon", { "--pool", "-1" }, "--pool wants a whole number in 0..64" },
      { "logs", { "--tail", "x", "abc" }, "--tail wants a whole number of at least 0" },
      { "kill", {}, "missing ID" },
      { "exec", { "abc" }, "missing CMD" },
      { "port", { "abc", "1", "2" }, "unexpected argument '2'" },
      { "create", { "extra" }, "unexpected argument 'extra'" },
      { "cp", { "a" }, "missing DST" },
    }
    for _, c in ipairs(cases) do
      local p, err = parse(c[1], c[2])
      assert.is_nil(p, c[1] .. " " .. table.concat(c[2], " "))
      assert.truthy(err:find(c[3], 1, true), ("%s: %q does not say %q"):format(c[1], err, c[3]))
    end
  end)

  it("turns a box's options into what the verbs send", function()
    local o = cli_args.box_opts(assert(parse("run", { "-i", "--allow", "a:1", "--allow", "b:2", "--no-policy",
      "--memory", "1G", "--timeout", "90", "cat" })))
    assert.is_true(o.interactive)
    assert.are.same({ allow = { "a:1", "b:2" } }, o.network)
    assert.is_false(o.policy)
    assert.are.same({ memory = "1G", timeout = 90 }, o.limits)
    assert.has_error(function() cli_args.box_opts(assert(parse("run", { "--network", "all", "--deny", "x:1" }))) end,
      "--allow/--deny and --network do not mix")
  end)

  it("has every daemon option the daemon's helpers add, each under its snake_case key", function()
    local v = cli_table.verb("daemon")
    local want = { "default-memory", "default-cpus", "default-pids", "default-disk", "default-timeout",
      "max-sandboxes", "max-memory", "max-clients", "max-requests", "max-streams", "max-queued", "idle-timeout", "accel", "socket", "state-dir", "log", "pool", "vm-pool", "policy",
      "max-layer", "uid-base" }
    for _, long in ipairs(want) do
      local p = assert(cli_args.parse(v, { "--" .. long, long == "accel" and "tcg" or "7" }))
      assert.are.equal(long == "accel" and "tcg" or (long:find("pool") or long == "uid-base") and 7 or "7",
        p.opts[(long:gsub("-", "_"))], long)
    end
  end)

  it("starts a daemon only when asked", function()
    assert.is_false(wclient.autostart({}))
    assert.is_true(wclient.autostart({ autostart = true }))
    assert.is_false(wclient.autostart({ autostart = false }))
    local msg = wclient.no_daemon("/x/y.sock", "ENOENT")
    assert.truthy(msg:find("no tupper daemon answers at /x/y.sock (ENOENT)", 1, true), msg)
    assert.truthy(msg:find("`tupper daemon --socket /x/y.sock &`", 1, true), msg)
    assert.truthy(msg:find("TUPPER_AUTOSTART=1", 1, true), msg)
  end)
end)

describe("tupper --help and VERB --help", function()
  local dir
  setup(function() dir = helper.tmpdir() end)
  teardown(function() helper.rmrf(dir) end)

  it("prints each verb's usage, options and examples, the same for tupper help VERB", function()
    for _, v in ipairs(cli_table.VERBS) do
      local argv = {}
      for w in v.name:gmatch("%S+") do argv[#argv + 1] = w end
      argv[#argv + 1] = "--help"
      local code, out, err = helper.cli(argv, { env = no_daemon_env(dir) })
      assert.are.equal(0, code, v.name .. ": " .. err)
      assert.are.equal("", err, v.name)
      assert.truthy(out:find("^usage: tupper " .. v.name:gsub("%-", "%%-")), v.name .. ": " .. out)
      for _, o in ipairs(v.options) do
        local shown = o.long and ("--" .. o.long) or ("-" .. o.short)
        assert.truthy(out:find(shown, 1, true), v.name .. " --help does not show " .. shown)
      end
      for _, e in ipairs(v.examples) do assert.truthy(out:find(e[1], 1, true), v.name .. ": " .. e[1]) end
      table.remove(argv)
      table.insert(argv, 1, "help")
      local code2, out2 = helper.cli(argv, { env = no_daemon_env(dir) })
      assert.are.equal(0, code2)
      assert.are.equal(out, out2, "tupper help " .. v.name)
    end
  end)

  it("gives an overview naming every verb; no verb at all is a usage error", function()
    local code, out = helper.cli({ "--help" })
    assert.are.equal(0, code)
    for _, name in ipairs(cli_table.top_names()) do
      assert.truthy(out:find("\n  " .. name .. " ", 1, true), name)
    end
    local code2, out2, err2 = helper.cli({})
    assert.are.equal(2, code2)
    assert.are.equal("", out2)
    assert.truthy(err2:find("^usage: tupper"))
    local code3, out3 = helper.cli({ "image" })
    assert.are.equal(2, code3)
    local code4, out4 = helper.cli({ "image", "--help" })
    assert.are.equal(0, code4)
    assert.truthy(out4:find("prune", 1, true) and out4:find("inspect", 1, true))
    assert.are.equal("", out3)
  end)

  it("answers a bad option of any verb with an error pointing at its --help, before any daemon", function()
    for _, v in ipairs(cli_table.VERBS) do
      local argv = {}
      for w in v.name:gmatch("%S+") do argv[#argv + 1] = w end
      argv[#argv + 1] = "--no-such-option"
      local code, out, err = helper.cli(argv, { env = no_daemon_env(dir) })
      assert.are.equal(125, code, v.name)
      assert.are.equal("", out, v.name)
      assert.are.equal(("tupper: %s: unknown option --no-such-option (see tupper %s --help)\n"):format(v.name, v.name),
        err)
    end
    local code, _, err = helper.cli({ "frobnicate" })
    assert.are.equal(125, code)
    assert.truthy(err:find("unknown command 'frobnicate' (see tupper --help)", 1, true), err)
    code, _, err = helper.cli({ "image", "frob" })
    assert.are.equal(125, code)
    assert.truthy(err:find("image: no command 'frob'", 1, true), err)
    code, _, err = helper.cli({ "--bogus", "ls" })
    assert.are.equal(125, code)
    assert.truthy(err:find("unknown option --bogus (see tupper --help)", 1, true), err)
    code, _, err = helper.cli({ "help", "nosuch" })
    assert.are.equal(125, code)
    assert.truthy(err:find("no command 'nosuch'", 1, true), err)
    -- the daemon's limits and caps, as daemon/limits.lua reads them, before it starts
    code, _, err = helper.cli({ "daemon", "--socket", dir .. "/d.sock", "--default-memory", "12Q" })
    assert.are.equal(125, code)
    assert.truthy(err:find("daemon: --default-memory: bad size \"12Q\"", 1, true), err)
    code, _, err = helper.cli({ "daemon", "--socket", dir .. "/d.sock", "--max-sandboxes", "-1" })
    assert.are.equal(125, code)
    assert.truthy(err:find("--max-sandboxes: wants a number from 0", 1, true), err)
    assert.falsy(uv.fs_stat(dir .. "/d.sock"))
    code, _, err = helper.cli({ "completion", "fish" })
    assert.are.equal(125, code)
    assert.truthy(err:find("want bash or zsh", 1, true), err)
    -- a hostile argument: long, with control bytes; a clean refusal
    code, _, err = helper.cli({ "run", "--" .. ("\27[2J"):rep(2000) })
    assert.are.equal(125, code)
    assert.truthy(err:find("unknown option", 1, true))
  end)
end)

describe("the CLI against a daemon", function()
  local d, env, id, dir
  local LONG = "registry.example.com/a-rather-long/path/to/some/image:tag-1234567890"

  local function cli(args, opts)
    opts = opts or {}
    opts.env = opts.env or env
    return helper.cli(args, opts)
  end

  setup(function()
    dir = helper.tmpdir()
    d = helper.start_daemon(dir .. "/d", { pool = 0 })
    env = { "TUPPER_SOCKET=" .. d.socket, "PATH=" .. os.getenv("PATH") }
    assert(helper.rmrf and true)
    os.execute("mkdir -p '" .. dir .. "/rootfs/etc' && echo x > '" .. dir .. "/rootfs/etc/x'")
    local code, _, err = cli({ "import", dir .. "/rootfs", LONG })
    assert.are.equal(0, code, err)
    local out
    code, out, err = cli({ "create", "--image", LONG, "--timeout", "10m" })
    assert.are.equal(0, code, err)
    id = out:match("^(%x+)\n$")
    assert(id, out)
  end)
  teardown(function()
    if d then d.stop() end
    helper.rmrf(dir)
    helper.drain()
  end)

  it("ls sizes its columns, shortens a long image unless --no-trunc, -q prints ids", function()
    local code, out = cli({ "ls" })
    assert.are.equal(0, code)
    local header, row = out:match("^([^\n]*)\n([^\n]*)\n$")
    assert.truthy(header and row, out)
    assert.truthy(header:find("^ID  +IMAGE  +STATE  +CREATED  +PROCESSES$"), header)
    assert.truthy(row:find(id, 1, true))
    assert.falsy(row:find(LONG, 1, true), "not shortened: " .. row)
    assert.truthy(row:find(LONG:sub(1, 20), 1, true) and row:find("\u{2026}", 1, true), row)
    -- the columns line up: IMAGE starts where the header says
    assert.are.equal(header:find("IMAGE", 1, true), row:find("registry", 1, true))
    code, out = cli({ "ls", "--no-trunc" })
    assert.truthy(out:find(LONG, 1, true), out)
    code, out = cli({ "ls", "-q" })
    assert.are.equal(id .. "\n", out)
  end)

  it("images sizes its columns too, and -q prints the references", function()
    local code, out = cli({ "images" })
    assert.are.equal(0, code)
    assert.falsy(out:find(LONG, 1, true), out)
    assert.truthy(out:find("sha256:%x+%s") and not out:find("sha256:" .. ("%x"):rep(20)), out)
    code, out = cli({ "images", "--no-trunc" })
    assert.truthy(out:find(LONG, 1, true) and out:find("sha256:" .. ("%x"):rep(64)), out)
    code, out = cli({ "images", "-q" })
    assert.truthy(out:find("^" .. LONG:gsub("%p", "%%%0") .. "\n") or out:find("\n" .. LONG:gsub("%p", "%%%0") .. "\n"), out)
    for line in out:gmatch("[^\n]+") do assert.falsy(line:find(" ", 1, true), line) end
  end)

  it("stats shows every box with no id, one table or one JSON array", function()
    local code2, out2 = cli({ "create", "--timeout", "10m" })
    assert.are.equal(0, code2)
    local id2 = out2:match("^(%x+)\n$")
    finally(function() cli({ "kill", id2 }) end)
    local code, out = cli({ "stats" })
    assert.are.equal(0, code)
    assert.truthy(out:find("^ID  +CPU  +MEMORY  +PEAK  +PIDS  +THROTTLED  +OOM KILLS\n"), out)
    assert.truthy(out:find("\n" .. id .. " ", 1, true) and out:find("\n" .. id2 .. " ", 1, true), out)
    code, out = cli({ "stats", "--json", "--no-stream" })
    assert.are.equal(0, code)
    local list = json.decode(out)
    local seen = {}
    for _, r in ipairs(list) do seen[r.id] = r end
    assert.truthy(seen[id] and seen[id2], out)
    assert.is_number(seen[id].memory_bytes)
    -- one id: its counters as before
    code, out = cli({ "stats", "--json", id })
    assert.are.equal(0, code)
    assert.is_nil(json.decode(out).id)
    assert.is_number(json.decode(out).pids)
    code, out = cli({ "stats", id, id2 })
    assert.are.equal(3, select(2, out:gsub("\n", "")), out)
    local code3, _, err3 = cli({ "stats", "nosuchbox" })
    assert.are.equal(125, code3)
    assert.truthy(err3:find("stats nosuchbox:", 1, true), err3)
  end)

  it("stats redraws its table on a terminal until interrupted, and prints once with --no-stream", function()
    -- script(1) gives it a pty; timeout ends it as ^C would
    local function on_tty(args, secs)
      return sh(("cd '%s' && TUPPER_SOCKET='%s' timeout -s INT %d script -qfc '%s %s' /dev/null"):format(dir,
        d.socket, secs, helper.BIN, args))
    end
    local out = on_tty("stats", 5)
    local frames = select(2, out:gsub("\27%[H\27%[2J", ""))
    assert.truthy(frames >= 2, "frames: " .. frames .. ": " .. out)
    assert.truthy(out:find(id, 1, true), out)
    out = on_tty("stats --no-stream", 5)
    assert.are.equal(0, select(2, out:gsub("\27%[H\27%[2J", "")), out)
    assert.truthy(out:find(id, 1, true), out)
  end)

  it("reaches a function for every verb that talks to the daemon", function()
    local ARGS = {
      run = { "--", "true" }, create = { "--timeout", "1m" }, exec = { "nosuchbox", "true" }, ls = {},
      cp = { dir .. "/nofile", "nosuchbox:/x" }, attach = { "nosuchbox", "1" }, kill = { "nosuchbox" }, pause = { "nosuchbox" },
      resume = { "nosuchbox" }, stats = { "nosuchbox" }, logs = { "--network", "nosuchbox" },
      port = { "nosuchbox", "80" }, pull = { "-q", "127.0.0.1:1/nosuch:1" }, import = { dir .. "/nofile" },
      images = {}, rmi = { "nosuch:1" }, ["image ls"] = {}, ["image inspect"] = { "nosuch:1" },
      ["image rm"] = { "nosuch:1" }, ["image import"] = { dir .. "/nofile" }, ["image prune"] = {},
      build = { dir .. "/nofile.lua" },
      ["volume create"] = { "--size", "1M", "nosuch" }, ["volume ls"] = {}, ["volume inspect"] = { "nosuch" },
      ["volume rm"] = { "nosuch" },
      snapshot = { "nosuchbox" }, ["snapshot ls"] = {}, ["snapshot rm"] = { "nosuch" }, fork = { "nosuchbox" },
    }
    for _, v in ipairs(cli_table.VERBS) do
      if v.daemon then
        local argv = {}
        for w in v.name:gmatch("%S+") do argv[#argv + 1] = w end
        assert.truthy(ARGS[v.name], "no case for " .. v.name)
        for _, a in ipairs(ARGS[v.name]) do argv[#argv + 1] = a end
        local code, out, err = cli(argv)
        assert.truthy(code == 0 or code == 125, v.name .. ": " .. code .. " " .. err)
        assert.falsy(err:find("attempt to", 1, true) or err:find("stack traceback", 1, true), v.name .. ": " .. err)
        if v.name == "create" then cli({ "kill", out:match("%x+") }) end
      end
    end
  end)

  describe("bash completion", function()
    local script

    setup(function()
      script = dir .. "/tupper.bash"
      local code, out = cli({ "completion", "bash" })
      assert.are.equal(0, code)
      local f = assert(io.open(script, "w"))
      f:write(out)
      f:close()
    end)

    -- COMPREPLY for the words (the last is the one completed)
    local function complete(words, cwd)
      local q = {}
      for _, w in ipairs(words) do q[#q + 1] = "'" .. w:gsub("'", "'\\''") .. "'" end
      local cmd = ("cd '%s' && TUPPER_SOCKET='%s' PATH='%s':\"$PATH\" bash --norc -c 'source \"$0\"; "
        .. "COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _tupper; printf \"%%s\\n\" \"${COMPREPLY[@]}\"' '%s' %s")
        :format(cwd or dir, d.socket, BUILD, script, table.concat(q, " "))
      local out, code = sh(cmd)
      assert.are.equal(0, code, out)
      local got = {}
      for line in out:gmatch("[^\n]+") do got[#got + 1] = line end
      table.sort(got)
      return got
    end

    it("passes bash -n", function()
      local out, code = sh("bash -n '" .. script .. "'")
      assert.are.equal(0, code, out)
    end)

    it("completes verbs, options, choices, ids, image names and files", function()
      assert.are.same({ "run" }, complete({ "tupper", "ru" }))
      assert.are.same({ "image", "images", "import" }, complete({ "tupper", "im" }))
      assert.are.same({ "--memory", "--metadata" }, complete({ "tupper", "run", "--me" }))
      assert.are.same({ "linux", "microvm" }, complete({ "tupper", "run", "--backend", "" }))
      assert.are.same({ "auto", "kvm", "tcg" }, complete({ "tupper", "daemon", "--accel", "" }))
      assert.are.same({ "import", "inspect" }, complete({ "tupper", "image", "i" }))
      assert.are.same({ "--all", "--help" }, complete({ "tupper", "image", "prune", "--" }))
      assert.are.same({ "bash", "zsh" }, complete({ "tupper", "completion", "" }))
      -- sandbox ids from the daemon that answers
      assert.are.same({ id }, complete({ "tupper", "kill", "" }))
      assert.are.same({ id }, complete({ "tupper", "exec", "-it", "" }))
      assert.are.same({ id }, complete({ "tupper", "--socket", d.socket, "stats", "" }))
      -- image names
      assert.are.same({ LONG }, complete({ "tupper", "image", "inspect", "reg" }))
      -- files where a file goes; ids with their colon for cp
      local fdir = dir .. "/files"
      os.execute("mkdir -p '" .. fdir .. "/sub' && touch '" .. fdir .. "/a.lua' '" .. fdir .. "/b.txt'")
      assert.are.same({ "a.lua", "b.txt", "sub" }, complete({ "tupper", "build", "" }, fdir))
      local want = { "a.lua", "b.txt", id .. ":", "sub" }
      table.sort(want)
      assert.are.same(want, complete({ "tupper", "cp", "" }, fdir))
      -- after the command, nothing of tupper's: its words are the command's
      assert.are.same({}, complete({ "tupper", "run", "--", "--me" }, fdir))
      assert.are.same({}, complete({ "tupper", "exec", id, "sh", "--me" }, fdir))
    end)

    it("offers no ids, and hangs not, when no daemon answers", function()
      local words = { "tupper", "--socket", dir .. "/none.sock", "kill", "" }
      local t0 = helper.now()
      assert.are.same({}, complete(words))
      assert.truthy(helper.now() - t0 < 5000)
    end)
  end)

  it("prints a zsh completion that zsh reads and registers", function()
    if not have("zsh") then
      pending("zsh is not installed (bootstrap.sh test installs it)")
      return
    end
    local code, out = cli({ "completion", "zsh" })
    assert.are.equal(0, code)
    local path = dir .. "/_tupper"
    local f = assert(io.open(path, "w"))
    f:write(out)
    f:close()
    local o, c = sh("zsh -n '" .. path .. "'")
    assert.are.equal(0, c, o)
    o, c = sh(("HOME='%s' zsh -f -c 'autoload -Uz compinit; compinit -u -D -d \"$HOME/zcd\"; source \"$0\"; "
      .. "print -r -- ${_comps[tupper]} ${+functions[_tupper_v_run]} ${+functions[_tupper_v_image_prune]}' '%s'")
      :format(dir, path))
    assert.are.equal(0, c, o)
    assert.are.equal("_tupper 1 1\n", o)
    -- and it completes: an interactive zsh on a pty (zsh/zpty) gets the
    -- words and a TAB, and the line must come back completed
    local drive = dir .. "/drive.zsh"
    f = assert(io.open(drive, "w"))
    f:write(ZSH_DRIVER)
    f:close()
    for _, t in ipairs({
      { "tupper ru", "tupper run " },
      { "tupper run --memo", "tupper run --memory " },
      { "tupper run --backend mi", "--backend microvm " },
      { "tupper image pr", "tupper image prune " },
      { "tupper completion z", "completion zsh " },
      { "tupper kill ", "tupper kill " .. id .. " " }, -- the one sandbox, from the daemon
    }) do
      o, c = sh(("HOME='%s' TUPPER_SOCKET='%s' PATH='%s':\"$PATH\" zsh -f '%s' '%s' '%s' '%s'"):format(dir, d.socket,
        BUILD, drive, path, t[1], t[2]))
      assert.are.equal(0, c, ("%q did not complete to %q: %s"):format(t[1], t[2], o))
    end
  end)
end)

describe("the man pages", function()
  local pages = { "tupper.1", "tupper-daemon.8", "tupper-recipe.5", "tupper-policy.5" }

  it("are built, render without a warning, and have a NAME section", function()
    assert.truthy(have("man") and have("lexgrog"), "man-db is not installed (bootstrap.sh test installs it)")
    for _, page in ipairs(pages) do
      local path = BUILD .. "/man/" .. page
      assert.truthy(uv.fs_stat(path), path .. " is not built (is scdoc installed? bootstrap.sh installs it)")
      local out, code = sh("MANWIDTH=80 man --warnings -l '" .. path .. "' 2>&1 >/dev/null")
      assert.are.equal(0, code)
      assert.are.equal("", out, page)
      local name = page:match("^(.-)%.%d$")
      out, code = sh("lexgrog '" .. path .. "'")
      assert.are.equal(0, code, out)
      assert.truthy(out:find('"' .. name .. " - ", 1, true), out)
    end
  end)

  it("tupper(1) has a section per verb, made from this binary's table", function()
    local code, out = helper.cli({ "help", "--scdoc" })
    assert.are.equal(0, code)
    for _, v in ipairs(cli_table.VERBS) do
      assert.truthy(out:find("\n## " .. v.name .. "\n", 1, true), v.name)
    end
    local built = helper.read_file(BUILD .. "/man/tupper.1.scd")
    assert.are.equal(out, built, "build/man/tupper.1 is stale: rebuild")
  end)
end)

describe("tupper doctor", function()
  local dir
  setup(function() dir = helper.tmpdir() end)
  teardown(function() helper.rmrf(dir) end)

  local NAMES = { "kernel", "user", "cgroups", "user namespaces", "overlayfs", "seccomp", "qemu", "kvm",
    "open files", "daemon", "state dir", "disk pool" }

  it("reports every check, as text and as JSON, and passes on a host that runs boxes", function()
    local env = { "PATH=" .. os.getenv("PATH"), "TUPPER_SOCKET=" .. dir .. "/none.sock" }
    local code, out, err = helper.cli({ "--state-dir", dir .. "/state", "doctor", "--json" }, { env = env })
    assert.are.equal(0, code, err)
    local r = json.decode(out)
    assert.is_true(r.ok)
    local by = {}
    for _, c in ipairs(r.checks) do
      by[c.name] = c
      assert.truthy(c.status == "ok" or c.status == "warn" or c.status == "fail", c.name)
      if c.status ~= "ok" then assert.is_string(c.fix, c.name .. " has no fix hint") end
    end
    for _, n in ipairs(NAMES) do assert.truthy(by[n], n) end
    -- what this host is: the daemon cannot be reached, the boxes' kernel
    -- features are there (the suite runs boxes)
    assert.are.equal("warn", by.daemon.status)
    assert.truthy(by.daemon.detail:find(dir .. "/none.sock", 1, true))
    for _, n in ipairs({ "user namespaces", "overlayfs", "seccomp" }) do assert.are.equal("ok", by[n].status, n) end
    local mounts = helper.read_file("/proc/self/mounts")
    local v2 = mounts:find(" /sys/fs/cgroup cgroup2 ") ~= nil
    assert.truthy(by.cgroups.detail:find("^" .. (v2 and "v2" or "v1")), by.cgroups.detail)
    -- and the same as data
    assert.are.equal(v2 and 2 or 1, by.cgroups.facts.version)
    assert.are.equal((not v2 and mounts:match("%S+ (%S+) cgroup2 ")) or nil, by.cgroups.facts.hybrid)
    assert.truthy(({ kvm = 1, tcg = 1, untried = 1 })[by.kvm.facts.accel], by.kvm.facts.accel)
    -- /dev/kvm is the device's check: a host whose device QEMU cannot open runs TCG
    local st = uv.fs_stat("/dev/kvm")
    if not st or st.mode & 6 ~= 6 then
      assert.are.equal("tcg", by.kvm.facts.accel)
      assert.are.equal("warn", by.kvm.status)
    end
    assert.is_false(by.daemon.facts.answers)
    assert.is_number(by["open files"].facts.soft)
    -- --kvm-check tries a guest only where the device's checks pass; its
    -- answer is the same kind of line
    local code2, out2 = helper.cli({ "--state-dir", dir .. "/state", "doctor", "--json", "--kvm-check" }, { env = env })
    assert.are.equal(0, code2)
    local kvm
    for _, c in ipairs(json.decode(out2).checks) do if c.name == "kvm" then kvm = c end end
    assert.truthy(({ kvm = 1, tcg = 1 })[kvm.facts.accel], kvm.facts.accel)
    if not st or st.mode & 6 ~= 6 then assert.are.equal(by.kvm.detail, kvm.detail) end
    code, out = helper.cli({ "--state-dir", dir .. "/state", "doctor" }, { env = env })
    assert.are.equal(0, code)
    for _, n in ipairs(NAMES) do assert.truthy(out:find("  " .. n .. " ", 1, true), n) end
    assert.truthy(out:find("\nwarn  daemon ", 1, true), out)
    assert.truthy(out:find("fix: tupper daemon", 1, true), out)
  end)

  it("says when a daemon answers", function()
    local d = helper.start_daemon(nil, { pool = 0 })
    finally(function() d.stop() end)
    local code, out = helper.cli({ "--socket", d.socket, "--state-dir", d.state, "doctor", "--json" })
    assert.are.equal(0, code)
    for _, c in ipairs(json.decode(out).checks) do
      if c.name == "daemon" then
        assert.are.equal("ok", c.status)
        assert.truthy(c.detail:find("answers at " .. d.socket, 1, true), c.detail)
      end
      if c.name == "state dir" then assert.are.equal("ok", c.status, c.detail) end
      -- the path the daemon took: the btrfs pool it mounted, or the ext4 images
      if c.name == "disk pool" then
        local pool = (helper.read_file(d.log) or ""):find("disk pool: btrfs at", 1, true) ~= nil
        assert.are.equal(pool, c.facts.btrfs, c.detail)
        assert.are.equal(pool, c.facts.mounted, c.detail)
      end
    end
  end)

  it("fails, exit 1, on a blocker: a state dir that is a file", function()
    local file = dir .. "/not-a-dir"
    local f = assert(io.open(file, "w"))
    f:close()
    local code, out = helper.cli({ "--state-dir", file, "doctor", "--json" }, { env = no_daemon_env(dir) })
    assert.are.equal(1, code)
    local r = json.decode(out)
    assert.is_false(r.ok)
    local seen
    for _, c in ipairs(r.checks) do
      if c.name == "state dir" then
        seen = c
        assert.are.equal("fail", c.status)
        assert.is_true(c.blocker)
      end
    end
    assert.truthy(seen)
    code, out = helper.cli({ "--state-dir", file, "doctor" }, { env = no_daemon_env(dir) })
    assert.are.equal(1, code)
    assert.truthy(out:find("FAIL  state dir", 1, true), out)
  end)
end)
