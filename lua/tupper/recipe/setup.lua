--- A recipe's setup(box): runs in the recipe VM against a fresh box.
--
-- The box the recipe sees is a table of methods (box:run, box:write, ...).
-- Each method checks its arguments inside the VM, then yields out of the
-- VM's session (tupper.vm.session) with a request; the daemon's side
-- (M.run, in a coroutine of its own) performs it with the box's agent, on
-- the daemon's loop, and resumes the session with the answer.  So the
-- budgets hold over the whole setup, but the time budget counts only Lua
-- running, never the waits for the box.  docs/recipes.md.
local uv = require("luv")
local core = require("tupper.core")
local async = require("tupper.util.async")
local schema = require("tupper.wire.schema")
local vm = require("tupper.recipe.jail")
local policy = require("tupper.recipe.policy")
local paths = require("tupper.util.paths")

local MSG = core.MSG
local M = {}

M.OUTPUT_MAX = 1024 * 1024     -- bytes of each stream box:run keeps (the tail)
M.READ_MAX = 16 * 1024 * 1024  -- largest file box:read returns
M.TAIL = 2048                  -- bytes of a failed command's stderr in the error
M.TIMEOUT = 1800               -- seconds a whole setup may take, waits included

local TOKEN = {} -- marks the yields of the box methods; nothing in the VM can reach it

-- ------------------------------------------------------------ VM side

-- Everything below up to M.box runs inside the VM's session, on values the
-- recipe passed: it reads them raw and hands the daemon fresh copies.

-- Raises msg at the recipe's line that called the box method: depth 1
-- from the method itself, 2 from a helper it calls.
local function fail(msg, depth)
  error(msg, 2 + (depth or 1))
end

local function want_path(name, v)
  if type(v) ~= "string" or #v == 0 or #v > 4096 or v:find("\0", 1, true) then
    fail(("box:%s: the path must be a string of 1 to 4096 bytes"):format(name), 2)
  end
  if v:sub(1, 1) ~= "/" then fail(("box:%s: the path must be absolute, not %q"):format(name, v), 2) end
  return v
end

local function want_opts(name, v)
  if v == nil then return {} end
  local t, err = vm.plain(v)
  if type(t) ~= "table" then fail(("box:%s: options must be a table%s"):format(name, err and (": " .. err) or ""), 2) end
  return t
end

-- Yields a request to the daemon and returns its answer, or raises its
-- error at the recipe's line.  Not a tail call: the level must stay right.
local function request(op, args)
  local ok, res = coroutine.yield(TOKEN, op, args)
  if not ok then error(res, 3) end
  return res
end

local RUN_OPTS = { env = true, cwd = true, user = true, timeout = true, stdin = true, check = true }

