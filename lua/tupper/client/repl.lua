--- `tupper repl`: a Lua prompt with the client API (tupper.sdk) loaded as
-- the global `tupper`.  Full Lua: this is the trusted tool of the person at
-- the keyboard, not the recipe VM.
--
-- The terminal is read without blocking the loop: libedit runs in callback
-- mode (runtime/ledit.c) and stdin is watched by a uv poll, so replies and
-- notifications keep flowing while a line is typed.  Each input runs as a
-- task of tupper.sdk; ^C cancels the call it waits in (the error
-- "interrupted" comes back to the prompt), and at the prompt it clears the
-- line.  ^D on an empty line leaves.
local uv = require("luv")
local sdk = require("tupper.sdk")

local M = {}

M.PROMPT, M.MORE = "tupper> ", "..> "
M.MAX_DEPTH, M.MAX_ITEMS, M.WIDTH = 6, 200, 72

-- ------------------------------------------------------- pretty printing

local KEYWORDS = {}
for w in ("and break do else elseif end false for function goto if in local nil not or repeat " ..
          "return then true until while"):gmatch("%a+") do KEYWORDS[w] = true end

local function quote(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local named = { ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r", ['"'] = '\\"', ["\\"] = "\\\\" }
    return named[c] or ("\\%d"):format(c:byte())
  end) .. '"'
end

local function is_ident(k)
  return type(k) == "string" and k:match("^[%a_][%w_]*$") and not KEYWORDS[k]
end

local TYPE_ORDER = { number = 1, string = 2, boolean = 3 }

local function key_less(a, b)
  local ta, tb = TYPE_ORDER[type(a)] or 9, TYPE_ORDER[type(b)] or 9
  if ta ~= tb then return ta < tb end
  if ta == 1 or ta == 2 then return a < b end
  return tostring(a) < tostring(b)
end

local function has_tostring(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__tostring ~= nil
end

local pretty

local function pretty_table(t, indent, path)
  if path[t] then return "<cycle>" end
  if path.depth >= M.MAX_DEPTH then return "{...}" end
  path[t], path.depth = true, path.depth + 1
  local items, n = {}, #t
  for i = 1, math.min(n, M.MAX_ITEMS) do items[#items + 1] = pretty(t[i], indent .. "  ", path) end
  local keys = {}
  for k in pairs(t) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_less)
  for _, k in ipairs(keys) do
    if #items >= M.MAX_ITEMS then break end
    local ks = is_ident(k) and k or "[" .. pretty(k, indent, path) .. "]"
    items[#items + 1] = ks .. " = " .. pretty(t[k], indent .. "  ", path)
  end
  local total = math.min(n, M.MAX_ITEMS) + #keys
  if n + #keys > #items then items[#items + 1] = ("... (%d more)"):format(n + #keys - #items) end
  path[t], path.depth = nil, path.depth - 1
  if total == 0 then return "{}" end
  local flat = "{ " .. table.concat(items, ", ") .. " }"
  if #flat + #indent <= M.WIDTH and not flat:find("\n", 1, true) then return flat end
  return "{\n" .. indent .. "  " .. table.concat(items, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
end

--- A readable form of v: tables with sorted keys, nested and indented,
-- cycles shown as <cycle>, depth limited; strings quoted.
function pretty(v, indent, path)
  indent, path = indent or "", path or { depth = 0 }
  local t = type(v)
  if t == "string" then return quote(v) end
  if t == "table" and not has_tostring(v) then return pretty_table(v, indent, path) end
  return tostring(v)
end
M.pretty = pretty

--- How a result is shown at the prompt: strings as they are, the rest pretty.
function M.show(...)
  local out = {}
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    out[#out + 1] = type(v) == "string" and v or pretty(v)
  end
  return table.concat(out, "\t")
end

-- ----------------------------------------------------------- completion

-- t[k] without calling __index functions (they might do anything).
local function peek(t, k)
  for _ = 1, 16 do
    if type(t) == "string" then t = string end
    if type(t) ~= "table" then return nil end
    local v = rawget(t, k)
    if v ~= nil then return v end
    local mt = getmetatable(t)
    t = type(mt) == "table" and mt.__index or nil
  end
end

-- Every string key of t and of its __index tables.
local function keys_of(t, only_functions, into)
  for _ = 1, 16 do
    if type(t) == "string" then t = string end
    if type(t) ~= "table" then return into end
    for k, v in pairs(t) do
      if is_ident(k) and (not only_functions or type(v) == "function") then into[k] = true end
    end
    local mt = getmetatable(t)
    t = type(mt) == "table" and mt.__index or nil
  end
  return into
end

--- Candidates for the word before the cursor: a global, or a field or
-- method after `a.b.` / `a.b:`.  Names starting with _ only when asked.
function M.complete(env, text)
  local prefix, sep, word = text:match("^(.-)([%.:]?)([%w_]*)$")
  local names = {}
  if sep == "" then
    if prefix ~= "" then return {} end
    keys_of(env, false, names)
    for k in pairs(KEYWORDS) do names[k] = true end
  else
    local v = env
    for part, s in (prefix .. "."):gmatch("([^%.:]*)([%.:])") do
      if not is_ident(part) or (s == ":" ) then return {} end
      v = peek(v, part)
      if v == nil then return {} end
    end
    keys_of(v, sep == ":", names)
  end
  local out = {}
  for k in pairs(names) do
    if k:sub(1, #word) == word and (k:sub(1, 1) ~= "_" or word:sub(1, 1) == "_") then
      out[#out + 1] = prefix .. sep .. k
    end
  end
  table.sort(out)
  return out
end

-- ------------------------------------------------------------ evaluation

--- Compiles a chunk as the prompt does: first as an expression (with
-- "return " in front), then as statements.  Returns fn, or nil, err and
-- incomplete (true when the chunk ends too early: read more).
function M.compile(code, env, name)
  local fn = load("return " .. code, name, "t", env)
  if fn then return fn end
  local err
  fn, err = load(code, name, "t", env)
  if fn then return fn end
  return nil, err, err:sub(-5) == "<eof>"
end

local function errtext(e)
  if type(e) == "string" then return e end
  local ok, s = pcall(tostring, e)
  return ok and s or "(error object)"
end

-- Runs fn(...) as a task and drives the loop until it is done; ^C
-- cancels it.  Returns the task (ok, results, err).
local function eval(fn, ...)
  local sig = uv.new_signal()
  local t
  sig:start("sigint", function()
    if t and not sdk.cancel(t) then
      t.abandoned, t.err = true, "interrupted"
    end
  end)
  t = sdk.drive(sdk.task(fn, ...))
  sig:close()
  return t
end

--- A fresh environment for the prompt: the globals, `tupper` and `arg`.
function M.env(args)
  local env = setmetatable({ tupper = sdk, arg = args or {} }, { __index = _G })
  env._G = env
  return env
end

-- Reads chunks from lines(), printing results (non-interactive: stdin is
-- not a terminal).  Returns 0, or 1 after the first error.
local function run_lines(env, next_line)
  local buf
  for line in next_line do
    buf = buf and buf .. "\n" .. line or line
    local fn, err, more = M.compile(buf, env, "=stdin")
    if fn then
      buf = nil
      local t = eval(fn)
      if not t.ok then
        io.stderr:write(errtext(t.err), "\n")
        return 1
      end
      if t.results.n > 0 then print(M.show(table.unpack(t.results, 1, t.results.n))) end
    elseif not more then
      io.stderr:write(err, "\n")
      return 1
    end
  end
  if buf then
    io.stderr:write("stdin: unfinished chunk at end of input\n")
    return 1
  end
  return 0
end

local function history_path()
  local p = os.getenv("TUPPER_HISTORY")
  if p then return p ~= "" and p or nil end
  local home = os.getenv("HOME")
  return home and home .. "/.tupper_history" or nil
end

--- The interactive prompt.  Returns the exit code (0).
function M.interactive(env)
  local core = require("tupper.core") -- lazy: only in the binary; the specs load the REPL under plain lua5.4
  local hist = history_path()
  core.ledit_open(hist, function(text) return M.complete(env, text) end)
  local buf, current, code = nil, nil, 0
  local poll, sig = uv.new_poll(0), uv.new_signal()

  local on_readable
  -- stdin is watched only at the prompt: typing ahead during a call waits
  local function prompt()
    core.ledit_prompt(buf and M.MORE or M.PROMPT)
    poll:start("r", on_readable)
  end

  local function done_eval(t)
    if t ~= current then return end -- an abandoned task finishing late
    current = nil
    if t.ok then
      if t.results.n > 0 then print(M.show(table.unpack(t.results, 1, t.results.n))) end
    else
      io.stderr:write(errtext(t.err), "\n")
    end
    io.stdout:flush()
    prompt()
  end

  local function on_line(line)
    if line:match("%S") then core.ledit_add_history(line, hist) end
    buf = buf and buf .. "\n" .. line or line
    local fn, err, more = M.compile(buf, env, "=stdin")
    if not fn then
      if not more then
        io.stderr:write(err, "\n")
        buf = nil
      end
      return prompt()
    end
    buf = nil
    poll:stop()
    local t = sdk.task(fn)
    current = t
    if t.done then return done_eval(t) end
    t.on_done = done_eval
  end

  on_readable = function()
    local line = core.ledit_feed()
    if line == false then
      io.stdout:write("\n")
      uv.stop()
    elseif line then
      on_line(line)
    end
  end
  sig:start("sigint", function()
    if current then
      local t = current
      io.stdout:write("\n")
      if not sdk.cancel(t) then -- busy elsewhere: leave it to run on
        t.abandoned = true
        t.ok, t.err = false, "interrupted"
        done_eval(t)
      end
    else
      core.ledit_clear()
      buf = nil
      io.stdout:write("^C\n")
      prompt()
    end
  end)
  io.stdout:write(("tupper %s: Lua %s; `tupper` is the client API (docs/repl.md); ^D leaves\n")
    :format(core.version or "", _VERSION:match("%d.*") or ""))
  prompt()
  uv.run()
  poll:close()
  sig:close()
  core.ledit_close()
  return code
end

local USAGE = [[
usage: tupper repl [-e CODE]... [SCRIPT ARG...]
  -e CODE   run CODE and print what it returns (repeatable)
  SCRIPT    run a Lua file; ARGS are in `arg` and `...`
With neither, an interactive prompt (or, when stdin is not a terminal, the
chunks read from stdin).  `tupper` is the client API: see docs/repl.md.
]]

--- Entry point of `tupper repl`.  args: after the verb; g: socket and
-- state_dir from the global options.  Returns the exit code.
function M.main(args, g)
  sdk.configure({ socket = g.socket, state_dir = g.state_dir, autostart = g.autostart })
  local codes, i = {}, 1
  while args[i] do
    if args[i] == "-e" then
      if not args[i + 1] then io.stderr:write(USAGE); return 2 end
      codes[#codes + 1] = args[i + 1]
      i = i + 2
    elseif args[i] == "-h" or args[i] == "--help" then
      io.stdout:write(USAGE)
      return 0
    elseif args[i] == "--" then
      i = i + 1
      break
    elseif args[i]:sub(1, 1) == "-" and args[i] ~= "-" then
      io.stderr:write("tupper repl: unknown option ", args[i], "\n", USAGE)
      return 2
    else
      break
    end
  end
  local script = args[i]
  local sargs = { [0] = script }
  for k = i + 1, #args do sargs[#sargs + 1] = args[k] end
  local env = M.env(sargs)
  local code = 0
  for n, src in ipairs(codes) do
    local fn, err = M.compile(src, env, "=(command line " .. n .. ")")
    if not fn then
      io.stderr:write(err, "\n")
      code = 1
      break
    end
    local t = eval(fn)
    if not t.ok then
      io.stderr:write(errtext(t.err), "\n")
      code = 1
      break
    end
    if t.results.n > 0 then print(M.show(table.unpack(t.results, 1, t.results.n))) end
  end
  if code == 0 and script then
    local fn, err
    if script == "-" then fn, err = load(io.stdin:read("a"), "=stdin", "t", env)
    else fn, err = loadfile(script, "t", env) end
    if not fn then
      io.stderr:write(err, "\n")
      code = 1
    else
      local t = eval(fn, table.unpack(sargs))
      if not t.ok then
        io.stderr:write(errtext(t.err), "\n")
        code = 1
      end
    end
  elseif code == 0 and #codes == 0 then
    if uv.guess_handle(0) == "tty" then
      code = M.interactive(env)
    else
      code = run_lines(env, io.lines())
    end
  end
  io.stdout:flush()
  sdk.close()
  return code
end

return M
