--- The locked-down VM for recipes and policy files.
-- Untrusted Lua runs in the daemon's own state, but: in a fresh environment
-- per chunk, built from an allow-list of globals (no io, os.execute,
-- package, require, debug, load, collectgarbage, coroutine); text chunks
-- only; every run (loading a file, calling one of its functions) under an
-- instruction and a memory budget (tupper.recipe.jail_core, runtime/lvm.c).  Values
-- leave the VM only as plain copies (`vm.plain`), so the daemon never runs a
-- metamethod the code planted outside a budget.
local core = require("tupper.recipe.jail_core")

local M = {}

--- Budgets of a run: loading a file, and calling one of its hooks.
-- (time in ms: instructions are not all equal, an error unwinding costs
-- a hundred plain ones)
M.LOAD_LIMITS = { instructions = 10000000, memory = 32 * 1024 * 1024, time = 1000 }
M.CALL_LIMITS = { instructions = 1000000, memory = 8 * 1024 * 1024, time = 100 }
--- Files larger than this are refused before they are parsed.
M.MAX_FILE = 1024 * 1024
local MAX_DEPTH, MAX_ITEMS = 32, 100000

local real_rep, real_getmetatable, real_setmetatable = string.rep, getmetatable, setmetatable

-- The string functions a chunk sees, as globals (a copy per chunk) and as
-- methods of strings ("x"):upper() (this table itself, which no chunk can
-- reach: getmetatable("") answers nil in the VM).  No string.dump; rep of an
-- empty string returns at once (the C loop would spin n times unhooked).
local SAFE_STRING = {}
for k, v in pairs(string) do
  if k ~= "dump" then SAFE_STRING[k] = v end
end
function SAFE_STRING.rep(s, n, sep)
  if s == "" and (sep == nil or sep == "") then return "" end
  return real_rep(s, n, sep)
end

-- Pattern matching runs in C between two instructions, where the budget's
-- hook cannot stop it, and it backtracks: each unbounded item (x*, x+, x-,
-- %b) may try every length of the subject, each x? both ways, at every
-- start position.  So the worst case of a pattern over n bytes is about
-- starts * (n+1)^q * 2^opt steps; a match whose worst case is over
-- PATTERN_STEPS (a fraction of a second of C) is refused before it runs,
-- with an error, instead of stalling the daemon.  Plain finds are linear.
M.PATTERN_STEPS = 2e8

local function pattern_cost(n, pat, anchored_ok)
  local q, opt, i, len = 0, 0, 1, #pat
  local starts = n + 1
  if anchored_ok and pat:sub(1, 1) == "^" then starts, i = 1, 2 end
  while i <= len do
    local c = pat:sub(i, i)
    local item_end -- last byte of the single-char item starting at i, if any
    if c == "%" then
      local d = pat:sub(i + 1, i + 1)
      if d == "b" then
        q, i = q + 1, i + 4
      elseif d == "f" then
        -- a frontier: skip its set, it matches no byte
        local j = i + 3
        if pat:sub(j, j) == "^" then j = j + 1 end
        if pat:sub(j, j) == "]" then j = j + 1 end
        while j <= len and pat:sub(j, j) ~= "]" do j = j + (pat:sub(j, j) == "%" and 2 or 1) end
        i = j + 1
      else
        item_end = i + 1
      end
    elseif c == "[" then
      local j = i + 1
      if pat:sub(j, j) == "^" then j = j + 1 end
      if pat:sub(j, j) == "]" then j = j + 1 end
      while j <= len and pat:sub(j, j) ~= "]" do j = j + (pat:sub(j, j) == "%" and 2 or 1) end
      item_end = j
    elseif c == "(" or c == ")" or (c == "$" and i == len) then
      i = i + 1
    else
      item_end = i
    end
    if item_end then
      local m = pat:sub(item_end + 1, item_end + 1)
      if m == "*" or m == "+" or m == "-" then
        q, i = q + 1, item_end + 2
      elseif m == "?" then
        opt, i = opt + 1, item_end + 2
      else
        i = item_end + 1
      end
    end
  end
  return starts * (n + 1.0) ^ q * 2.0 ^ opt