--- The box a setup function gets.
function M.box()
  local box = {}
  local function self_check(self, name)
    if self ~= box then fail(("box:%s: call it with a colon, box:%s(...)"):format(name, name), 2) end
  end

  --- box:run(cmd, opts) -> { stdout, stderr, exit_code }; cmd is a shell
  -- command line or a list of arguments.  opts: env, cwd, user, timeout,
  -- stdin (a string), check (default true: a non-zero exit is an error).
  function box.run(self, cmd, opts)
    self_check(self, "run")
    local argv
    if type(cmd) == "string" then
      if #cmd == 0 or #cmd > 32760 or cmd:find("\0", 1, true) then
        fail("box:run: the command must be a string of 1 to 32760 bytes without NUL")
      end
      argv = { "/bin/sh", "-c", cmd }
    else
      local a = vm.plain(cmd)
      local err = type(a) ~= "table" and "box:run: the command must be a string or a list of strings"
        or schema.check("argv", { type = "array", min = 1, max = 4096, item_max = 32768 }, a)
      if err then fail(err:find("^box:run") and err or "box:run: " .. err) end
      argv = a
    end
    local o = want_opts("run", opts)
    for k in pairs(o) do
      if not RUN_OPTS[k] then fail(("box:run: unknown option '%s'"):format(tostring(k))) end
    end
    local req = { argv = argv, check = o.check ~= false }
    if o.check ~= nil and type(o.check) ~= "boolean" then fail("box:run: 'check' must be a boolean") end
    if o.env ~= nil then
      local err, env = schema.check("env", schema.MAP, o.env)
      if err then fail("box:run: " .. err) end
      req.env = env
    end
    if o.cwd ~= nil then req.cwd = want_path("run", o.cwd) end
    if o.user ~= nil then
      if not (math.type(o.user) == "integer" and o.user >= 0 and o.user <= 65535)
         and not (type(o.user) == "string" and o.user:match("^[%a_][%w_-]*$") and #o.user <= 32) then
        fail("box:run: 'user' must be a user name or a uid")
      end
      req.user = o.user
    end
    if o.timeout ~= nil then
      local err, t = schema.check("timeout", { type = "duration" }, o.timeout)
      if err then fail("box:run: " .. err) end
      req.timeout = t
    end
    if o.stdin ~= nil then
      if type(o.stdin) ~= "string" then fail("box:run: 'stdin' must be a string") end
      req.stdin = o.stdin
    end
    local r = request("run", req)
    return r
  end

  --- box:write(path, data[, mode]) -> number of bytes written.
  function box.write(self, path, data, mode)
    self_check(self, "write")
    want_path("write", path)
    if type(data) ~= "string" then fail("box:write: the data must be a string") end
    if mode ~= nil and not (math.type(mode) == "integer" and mode >= 0 and mode <= 4095) then
      fail("box:write: the mode must be an integer 0..4095 (e.g. tonumber('755', 8))")
    end
    local r = request("write", { path = path, data = data, mode = mode })
    return r
  end

  --- box:read(path) -> the file's content.
  function box.read(self, path)
    self_check(self, "read")
    local r = request("read", { path = want_path("read", path) })
    return r
  end

  --- box:exists(path) -> true when something is there.
  function box.exists(self, path)
    self_check(self, "exists")
    local r = request("exists", { path = want_path("exists", path) })
    return r
  end

  --- box:mkdir(path) -> true (parents too; an existing dir is fine).
  function box.mkdir(self, path)
    self_check(self, "mkdir")
    local r = request("mkdir", { path = want_path("mkdir", path) })
    return r
  end

  --- box:remove(path[, recursive]) -> true.
  function box.remove(self, path, recursive)
    self_check(self, "remove")
    local r = request("remove", { path = want_path("remove", path), recursive = recursive == true })
    return r
  end

  --- box:list(path) -> sorted names in a directory.
  function box.list(self, path)
    self_check(self, "list")
    local r = request("list", { path = want_path("list", path) })
    return r
  end

  --- box:stat(path) -> { type, size, mode, uid, gid }.
  function box.stat(self, path)
    self_check(self, "stat")
    local r = request("stat", { path = want_path("stat", path) })
    return r
  end

  --- box:rename(from, to) -> true.
  function box.rename(self, from, to)
    self_check(self, "rename")
    local r = request("rename", { path = want_path("rename", from), path2 = want_path("rename", to) })
    return r
  end

  return box
end

-- ---------------------------------------------------------- daemon side

local ERRNO = { [2] = "ENOENT", [13] = "EACCES", [17] = "EEXIST", [20] = "ENOTDIR",
  [21] = "EISDIR", [28] = "ENOSPC", [39] = "ENOTEMPTY", [40] = "ELOOP" }

local function agent_err(what, err, errno)
  local code = ERRNO[math.tointeger(errno) or 0]
  return ("%s: %s%s"):format(what, tostring(err), code and (" (" .. code .. ")") or "")
end

local function tail(s, n)
  if #s <= n then return s end
  return "..." .. s:sub(-n)
end

--- The uid, gid, groups and home of a user of the box (a name or a uid),
-- from the box's /etc/passwd and /etc/group (Sandbox:account).  Returns
-- { uid, gid, groups, home, name } or nil, err, errno.
function M.lookup_user(sb, user)
  return sb:account(user)
end

--- The policies of ctx (those binding the sandbox the setup is for) on a
-- file operation: true or nil, err.
function M.check_file(ctx, op, path)
  for _, pol in ipairs(ctx.policies or {}) do
    local ok, err = policy.check_file(pol, op, path)
    if not ok then return nil, err end
  end
  return true
end

-- Runs one command for box:run; returns the result table or nil, err.
local function do_run(ctx, q)
  local sb = ctx.sb
  for _, pol in ipairs(ctx.policies or {}) do
    local argv, err = policy.check_exec(pol, q.argv)
    if not argv then return nil, err end
    q.argv = argv
  end
  local cred
  if q.user ~= nil then
    local err
    cred, err = M.lookup_user(sb, q.user)
    if not cred then return nil, err end
  end
  local env = q.env
  if cred then
    env = env or {}
    env.HOME = env.HOME or cred.home
    env.USER = env.USER or cred.name
  end
  local proc, err, errno = sb:exec(q.argv, env, q.cwd, q.stdin ~= nil, nil, cred)
  if not proc then return nil, agent_err("box:run: cannot start " .. q.argv[#q.argv]:sub(1, 200), err, errno) end
  local cap = ctx.captures[proc] or { stdout = {}, stderr = {}, n = { stdout = 0, stderr = 0 } }
  ctx.captures[proc] = cap
  local timer
  if q.timeout and q.timeout > 0 then
    timer = uv.new_timer()
    timer:start(math.ceil(q.timeout * 1000), 0, function()
      cap.timed_out = true
      async.spawn(function() sb:signal(proc, 9) end)
    end)
  end
  if q.stdin then
    for i = 1, math.max(1, #q.stdin), core.CHUNK_MAX do
      local chunk = q.stdin:sub(i, i + core.CHUNK_MAX - 1)
      if #chunk > 0 and not sb:request(MSG.STDIN, { pid = proc.pid, data = chunk }) then break end
    end
    sb:request(MSG.STDIN_CLOSE, { pid = proc.pid })
  end
  if not cap.exited then
    async.wait(function(cb) cap.waiter = cb end)
  end
  if timer then timer:stop(); timer:close() end
  ctx.captures[proc] = nil
  local out, errout = table.concat(cap.stdout), table.concat(cap.stderr)
  ctx.handed = ctx.handed + #out + #errout
  local code = proc.exit_code or -1
  if proc.signal and proc.signal > 0 then code = 128 + proc.signal end
  local res = { stdout = out, stderr = errout, exit_code = code, timed_out = cap.timed_out or nil }
  if q.check and (code ~= 0 or cap.timed_out) then
    local cmd = q.argv[1] == "/bin/sh" and q.argv[2] == "-c" and q.argv[3] or table.concat(q.argv, " ")
    local why = cap.timed_out and "timed out" or ("exited with " .. code)
    local t = tail(errout ~= "" and errout or out, M.TAIL)
    return nil, ("command %q %s%s"):format(tail(cmd, 200), why, t ~= "" and (":\n" .. t) or "")
  end
  return res
end

local function do_write(ctx, q)
  local sb, data = ctx.sb, q.data
  local off = 0
  repeat
    local chunk = data:sub(off + 1, off + core.CHUNK_MAX)
    local flags = 4 | (off == 0 and 1 or 0)
    local r, err, errno = sb:request(MSG.FS_WRITE, { path = q.path, data = chunk, offset = off,
      flags = flags, mode = q.mode or 420 })
    if not r then return nil, agent_err("box:write " .. q.path, err, errno) end
    off = off + #chunk
  until off >= #data
  return #data
end

local function do_read(ctx, q)
  local parts, off = {}, 0
  while true do
    local r, err, errno = ctx.sb:request(MSG.FS_READ, { path = q.path, offset = off, length = core.CHUNK_MAX })
    if not r then return nil, agent_err("box:read " .. q.path, err, errno) end
    local data = r.data or ""
    parts[#parts + 1] = data
    off = off + #data
    ctx.handed = ctx.handed + #data
    if off > M.READ_MAX then return nil, ("box:read %s: larger than %d bytes"):format(q.path, M.READ_MAX) end
    if ctx.handed > ctx.hand_max then return nil, "the setup read more from the box than its memory budget" end
    if #data == 0 or off >= (math.tointeger(r.size) or 0) then break end
  end
  return table.concat(parts)
end

local FILE_TYPES = { "file", "dir", "symlink", "other" }
-- box methods -> the op a policy's on_file sees
local FILE_OPS = { write = "write", read = "read", exists = "stat", mkdir = "mkdir",
  remove = "remove", list = "list", stat = "stat", rename = "rename" }

local OPS = {
  run = do_run, write = do_write, read = do_read,
  exists = function(ctx, q)
    local r, err, errno = ctx.sb:request(MSG.FS_STAT, { path = q.path })
    if r then return true end
    if errno == 2 or errno == 20 then return false end
    return nil, agent_err("box:exists " .. q.path, err, errno)
  end,
  mkdir = function(ctx, q)
    local r, err, errno = ctx.sb:request(MSG.FS_MKDIR, { path = q.path, mode = 493, flags = 1 })
    if not r then return nil, agent_err("box:mkdir " .. q.path, err, errno) end
    return true
  end,
  remove = function(ctx, q)
    local r, err, errno = ctx.sb:request(MSG.FS_REMOVE, { path = q.path, flags = q.recursive and 1 or 0 })
    if not r then return nil, agent_err("box:remove " .. q.path, err, errno) end
    return true
  end,
  list = function(ctx, q)
    local r, err, errno = ctx.sb:request(MSG.FS_LIST, { path = q.path })
    if not r then return nil, agent_err("box:list " .. q.path, err, errno) end
    local names = {}
    for _, e in ipairs(r.entries or {}) do
      if type(e.name) == "string" then names[#names + 1] = e.name end
    end
    table.sort(names)
    return names
  end,
  stat = function(ctx, q)
    local r, err, errno = ctx.sb:request(MSG.FS_STAT, { path = q.path })
    if not r then return nil, agent_err("box:stat " .. q.path, err, errno) end
    return { type = FILE_TYPES[r.type] or "other", size = r.size, mode = r.mode, uid = r.uid, gid = r.gid }
  end,
  rename = function(ctx, q)
    local r, err, errno = ctx.sb:request(MSG.FS_RENAME, { path = q.path, path2 = q.path2 })
    if not r then return nil, agent_err("box:rename " .. q.path, err, errno) end
    return true
  end,
}

-- One box call: file paths are cleaned as the socket API's are (so a
-- policy's on_file sees what is done), then the policies judge it.
local function perform(ctx, op, q)
  local fop = FILE_OPS[op]
  if fop then
    local clean = paths.clean_path
    q.path = clean(q.path)
    if q.path2 then q.path2 = clean(q.path2) end
    local ok, err = M.check_file(ctx, fop, q.path)
    if ok and q.path2 then ok, err = M.check_file(ctx, fop, q.path2) end
    if not ok then return nil, err end
  end
  return OPS[op](ctx, q)
end

--- The hooks of a setup box: output and exits of box:run's processes
-- are kept for the setup.  Pass them to sandbox.start (or set them on
-- sb.hooks) before M.run.
function M.hooks(ctx)
  ctx.captures = ctx.captures or setmetatable({}, { __mode = "k" })
  return {
    on_output = function(_, proc, stream, data)
      -- a build's log (recipe.register's `logs`): a failing listener changes nothing
      if ctx.on_log then pcall(ctx.on_log, stream, data) end
      local cap = ctx.captures[proc]
      if not cap then
        cap = { stdout = {}, stderr = {}, n = { stdout = 0, stderr = 0 } }
        ctx.captures[proc] = cap
      end
      local list = cap[stream]
      list[#list + 1] = data
      cap.n[stream] = cap.n[stream] + #data
      -- keep the tail: drop whole chunks from the front past the cap
      while cap.n[stream] > M.OUTPUT_MAX and #list > 1 do
        cap.n[stream] = cap.n[stream] - #table.remove(list, 1)
      end
    end,
    on_exit = function(_, proc)
      local cap = ctx.captures[proc]
      if not cap then
        cap = { stdout = {}, stderr = {}, n = { stdout = 0, stderr = 0 } }
        ctx.captures[proc] = cap
      end
      cap.exited = true
      if cap.waiter then local w = cap.waiter; cap.waiter = nil; w() end
    end,
  }
end

--- Runs recipe.setup(box) against sandbox sb, whose hooks came from
-- M.hooks(ctx).  ctx.timeout: seconds the whole setup may take (default
-- M.TIMEOUT).  Returns true, or nil, err: the recipe's file:line and what
-- failed ("recipes/x.lua:7: command \"make\" exited with 2:\n<stderr>").
function M.run(recipe, sb, ctx)
  ctx.sb = sb
  ctx.handed = 0
  ctx.hand_max = vm.SETUP_LIMITS.memory
  local deadline = uv.now() + (ctx.timeout or M.TIMEOUT) * 1000
  local session = vm.session(recipe.setup, nil, recipe.origin and recipe.origin.file)
  local res = table.pack(session:resume(M.box()))
  while true do
    if res[1] == nil then return nil, tostring(res[2]) end
    if res[1] == "done" then return true end
    if res[2] ~= TOKEN or type(OPS[res[3]]) ~= "function" then
      return nil, "setup: yielded outside a box call"
    end
    local ok, val, err = pcall(perform, ctx, res[3], res[4])
    if not ok then return nil, "setup: internal error: " .. tostring(val) end
    if sb.state ~= "running" then
      return nil, ("setup: the box went away (%s)"):format(tostring(sb.down_reason or sb.state))
    end
    if uv.now() > deadline then
      return nil, ("setup: took longer than %d s"):format(ctx.timeout or M.TIMEOUT)
    end
    if ctx.handed > ctx.hand_max then
      return nil, ("setup: read more than %d bytes from the box (its memory budget)"):format(ctx.hand_max)
    end
    if val == nil then
      res = table.pack(session:resume(false, err))
    else
      res = table.pack(session:resume(true, val))
    end
  end
end

return M