end

local function check_pattern(name, s, pat, plain)
  if plain or type(s) ~= "string" or type(pat) ~= "string" then return end
  local cost = pattern_cost(#s, pat, name ~= "gmatch" and name ~= "gsub")
  if cost > M.PATTERN_STEPS then
    error(("string.%s: the pattern %q over %d bytes could take about %.0e steps (at most %.0e here): "
      .. "use a plain find or a simpler pattern"):format(name, #pat > 40 and pat:sub(1, 40) .. "..." or pat,
      #s, cost, M.PATTERN_STEPS), 3)
  end
end

for _, name in ipairs({ "find", "match", "gmatch", "gsub" }) do
  local real = string[name]
  SAFE_STRING[name] = function(s, pat, a, b)
    check_pattern(name, s, pat, name == "find" and b)
    return real(s, pat, a, b)
  end
end

local function copy(t, omit)
  local c = {}
  for k, v in pairs(t) do
    if not (omit and omit[k]) then c[k] = v end
  end
  return c
end

local function safe_getmetatable(v)
  if type(v) == "string" then return nil end
  return real_getmetatable(v)
end

-- A finalizer would run later, inside the daemon's collector, outside any
-- budget: metatables with __gc are refused (adding __gc afterwards does not
-- mark the object, as the Lua manual says).
local function safe_setmetatable(t, mt)
  if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
    error("setmetatable: __gc is not allowed here", 2)
  end
  return real_setmetatable(t, mt)
end

-- xpcall calls its message handler before the stack unwinds; after an
-- error raised by the instruction hook, Lua runs that handler with hooks
-- off (the hook never returned), so a looping handler would spin unbudgeted.
-- This one calls the handler after the pcall, with hooks back on.
local function safe_xpcall(f, handler, ...)
  local r = table.pack(pcall(f, ...))
  if r[1] then return table.unpack(r, 1, r.n) end
  local _, v = pcall(handler, r[2])
  return false, v
end

--- A fresh environment: the allow-list, plus extra globals (a constructor
-- such as `recipe`).  Nothing in it is shared with another environment
-- except immutable functions.
function M.env(extra)
  local env = {
    assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs,
    pcall = pcall, select = select, tonumber = tonumber, tostring = tostring,
    type = type, xpcall = safe_xpcall, rawequal = rawequal, rawget = rawget,
    rawlen = rawlen, rawset = rawset,
    getmetatable = safe_getmetatable, setmetatable = safe_setmetatable,
    string = copy(SAFE_STRING),
    table = copy(table),
    math = copy(math, { randomseed = true }),
    utf8 = copy(utf8),
    os = { time = os.time, clock = os.clock, date = os.date },
    _VERSION = _VERSION,
  }
  env._G = env
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

local STRING_MT = getmetatable("")

--- Calls fn(...) under limits ({ instructions, memory, time }, default
-- M.CALL_LIMITS).  Returns true, results... or nil, err.  Results are the
-- raw values: pass them through vm.plain before the daemon looks inside.
function M.run(fn, limits, ...)
  limits = limits or M.CALL_LIMITS
  local saved = STRING_MT.__index
  STRING_MT.__index = SAFE_STRING
  local res = table.pack(pcall(core.run, fn, limits.instructions, limits.memory, limits.time, ...))
  STRING_MT.__index = saved
  if not res[1] then error(res[2], 2) end -- a bad argument: our bug, not the chunk's
  return table.unpack(res, 2, res.n)
end

--- Budgets of a recipe's setup(box), over all its slices: the time counts
-- only Lua running, not the waits for the box (docs/recipes.md).
M.SETUP_LIMITS = { instructions = 50000000, memory = 64 * 1024 * 1024, time = 5000 }

local Session = {}
Session.__index = Session

--- A run that may pause: fn yields (only daemon-side code can: the VM has
-- no coroutine library) and the caller resumes it later.  The budgets
-- (default M.SETUP_LIMITS) hold over every slice together.
-- session:resume(...) -> "yield", values... | "done", results... | nil, err
-- chunkname: the file fn comes from; a run a budget stops is reported at
-- its line there.
function M.session(fn, limits, chunkname)
  limits = limits or M.SETUP_LIMITS
  return setmetatable({ s = core.session(fn, limits.instructions, limits.memory, limits.time,
                                         chunkname and ("@" .. chunkname) or nil) }, Session)
end

function Session:resume(...)
  local saved = STRING_MT.__index
  STRING_MT.__index = SAFE_STRING
  local res = table.pack(pcall(self.s.resume, self.s, ...))
  STRING_MT.__index = saved
  if not res[1] then error(res[2], 2) end
  return table.unpack(res, 2, res.n)
end

local function plain(v, depth, count)
  local t = type(v)
  if t == "string" or t == "number" or t == "boolean" or t == "nil" or t == "function" then
    return v
  end
  if t ~= "table" then return nil, ("a %s value cannot leave the recipe VM"):format(t) end
  if depth > MAX_DEPTH then return nil, "tables nested too deep (or a cycle)" end
  if debug.getmetatable(v) ~= nil then
    return nil, "a table with a metatable cannot leave the recipe VM"
  end
  local out = {}
  for k, x in next, v do
    count[1] = count[1] + 1
    if count[1] > MAX_ITEMS then return nil, "too many values" end
    local kt = type(k)
    if kt ~= "string" and kt ~= "number" and kt ~= "boolean" then
      return nil, ("a %s key cannot leave the recipe VM"):format(kt)
    end
    local y, err = plain(x, depth + 1, count)
    if err then return nil, err end
    out[k] = y
  end
  return out
end

--- A copy of v made of plain data: strings, numbers, booleans, functions
-- (closures of the VM, to be called only through vm.run) and tables without
-- metatables, read with raw access.  nil, err for anything else.
function M.plain(v)
  return plain(v, 0, { 0 })
end

--- Evaluates a chunk of text in a fresh environment (M.env(extra)) under
-- M.LOAD_LIMITS.  chunkname is how messages name it ("recipes/x.lua").
-- Returns the chunk's first result as plain data, or nil, err.
function M.load_string(text, chunkname, extra)
  if type(text) ~= "string" then return nil, chunkname .. ": not text" end
  if #text > M.MAX_FILE then
    return nil, ("%s: larger than %d bytes"):format(chunkname, M.MAX_FILE)
  end
  local env = M.env(extra)
  local ok, v = M.run(function()
    local fn, err = load(text, "@" .. chunkname, "t", env)
    if not fn then error(err, 0) end
    return (fn())
  end, M.LOAD_LIMITS)
  if not ok then
    if v:sub(1, #chunkname + 1) ~= chunkname .. ":" then v = chunkname .. ": " .. v end
    return nil, v
  end
  local out, err = M.plain(v)
  if err then return nil, ("%s: %s"):format(chunkname, err) end
  return out
end

--- Reads a file (at most M.MAX_FILE bytes) and evaluates it as load_string.
function M.load_file(path, extra)
  local text, err = M.read_source(path)
  if not text then return nil, err end
  return M.load_string(text, path, extra)
end

--- The text of a recipe or policy file, at most MAX_FILE bytes; nil, err
-- for a missing or larger file.
function M.read_source(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text = f:read(M.MAX_FILE + 1)
  f:close()
  if text and #text > M.MAX_FILE then
    return nil, ("%s: larger than %d bytes"):format(path, M.MAX_FILE)
  end
  return text or ""
end

--- Calls a function of a loaded chunk (a hook) with plain copies of args,
-- under M.CALL_LIMITS.  Returns true, plain results... or nil, err.
function M.call(fn, ...)
  local args = table.pack(...)
  for i = 1, args.n do
    local a, err = M.plain(args[i])
    if err then return nil, err end
    args[i] = a
  end
  local res = table.pack(M.run(fn, M.CALL_LIMITS, table.unpack(args, 1, args.n)))
  if not res[1] then return nil, res[2] end
  for i = 2, res.n do
    local r, err = M.plain(res[i])
    if err then return nil, err end
    res[i] = r
  end
  return true, table.unpack(res, 2, res.n)
end

return M
