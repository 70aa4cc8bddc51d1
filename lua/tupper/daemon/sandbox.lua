--- A sandbox as the daemon sees it: a box of a backend (backend/registry.lua),
-- the agent inside it, and the processes started through the API.  Requests to the
-- agent are asynchronous: call them from a coroutine (tupper.async).
local core = require("tupper.core")
local async = require("tupper.util.async")
local uv = require("luv")
local netrelay = require("tupper.net.relay")
local netrules = require("tupper.net.rules")
local backends = require("tupper.backend.registry")
local paths = require("tupper.util.paths")
local lazy = require("tupper.util.lazy")

local MSG = core.MSG
local M = {}

-- How long a request to the agent may wait for its answer.  The daemon
-- takes a shorter one from TUPPER_AGENT_TIMEOUT_MS (for tests: a stopped
-- agent's request then fails in a test's time), never a longer one.
M.REQUEST_TIMEOUT_MS = 120000
do
  local v = math.tointeger(tonumber(os.getenv("TUPPER_AGENT_TIMEOUT_MS") or ""))
  if v and v >= 10 and v < M.REQUEST_TIMEOUT_MS then M.REQUEST_TIMEOUT_MS = v end
end
M.ID_COUNT = 65536 -- uids and gids mapped into each box
-- TP_WE_* of proto.h, by number
M.WATCH_EVENTS = { "create", "write", "remove", "rename", "chmod", "overflow", "end" }

local Sandbox = {}
-- A box's requests in flight, processes, exited processes and watches:
-- each table is made on its first use (an idle box holds none of them:
-- docs/benchmarks.md, "Loop"); the requests' is dropped again once empty.
Sandbox.__index = lazy.index(Sandbox, { "pending", "procs", "exited", "watches" })

local function release(proc)
  proc.kill_due = nil
end

local function now_iso()
  return os.date("!%Y-%m-%dT%H:%M:%SZ")
end

-- Wraps a started (or re-adopted) box and waits for its agent's READY.
local function attach(box, opts, adopting)
  local self = setmetatable({
    id = opts.id, image = opts.image, layers = opts.layers, image_digest = opts.image_digest,
    user = opts.user, id_count = opts.id_count, box = box, state = "starting", cgroup = opts.cgroup,
    created_at = opts.created_at or now_iso(), metadata = opts.metadata or {}, env = opts.env or {},
    cwd = opts.cwd or "/", next_id = 1,
    -- the callbacks only, not the whole start options (kept by every idle
    -- box: docs/benchmarks.md, "Loop")
    hooks = { on_output = opts.on_output, on_exit = opts.on_exit, on_down = opts.on_down,
              on_watch = opts.on_watch },
    -- a microVM from another VM's memory: its agent may still send frames
    -- of that VM's session until the handshake (backend/microvm.lua)
    limits = opts.limits_info, pid = box:pid(), adopting = adopting or (box.from_memory and true) or nil,
    cred = opts.cred, recipe = opts.recipe,
    backend = opts.backend_impl.name, impl = opts.backend_impl,
    default_user = opts.default_user, home = opts.home, workdir = opts.workdir,
  }, Sandbox)
  box:on(function(t, id, f) self:_frame(t, id, f) end,
         function(reason) self:_down(reason) end)
  local ok, why = async.wait(function(cb)
    if not self.impl.awaits_ready(box, adopting) then return cb(true) end
    self._ready = cb
    self._ready_timer = uv.new_timer()
    self._ready_timer:start(self.impl.ready_timeout_ms, 0, function()
      -- a backend that can say what its box printed (a VM's QEMU and console)
      cb(false, "agent did not start in time" .. (self.impl.last_words and self.impl.last_words(box) or ""))
    end)
  end)
  self._ready = nil
  if self._ready_timer then self._ready_timer:close(); self._ready_timer = nil end
  if not ok then
    self:destroy()
    return nil, "sandbox " .. opts.id .. ": " .. tostring(why)
  end
  self.state = "running"
  local hok, herr = self.impl.handshake(self, opts, adopting)
  if not hok then
    local words = self.impl.last_words and self.impl.last_words(box) or ""
    self:destroy()
    return nil, "sandbox " .. opts.id .. ": " .. tostring(herr) .. words
  end
  -- the network relay: the agent binds its proxy, SOCKS and DNS ports
  -- before any box process runs (docs/network.md); a linux box's agent
  -- did before its READY (which said so), others do on NET_LISTEN.  An
  -- agent without it (a box an older daemon started) keeps working with
  -- no network.
  self.net = netrelay.new(self)
  if not self.net_listening then
    local nok, nerr = self:request(MSG.NET_LISTEN, {})
    if not nok then self.net_error = nerr end
  end
  return self
end

--- Starts a box and waits for its agent.  opts: backend (a name of
-- backend/registry.lua; nil: the default), state_dir and default_layer,
-- id, image (name), layers (the image's read-only layer dirs, lowest first),
-- dir, uid_base, id_count, cgroup, limits, env, metadata, cwd, on_exit(sb,
-- proc), on_output(sb, proc, stream, data), on_down(sb, reason).  Returns the
-- sandbox or nil, err.
function M.start(opts)
  opts.backend_impl = backends.get(opts.backend)
  local box, err = opts.backend_impl.start(opts)
  if not box then return nil, "start sandbox " .. opts.id .. ": " .. tostring(err) end
  -- a fault below (a bug: a backend's box without a method) must not leave
  -- a started box behind: its processes, cgroup and dir go, then the error
  -- goes on up as the internal error it is
  local ok, self, aerr = pcall(function()
    local sb, why = attach(box, opts)
    -- names resolve through the agent's DNS port, by the sandbox's rules:
    -- the box's set-up wrote its /etc/resolv.conf (a linux box whose
    -- image's /etc and file are no links), else the agent writes it (the
    -- same text as backends/api/backend.h's TP_RESOLV_CONF)
    if sb and not sb.net_error and not box:resolv() then
      local wok, werr = sb:request(MSG.FS_WRITE, { path = "/etc/resolv.conf", flags = 1 | 4, mode = 420,
                                                   data = "nameserver 127.0.0.1\n" })
      if not wok then sb.net_error = "cannot write /etc/resolv.conf: " .. tostring(werr) end
    end
    return sb, why
  end)
  if not ok then
    pcall(async.wait, function(cb) box:destroy(cb) end)
    error(self, 0)
  end
  return self, aerr
end

--- Re-adopts a box a previous daemon started (after a crash): reconnects to
-- its agent, which keeps its processes alive for a grace period, and learns
-- which processes still run.  opts as for start, plus pid (the agent's host
-- pid).  Returns the sandbox or nil, err.
function M.adopt(opts)
  opts.backend_impl = backends.get(opts.backend)
  -- opts.saved: the backend's part of the record (record().vm)
  local box, err = opts.backend_impl.adopt(opts)
  if not box then return nil, "adopt sandbox " .. opts.id .. ": " .. tostring(err) end
  -- a paused box's agent may be frozen too (a microVM's QEMU; a linux
  -- box's agent on a v1 freezer, which freezes the whole cgroup): thawed
  -- for the handshake, frozen again after
  local refreeze = opts.paused and box:has_cgroup()
  if refreeze then M.box_freeze(box, false) end
  local self, aerr = attach(box, opts, true)
  if not self then return nil, aerr end
  local r, perr = self:request(MSG.PS, {})
  self.adopting = nil
  if not r then
    self:destroy()
    return nil, "adopt sandbox " .. opts.id .. ": " .. tostring(perr)
  end
  for _, e in ipairs(r.entries or {}) do
    local pid = math.tointeger(e.pid)
    if pid and pid > 0 then
      -- no client owns them any more; they can be listed, signalled, killed
      self.procs[pid] = { pid = pid, argv = e.args or {}, cwd = "?", started_at = "?" }
    end
  end
  if refreeze then
    local fok, ferr = M.box_freeze(box, true)
    if not fok then
      self:destroy()
      return nil, "adopt sandbox " .. opts.id .. ": pause it again: " .. tostring(ferr)
    end
  end
  return self
end

--- What a restarted daemon needs to re-adopt this sandbox.  Its fields
-- are read with rawget, as Sandbox:info's are: none is a method, and an
-- unset one would go through the class's __index (a Lua function).
function Sandbox:record()
  local raw = rawget
  return { id = self.id, image = self.image, layers = raw(self, "layers"),
           image_digest = raw(self, "image_digest"), backend = self.backend,
           user = raw(self, "user"), created_at = self.created_at, metadata = raw(self, "metadata"),
           env = raw(self, "env"), cwd = raw(self, "cwd"), limits = raw(self, "limits"),
           pid = raw(self, "pid"),
           cgroup = raw(self, "cgroup"), timeout = raw(self, "timeout"), expires_at = raw(self, "expires_at"),
           paused = self.state == "paused" or nil,
           policy = raw(self, "policy_source"), cred = raw(self, "cred"), recipe = raw(self, "recipe"),
           network = raw(self, "network"), default_user = raw(self, "default_user"), home = raw(self, "home"),
           workdir = raw(self, "workdir"), volumes = raw(self, "volume_mounts"),
           -- the backend's own (a microVM's QEMU: what proves its pid is still it)
           vm = self.impl.record(self.box) }
end

--- Sets the network rules (a value netrules.compile takes), narrowed by
-- the `network` values of the policies that bind the sandbox: the next
-- connection and DNS query are judged by them.  Returns true or nil, err.
function Sandbox:set_network(spec, policy_nets)
  local rs, err = netrules.with_policies(spec, policy_nets)
  if not rs then return nil, err end
  if self.net_error and not netrules.is_none(rs) then
    return nil, "network relay unavailable: " .. self.net_error
  end
  self.net:set_rules(rs)
  self.network = spec
  return true
end

--- Proxy variables for processes of a sandbox with network rules.
function Sandbox:proxy_env()
  if not self.net or self.net_error or netrules.is_none(self.net.rules) then return {} end
  local http = ("http://127.0.0.1:%d"):format(core.NET.HTTP_PORT)
  local socks = ("socks5h://127.0.0.1:%d"):format(core.NET.SOCKS_PORT)
  local no = "localhost,127.0.0.1,::1"
  return { HTTP_PROXY = http, HTTPS_PROXY = http, ALL_PROXY = socks, NO_PROXY = no,
           http_proxy = http, https_proxy = http, all_proxy = socks, no_proxy = no }
end

function Sandbox:_frame(t, id, f)
  if t >= MSG.NET_OPEN and t <= MSG.NET_CONNECT then
    -- a re-adopted guest's agent may still send the dead daemon's streams' frames
    if self.adopting and self.impl.guest_kernel and not self.net then return end
    if id ~= 0 or not self.net then return self:_hostile("unexpected network frame") end
    return self.net:frame(t, f)
  elseif t == MSG.READY then
    -- what its agent takes of a download unacknowledged (net/relay.lua)
    self.net_window_down = (math.tointeger(f.flags) or 0) & core.NET.READY_DOWN ~= 0
    -- whether it hands a relayed stream's box socket over (NET_GIVE)
    self.net_give = (math.tointeger(f.flags) or 0) & core.NET.READY_FD ~= 0
    -- whether it looks an EXEC's USER up itself (agent_acct.c)
    self.exec_user = (math.tointeger(f.flags) or 0) & core.NET.READY_EXEC_USER ~= 0
    -- whether it hands an open file over (FS_OPEN: api_stream.lua's fs.*_fd)
    self.fs_fd = (math.tointeger(f.flags) or 0) & core.NET.READY_FS_FD ~= 0
    -- whether it listens on its network ports already (no NET_LISTEN)
    self.net_listening = (math.tointeger(f.flags) or 0) & core.NET.READY_LISTEN ~= 0
    if self._ready then
      if f.version ~= core.AGENT_PROTO then
        self._ready(false, "agent speaks protocol " .. tostring(f.version))
      else
        self._ready(true)
      end
    end
  elseif t == MSG.OK or t == MSG.ERR then
    local p = self.pending[id]
    -- a re-adopted guest's agent may answer what the dead daemon asked
    if not p and self.adopting and self.impl.guest_kernel then return end
    if not p then return self:_hostile("reply to an unknown request " .. id) end
    self.pending[id] = nil
    if next(self.pending) == nil then self.pending = nil end
    if t == MSG.OK then p.cb(f) else p.cb(nil, f.msg or "agent error", f.errno or 0) end
  elseif t == MSG.OUTPUT then
    local proc = self.procs[f.pid]
    if not proc and self.adopting then return end
    if not proc or type(f.data) ~= "string" or (f.stream ~= 1 and f.stream ~= 2) then
      return self:_hostile("bad output frame")
    end
    if self.hooks.on_output then self.hooks.on_output(self, proc, f.stream == 1 and "stdout" or "stderr", f.data) end
  elseif t == MSG.WATCH_EVENT then
    local kind = math.tointeger(f.event)
    if not math.tointeger(f.watch) or not kind or kind < 1 or kind > #M.WATCH_EVENTS
       or (f.name ~= nil and type(f.name) ~= "string") then
      return self:_hostile("bad watch event")
    end
    -- events of a watch being removed may still be on their way
    local w = self.watches[f.watch]
    if not w then return end
    if kind == 7 then self.watches[f.watch] = nil end
    if self.hooks.on_watch then
      self.hooks.on_watch(self, w, M.WATCH_EVENTS[kind], f.name or "", f.msg)
    end
  elseif t == MSG.EXIT then
    local proc = self.procs[f.pid]
    if not proc then
      -- while re-adopting, the agent reports what exited while no daemon
      -- listened, before we know its processes: nothing to tell anyone
      if self.adopting then return end
      return self:_hostile("exit of an unknown process")
    end
    self.procs[f.pid] = nil
    release(proc)
    if proc.streamed then -- its ring was kept in C, with its streams: it is ours from now on
      proc.ring, proc.ring_dropped = core.stream_proc_ring(self.box.core or self.box, f.pid, true)
    end
    proc.exit_code = math.tointeger(f.code) or -1
    proc.signal = math.tointeger(f.signal) or 0
    proc.oom_killed = self:_oom_killed(proc, f) or nil
    proc.ended_at = now_iso()
    if self.hooks.on_exit then self.hooks.on_exit(self, proc) end
    -- its tree once its exit is told: the client waits for no cgroup file
    self:_tree_done(proc)
    self:_keep_exited(proc)
  end
end

M.EXITED_KEEP = 16 -- exited processes kept per box, for `tupper logs` (docs/protocol.md)

-- An exited process is kept, ring, exit and command line, for logs and
-- process.connect: the last EXITED_KEEP of the box, each ring already at
-- most 64 KiB, until the box goes.  Nobody is attached to it any more.
function Sandbox:_keep_exited(proc)
  proc.owner, proc.listeners = nil, nil
  local list = self.exited
  for i = #list, 1, -1 do -- a pid the box reused: the older one goes
    if list[i].pid == proc.pid then table.remove(list, i) end
  end
  list[#list + 1] = proc
  while #list > M.EXITED_KEEP do table.remove(list, 1) end
end

--- The kept record of an exited process, or nil.
function Sandbox:exited_proc(pid)
  for _, proc in ipairs(self.exited) do
    if proc.pid == pid then return proc end
  end
end

-- The agent said something it must not: the box may be compromised.  It is
-- destroyed; clients see it go away.
function Sandbox:_hostile(why)
  io.stderr:write(("tupper: sandbox %s: agent protocol violation (%s): destroying it\n"):format(self.id, why))
  self:_down("agent protocol violation: " .. why)
end

function Sandbox:_down(reason)
  if self.state == "down" or self.state == "killing" then return end
  if self._ready then return self._ready(false, reason) end
  self.state = "down"
  self.down_reason = reason
  if self.net then self.net:close_all() end
  self:_fail_all(reason)
  if self.hooks.on_down then self.hooks.on_down(self, reason) end
end

function Sandbox:_fail_all(reason)
  local pending = self.pending
  self.pending = nil
  if self._due_timer then self._due_timer:close(); self._due_timer = nil end
  for _, p in pairs(pending) do
    p.cb(nil, "sandbox stopped: " .. reason, 0)
  end
  local watches = self.watches
  self.watches = nil
  for _, w in pairs(watches) do
    if self.hooks.on_watch then self.hooks.on_watch(self, w, "end", "", "sandbox stopped: " .. reason) end
  end
  local procs = self.procs
  self.procs = nil
  for _, proc in pairs(procs) do
    release(proc)
    proc.exit_code, proc.signal = -1, 9
    if self.hooks.on_exit then self.hooks.on_exit(self, proc) end
  end
end

--- Sends one request to the agent and waits for its reply: returns the
-- reply's fields, or nil, msg, errno (and, when it was not sent, the
-- send's errno fourth).  tree: a name from box:tree_take, whose cgroup fds
-- go with the frame (an EXEC with FLAGS TREE).
function Sandbox:request(type_, fields, tree)
  if self.state ~= "running" then return nil, "sandbox is " .. self.state, 0 end
  local id = self.next_id
  self.next_id = id < 0x7fffffff and id + 1 or 1
  local ok, err, code = self.box:send(type_, id, fields, tree)
  if not ok then return nil, err, 0, code end
  return async.wait(function(cb)
    local due = uv.now() + M.REQUEST_TIMEOUT_MS
    self.pending[id] = { cb = cb, due = due }
    self:_due_by(due)
  end)
end

-- The box's one deadline timer, for its requests to the agent and its
-- processes' timeouts (a luv timer each cost a start its making and
-- closing: docs/benchmarks.md, "`tupper exec ID -- true`"): each records
-- its due time (uv.now()'s clock), and the timer is armed for the earliest.
-- When it goes off it fails the requests past due, kills the processes past
-- theirs, and is armed again for the next; with nothing left to wait for it
-- is closed, so an idle box holds none.
function Sandbox:_due_by(due)
  local timer = self._due_timer
  if not timer then
    timer = uv.new_timer()
    self._due_timer = timer
  elseif timer:is_active() and self._due_at <= due then
    return
  end
  self._due_at = due
  timer:start(math.max(due - uv.now(), 0), 0, function() self:_due() end)
end

--- Kills proc (SIGKILL, its group too) ms from now, unless it has exited.
function Sandbox:kill_after(proc, ms)
  proc.kill_due = uv.now() + ms
  self:_due_by(proc.kill_due)
end

function Sandbox:_due()
  local now, next_due, late, killed = uv.now(), nil, nil, nil
  for id, p in pairs(rawget(self, "pending") or {}) do
    if p.due <= now then
      late = late or {}
      late[#late + 1] = id
    elseif not next_due or p.due < next_due then
      next_due = p.due
    end
  end
  for _, proc in pairs(rawget(self, "procs") or {}) do
    local due = proc.kill_due
    if due and due <= now then
      killed = killed or {}
      killed[#killed + 1] = proc
    elseif due and (not next_due or due < next_due) then
      next_due = due
    end
  end
  if next_due then
    self._due_at = next_due
    self._due_timer:start(next_due - now, 0, function() self:_due() end)
  else
    self._due_timer:close()
    self._due_timer = nil
  end
  if late then
    table.sort(late)
    for _, id in ipairs(late) do
      local pending = rawget(self, "pending")
      local p = pending and pending[id]
      if p then
        self.pending[id] = nil
        if next(self.pending) == nil then self.pending = nil end
        p.cb(nil, "the agent did not answer in time", 0)
      end
    end
  end
  for _, proc in ipairs(killed or {}) do
    proc.kill_due = nil
    proc.timed_out = true
    async.spawn(function() self:signal(proc, 9) end)
  end
end

M.USER_FILE_MAX = 1048576 -- /etc/passwd and /etc/group, read through the agent

-- A small file of the box, read through its agent (so inside its root):
-- its text, or nil, msg, errno (EFBIG past USER_FILE_MAX).
function Sandbox:_read_small(path)
  local out, offset = {}, 0
  while true do
    local r, err, errno = self:request(MSG.FS_READ, { path = path, offset = offset, length = core.CHUNK_MAX })
    if not r then return nil, err, errno end
    local data = type(r.data) == "string" and r.data or ""
    local size = math.tointeger(r.size) or 0
    out[#out + 1] = data
    offset = offset + #data
    if offset > M.USER_FILE_MAX or size > M.USER_FILE_MAX then
      return nil, ("%s is over %d bytes"):format(path, M.USER_FILE_MAX), 27
    end
    if #data == 0 or offset >= size then break end
  end
  return table.concat(out)
end

-- The fields of one passwd or group line.
local function colon_fields(line)
  local f = {}
  for part in (line .. ":"):gmatch("([^:]*):") do f[#f + 1] = part end
  return f
end

-- The entry of a passwd/group text whose name (field 1) or id (field 3) is key.
local function colon_entry(text, key, by_id)
  for line in (text or ""):gmatch("[^\n]+") do
    local f = colon_fields(line)
    if (by_id and f[3] == key) or (not by_id and f[1] == key) then return f end
  end
end

M.GROUPS_MAX = 64 -- TP_GROUPS_MAX: supplementary groups an account may have

-- p when it is an absolute path without ".", ".." or empty parts (a
-- trailing "/" dropped), else nil.
local function clean_abs(p)
  if p:sub(1, 1) ~= "/" or #p > 4096 then return nil end
  if p ~= "/" then p = p:gsub("/$", "") end
  if p:find("//", 1, true) then return nil end
  for part in p:gmatch("[^/]+") do
    if part == "." or part == ".." then return nil end
  end
  return p
end

-- An id field of the box's passwd or group file: an integer in 0..max, or nil.
local function id_field(s, max)
  local v = type(s) == "string" and s:match("^%d+$") and #s <= 10 and math.tointeger(tonumber(s))
  if v and v <= max then return v end
end

--- The account `user` of the box: a name, looked up in its /etc/passwd,
-- or an integer uid (then an entry is optional: without one the gid is the
-- uid and the home /).  The file comes from inside the box and is hostile:
-- read through the agent and bounded (USER_FILE_MAX), the matching line
-- validated: ids inside the box's range, a home that is a clean absolute
-- path, uid 0 only for the name root.  Supplementary groups are those of
-- /etc/group that list the name (at most GROUPS_MAX in all).  Returns
-- { uid, gid, groups, home, name } or nil, msg, errno (ENOENT: no such
-- account; EINVAL: the box's files are malformed for it).
function Sandbox:account(user)
  local by_id = math.type(user) == "integer"
  local label = by_id and ("uid %d"):format(user) or ("user '%s'"):format(tostring(user))
  local max = (self.id_count or 65536) - 1
  -- both files side by side: one agent round trip's wait, not two (the
  -- group file is read even where the answer does not need it)
  local passwd, err, errno, group, gerr, gerrno
  async.all({
    function() passwd, err, errno = self:_read_small("/etc/passwd") end,
    function() group, gerr, gerrno = self:_read_small("/etc/group") end,
  })
  -- root is uid 0 whatever the file says, so that a box whose /etc/passwd
  -- is missing or broken can still be repaired as root
  local root = { uid = 0, gid = 0, groups = { 0 }, home = "/root", name = "root" }
  if not passwd and user == "root" then return root end
  if not passwd then
    if not by_id or errno == 27 then
      return nil, ("%s: cannot read the box's /etc/passwd: %s"):format(label, tostring(err)), errno == 27 and 27 or 5
    end
    passwd = ""
  end
  if by_id and (user < 0 or user > max) then
    return nil, ("%s is outside the sandbox's ids 0..%d"):format(label, max), 22
  end
  local e = colon_entry(passwd, by_id and tostring(user) or user, by_id)
  if not e then
    if by_id then return { uid = user, gid = user, groups = { user }, home = "/" } end
    if user == "root" then return root end
    return nil, ("%s is not in the box's /etc/passwd"):format(label), 2
  end
  local uid, gid = id_field(e[3], max), id_field(e[4], max)
  if not uid or not gid then
    return nil, ("%s: its line in the box's /etc/passwd has a uid or gid that is not a number in 0..%d")
      :format(label, max), 22
  end
  if uid == 0 and e[1] ~= "root" then
    return nil, ("%s has uid 0 in the box's /etc/passwd: ask for 'root' to act as root"):format(label), 22
  end
  local home = e[6] or ""
  if home == "" then home = "/" end
  local clean = clean_abs(home)
  if not clean then
    return nil, ("%s: its home in the box's /etc/passwd is not a clean absolute path"):format(label), 22
  end
  local acct = { uid = uid, gid = gid, groups = { gid }, home = clean, name = e[1] }
  if group == nil then
    -- no /etc/group: the primary group only; one too big is an error, not
    -- a silent cut
    if gerrno == 27 then return nil, ("%s: %s"):format(label, gerr), 27 end
    return acct
  end
  local seen = { [gid] = true }
  for line in group:gmatch("[^\n]+") do
    local f = colon_fields(line)
    local g = id_field(f[3], max)
    if g and not seen[g] then
      for member in (f[4] or ""):gmatch("[^,]+") do
        if member == acct.name then
          if #acct.groups >= M.GROUPS_MAX then
            return nil, ("%s is in more than %d groups in the box's /etc/group"):format(label, M.GROUPS_MAX), 7
          end
          seen[g] = true
          acct.groups[#acct.groups + 1] = g
          break
        end
      end
    end
  end
  return acct
end

--- The agent fields that make a request act as acct (FS_*, WATCH_ADD,
-- EXEC): UID, GID and GROUPS (u32 each).  Adds them to fields; returns it.
function M.as_fields(fields, acct)
  if not acct then return fields end
  local groups = acct.groups or { acct.gid }
  fields.uid, fields.gid = acct.uid, acct.gid
  if #groups > 0 and #groups <= M.GROUPS_MAX then
    fields.groups = string.pack("<" .. ("I4"):rep(#groups), table.unpack(groups))
  end
  return fields
end

--- The image's User ("name", "uid", "name:group", "uid:gid") as uid, gid
-- and home, names looked up in the box's own /etc/passwd and /etc/group
-- at each process start (Docker's rule: a numeric uid missing from passwd
-- runs with gid 0).
function Sandbox:_resolve_user(spec)
  local user, group = spec:match("^([^:]+):?(.*)$")
  if not user then return nil, ("bad user '%s'"):format(spec) end
  local passwd = self:_read_small("/etc/passwd")
  local uid, gid, home
  local numeric = user:match("^%d+$")
  local e = colon_entry(passwd, user, numeric ~= nil)
  if numeric then
    uid = math.tointeger(tonumber(user))
    gid = e and math.tointeger(tonumber(e[4])) or 0
  elseif e then
    uid, gid = math.tointeger(tonumber(e[3])), math.tointeger(tonumber(e[4]))
  else
    return nil, ("user '%s' is not in the image's /etc/passwd"):format(user)
  end
  home = e and e[6] ~= "" and e[6] or nil
  if group ~= "" then
    if group:match("^%d+$") then
      gid = math.tointeger(tonumber(group))
    else
      local g = colon_entry(self:_read_small("/etc/group"), group, false)
      gid = g and math.tointeger(tonumber(g[3]))
      if not gid then return nil, ("group '%s' is not in the image's /etc/group"):format(group) end
    end
  end
  local max = (self.id_count or 65536) - 1
  if not uid or not gid or uid < 0 or gid < 0 or uid > max or gid > max then
    return nil, ("user '%s' is outside the sandbox's ids 0..%d"):format(spec, max)
  end
  return { uid = uid, gid = gid, home = home, name = not numeric and user or (e and e[1]) or nil }
end

--- Starts a process; returns the process record or nil, msg, errno.  With
-- a cgroup, the child sits in a cgroup of its own before it execs, so that
-- its whole tree (setsid and double-fork included) can be signalled and
-- killed: a spare one the box made ahead, whose fds go with the EXEC (one
-- round trip); when none is spare, the child is held until the daemon made
-- one and moved it there (EXEC, then RELEASE).
-- cred = { uid, gid, home, name } runs it as that user (default: the
-- sandbox's user, self.cred, from a recipe; else the image's User; else
-- root of the box); cred = { name, by_agent = true } has the agent look
-- the name up (Sandbox:account's rules) and start it in its home unless
-- cwd is given.  x (optional): pty = { cols, rows } for a terminal.
function Sandbox:exec(argv, env, cwd, stdin, owner, cred, x)
  if not cred and not self.cred and self.user then
    -- the image's User, looked up in the box's files at each start
    local uerr
    cred, uerr = self:_resolve_user(self.user)
    if not cred then return nil, "image user: " .. uerr, 0 end
  end
  cred = cred or self.cred
  x = x or {}
  local by_agent = cred and cred.by_agent
  -- by_agent: the agent adds HOME, USER and LOGNAME where env has none
  local home = not by_agent and (cred and cred.home or "/root") or nil
  local uname = not by_agent and cred and cred.name or nil
  -- a start without env of its own gets the list the last such start of
  -- this box made, while what it is made of is the same (the box's env,
  -- its network's rules, the account's home and name): about 0.7 KiB of
  -- tables and strings a start less (docs/benchmarks.md).  Nothing
  -- changes the list once made: it only goes into the EXEC's fields.
  local own = env ~= nil and next(env) ~= nil
  local net = self.net
  local rules, net_error = net and net.rules, self.net_error
  local kept = rawget(self, "_envl")
  local envl
  if not own and kept and kept.env == self.env and kept.net == net and kept.rules == rules
     and kept.net_error == net_error and kept.home == home and kept.uname == uname then
    envl = kept.list
  else
    envl = {}
    local merged = { PATH = paths.DEFAULT_PATH, HOME = home, HOSTNAME = self.id, TERM = "xterm",
                     USER = uname, LOGNAME = uname }
    for k, v in pairs(self:proxy_env()) do merged[k] = v end
    for k, v in pairs(self.env) do merged[k] = v end
    for k, v in pairs(env or {}) do merged[k] = v end
    for k, v in pairs(merged) do envl[#envl + 1] = k .. "=" .. v end
    table.sort(envl)
    if not own then
      self._envl = { env = self.env, net = net, rules = rules, net_error = net_error, home = home,
                     uname = uname, list = envl }
    end
  end
  -- a guest's processes are in its own kernel: no host cgroup per tree
  local hold = self.box:has_cgroup() and not self.impl.guest_kernel
  local tree = hold and self.box:tree_take() or nil
  local flags = (stdin and 1 or 0) | (x.pty and 4 or 0) | (x.credit and 16 or 0)
  local fields = { args = argv, env = envl, cwd = cwd or (not by_agent and self.cwd or nil),
                   flags = flags | (tree and 8 or 0), uid = cred and cred.uid, gid = cred and cred.gid,
                   user = by_agent and cred.name or nil }
  if cred and cred.groups then M.as_fields(fields, cred) end
  if x.pty then fields.cols, fields.rows = x.pty.cols, x.pty.rows end
  local r, err, errno, unsent
  if tree then
    r, err, errno, unsent = self:request(MSG.EXEC, fields, tree)
    if not r then
      -- no process is in it (a failed child was reaped before the reply)
      if self.box:has_cgroup() then self.box:tree_remove(tree, true) end
      tree = nil
      if unsent ~= 11 then return nil, err, errno end
      -- EAGAIN: the channel had other bytes queued, nothing was sent
    end
  end
  if not tree then
    fields.flags = flags | (hold and 2 or 0)
    r, err, errno = self:request(MSG.EXEC, fields)
  end
  if not r then return nil, err, errno end
  local pid = math.tointeger(r.pid)
  if not pid or pid < 1 or self.procs[pid] then
    self:_hostile("bad pid in exec reply")
    return nil, "agent sent a bad pid", 0
  end
  if by_agent and (math.type(r.uid) ~= "integer" or type(r.cwd) ~= "string") then
    self:_hostile("exec reply without the account's uid and cwd")
    return nil, "agent sent a bad exec reply", 0
  end
  local proc = { pid = pid, argv = argv, cwd = by_agent and r.cwd or cwd or self.cwd, owner = owner,
                 started_at = now_iso(), stdin = stdin or x.pty ~= nil, pty = x.pty ~= nil,
                 user = cred and (cred.name or tostring(cred.uid)) or "root", starting = true }
  self.procs[pid] = proc
  if tree then proc.tree = tree end -- removed with its tree, whatever comes next
  -- x.on_pid(proc): process streams bind here, before the channel's next
  -- frame (its output) is read; false: they could not, the process goes
  if x.on_pid and not x.on_pid(proc) then
    proc.owner = nil -- nobody learns of this pid: no notifications
    self:request(MSG.SIGNAL, { pid = pid, signal = 9 })
    return nil, "cannot bind the process's streams", 0
  end
  if not tree and hold then
    -- unique across daemon restarts: a re-adopted box keeps its old trees
    local tree = "p" .. pid .. "-" .. core.random_hex(4)
    -- in the thread pool: a v1 attach can take the kernel tens of ms
    local ok, terr = async.wait(function(cb)
      local q, qerr = self.box:tree(tree, pid, cb)
      if not q then cb(nil, qerr) end
    end)
    if not ok then
      proc.owner = nil -- nobody learns of this pid: no notifications
      self:request(MSG.SIGNAL, { pid = pid, signal = 9 })
      return nil, "cannot give the process its cgroup: " .. tostring(terr), 0
    end
    proc.tree = tree
    local rr, rerr, rerrno = self:request(MSG.RELEASE, { pid = pid })
    if not rr then
      proc.owner = nil
      return nil, rerr, rerrno
    end
  end
  proc.starting = nil -- listed from now on: its start is answered
  return proc
end

--- Has one spare process cgroup made in the thread pool now, ahead of the
-- box's first process, where the box has none (its start's job makes one:
-- runtime/host/dbox_life.c; none if that failed): a pooled box's first
-- start takes it, not the held way (one agent round trip, not two and a
-- cgroup made meanwhile).
function Sandbox:make_spares()
  if self.state == "running" and self.box:has_cgroup() and not self.impl.guest_kernel
     and self.box.tree_refill then
    self.box:tree_refill(1)
  end
end

--- Signals a process: its whole tree where it has a cgroup, else its
-- process group.  Returns true or nil, msg, errno.
function Sandbox:signal(proc, sig)
  if proc.tree and self.box:has_cgroup() and not self.impl.guest_kernel then
    local n, err
    if sig == 9 then -- v1 freezes, signals and waits: in the thread pool
      proc.tree_killed = true
      n, err = async.wait(function(cb)
        local q, qerr = self.box:tree_signal(proc.tree, sig, cb)
        if not q then cb(nil, qerr) end
      end)
    else
      n, err = self.box:tree_signal(proc.tree, sig)
    end
    if not n then return nil, err, 0 end
    return true
  end
  local r, err, errno = self:request(MSG.SIGNAL, { pid = proc.pid, signal = sig })
  if not r then return nil, err, errno end
  return true
end

-- Whether a process that just ended was killed by the OOM killer (its
-- memory limit): it died of SIGKILL (or, a shell's way, exited 137) and an
-- OOM kill was counted for it: in its tree's cgroup where a v1 tree has a
-- memory cgroup (a host without freezer and pids hierarchies), which counts
-- a kill in the victim's cgroup only; else (v2, where the tree has no memory
-- controller; v1, where it is in the freezer hierarchy only) in the box's
-- memory.events or memory.oom_control since the last process the daemon
-- found OOM-killed (two processes killed at once: the first to end is
-- told, as far as the kernel lets anyone tell).
-- A microVM's guest kernel kills on its own: its agent says so in the
-- EXIT frame (FLAGS TP_F_EXIT_OOM, from the guest's /proc/vmstat).
function Sandbox:_oom_killed(proc, f)
  if not (proc.signal == 9 or (proc.signal == 0 and proc.exit_code == 137)) then return false end
  if self.impl.guest_kernel then
    local flags = math.tointeger(f and f.flags) or 0
    if flags & 1 == 0 then return false end -- TP_F_EXIT_OOM
    self.guest_oom = (self.guest_oom or 0) + 1
    return true
  end
  if not proc.tree or not self.box:has_cgroup() or self.impl.guest_kernel then return false end
  local n = self.box:tree_oom(proc.tree)
  if n then return n > 0 end
  local st = self.box:stats()
  local total = st and st.oom_kills
  if not total or total <= (self.oom_seen or 0) then return false end
  self.oom_seen = total
  return true
end

-- A process ended: its tree's cgroup goes once nothing of the tree is left
-- (background children keep it until they end or the box is destroyed).
-- A tree killed whole (SIGKILL to its cgroup, Sandbox:signal) is empty
-- a moment after its first process's EXIT at the latest: what is left was
-- killed and is still dying, so it is looked at again, 20 ms apart, up to
-- M.TREE_DYING_MS.
M.TREE_DYING_MS = 2000
function Sandbox:_tree_done(proc)
  if not proc.tree or not self.box:has_cgroup() or self.impl.guest_kernel then return end
  local n = self.box:tree_count(proc.tree)
  if n ~= 0 then
    if n and proc.tree_killed and not proc.tree_dying then
      proc.tree_dying = true
      async.spawn(function()
        for _ = 1, M.TREE_DYING_MS // 20 do
          async.sleep(20)
          -- the box destroyed meanwhile (its destroy removed the tree)
          local ok, k = pcall(self.box.tree_count, self.box, proc.tree)
          if not ok or not k then return end
          if k == 0 then return self.box:tree_remove(proc.tree, true) end
        end
      end)
    end
    return
  end
  -- rmdirs in the thread pool, never here: an OOM kill the (empty) tree's
  -- cgroup counted (v1 counts it there only) moves to the box's count in
  -- the step that hides the cgroup from that count, on the loop, as the
  -- removal starts (dbox_tree.c hide_oom), so sandbox.metrics sees it
  -- exactly once before, during and after the removal.  An empty tree no
  -- kill touched (and without an OOM kill) becomes one of the box's spares
  -- again instead, while it is short of them (dbox_tree.c
  -- tp_dbox_tree_recycle): no rmdir, and no mkdir for the next start
  self.box:tree_remove(proc.tree, true, not proc.tree_killed)
end

--- Watches a directory for owner (a connection), as acct (an account, or
-- nil for root); returns the watch record
-- { id, path, owner } or nil, msg, errno.
function Sandbox:watch(path, recursive, owner, acct)
  local r, err, errno = self:request(MSG.WATCH_ADD, M.as_fields({ path = path, flags = recursive and 1 or 0 }, acct))
  if not r then return nil, err, errno end
  local id = math.tointeger(r.watch)
  if not id or id < 1 or self.watches[id] then
    self:_hostile("bad watch id in reply")
    return nil, "agent sent a bad watch id", 0
  end
  local w = { id = id, path = path, owner = owner }
  self.watches[id] = w
  return w
end

--- Stops a watch; returns true or nil, msg, errno.
function Sandbox:unwatch(w)
  if self.watches[w.id] ~= w then return true end
  self.watches[w.id] = nil
  local r, err, errno = self:request(MSG.WATCH_REMOVE, { watch = w.id })
  -- ENOENT: it had ended on its own meanwhile
  if not r and errno ~= 2 then return nil, err, errno end
  return true
end

--- Freezes (true) or thaws every process of the box.
--- Freezes or thaws box's cgroup (frozen: true or false) and waits until
-- the kernel says it is done, in the thread pool: a v1 freeze can wait up
-- to 5 s for a task caught in vfork (a v2 one for cgroup.events), and the
-- loop answers every other client meanwhile.  Outside a coroutine (none
-- of the daemon's callers), on the loop.  Returns true or nil, msg.
function M.box_freeze(box, frozen)
  if not coroutine.isyieldable() then return box:freeze(frozen) end
  return async.wait(function(cb)
    local q, qerr = box:freeze(frozen, cb)
    if not q then cb(nil, qerr) end
  end)
end

--- Waits while a freeze or thaw of this sandbox's box is in flight
-- (Sandbox:freeze): freezes of one box are serialized, and so is what
-- must see the box's state after one (a request to the box, a snapshot,
-- a kill).  Outside a coroutine (none of the daemon's callers) it cannot
-- wait, and does not.
function Sandbox:freeze_wait()
  while self.freezing and coroutine.isyieldable() do
    local q = self.freezing
    async.wait(function(cb) q[#q + 1] = cb end)
  end
end

--- Freezes or thaws the sandbox's box (M.box_freeze) after any freeze of
-- it in flight, as the one in flight now: on_ok(), if given, runs once it
-- is done, before anything that waited for it (a kill that must know
-- whether to thaw first).  Returns true or nil, msg (the sandbox killed
-- meanwhile included).
function Sandbox:gated_freeze(frozen, on_ok)
  self:freeze_wait()
  if self.state ~= "running" and self.state ~= "paused" then
    return nil, ("sandbox '%s' was killed"):format(self.id)
  end
  local waiting = {}
  self.freezing = waiting
  local ok, err = M.box_freeze(self.box, frozen)
  self.freezing = nil
  if ok and on_ok then on_ok() end
  for _, cb in ipairs(waiting) do cb() end
  if not ok then return nil, err end
  return true
end

--- Pauses (frozen true) or resumes the sandbox (Sandbox:gated_freeze).
-- Returns true or nil, msg.
function Sandbox:freeze(frozen)
  if not self.box:has_cgroup() then return nil, "pause needs cgroups, and this host has none usable" end
  return self:gated_freeze(frozen, function() self.state = frozen and "paused" or "running" end)
end

--- cgroup counters of the box, or nil, msg.  A microVM's oom_kills are
-- its guest kernel's (and any of QEMU's host cgroup).
function Sandbox:stats()
  if not self.box:has_cgroup() then return nil, "metrics need cgroups, and this host has none usable" end
  local st, err = self.box:stats()
  if st and self.impl.guest_kernel then st.oom_kills = (st.oom_kills or 0) + self:_guest_oom_kills() end
  return st, err
end

-- The guest's OOM kills: its /proc/vmstat oom_kill, read through the
-- agent (kills of processes the API did not start count too); else, when
-- the box's /proc does not say, the exits its agent reported as OOM kills.
function Sandbox:_guest_oom_kills()
  local n = self.guest_oom or 0
  if self.state ~= "running" then return n end
  local r = self:request(MSG.FS_READ, { path = "/proc/vmstat", offset = 0, length = 65536 })
  local v = r and type(r.data) == "string" and r.data:match("\noom_kill (%d+)\n")
  v = v and #v <= 15 and math.tointeger(tonumber(v))
  return v and math.max(v, n) or n
end

-- the limits of a box that has none (shared: info's tables are not changed)
local NO_LIMITS = {}

--- What sandbox.get and sandbox.list say of the box.  into: a table to
-- fill instead of a new one (every member is set, nil ones too: a table
-- filled before holds this box's info only).
-- Its fields are read with rawget: none of them is a method, and a field
-- that is unset would otherwise go through the class's __index (a Lua
-- function, util/lazy.lua) each time; sandbox.list reads them for every box
-- at each call.  An unused procs table is not made for it either.
function Sandbox:info(into)
  local raw = rawget
  local n = 0
  local procs = raw(self, "procs")
  if procs then for _ in pairs(procs) do n = n + 1 end end
  -- the deadline's text, made again only when it moves
  local exp = raw(self, "expires_at")
  if exp and exp ~= raw(self, "expires_for") then
    self.expires_for, self.expires_text = exp, os.date("!%Y-%m-%dT%H:%M:%SZ", exp)
  end
  local policy = raw(self, "policy_source")
  local t = into or {}
  t.id, t.image, t.backend, t.state, t.created_at = self.id, self.image, self.backend, self.state, self.created_at
  t.metadata, t.processes, t.limits = raw(self, "metadata"), n, raw(self, "limits") or NO_LIMITS
  t.timeout, t.policy = raw(self, "timeout") or 0, policy and policy.name
  t.recipe, t.default_user, t.home = raw(self, "recipe"), raw(self, "default_user"), raw(self, "home")
  t.workdir, t.network, t.volumes = raw(self, "workdir"), raw(self, "network") or "none", raw(self, "volume_mounts")
  t.persisted = raw(self, "persist") and true or nil -- paused to disk (daemon/pause.lua)
  t.expires_at = exp and raw(self, "expires_text") or nil
  return t
end

-- What Sandbox:info is made of, besides the count of its processes and its
-- policy's name: these fields, read raw (the deadline's text follows
-- expires_at).  A member that is a table (metadata, limits, recipe,
-- volume_mounts, policy_source, persist) is replaced when it changes, never
-- changed in place, so its identity says whether it changed.
local INFO_FIELDS = { "state", "id", "image", "backend", "created_at", "metadata", "limits", "timeout",
                      "policy_source", "recipe", "default_user", "home", "workdir", "network",
                      "volume_mounts", "persist", "expires_at" }
local fields_same = core.fields_same

local function procs_count(self)
  local procs, n = rawget(self, "procs"), 0
  if procs then for _ in pairs(procs) do n = n + 1 end end
  return n
end

--- What the box's info is made of now, for Sandbox:info_same: sandbox.list
-- keeps each box's entry with it (daemon/api.lua) and makes the entry
-- again only when the info would differ, without filling an info table
-- for each box at each call.
function Sandbox:info_inputs()
  local t = {}
  for _, k in ipairs(INFO_FIELDS) do t[k] = rawget(self, k) end
  local policy = rawget(self, "policy_source")
  t[1], t[2] = procs_count(self), policy and policy.name
  return t
end

--- Whether the box's info is still the one made from inputs (a table
-- Sandbox:info_inputs returned).  The fields are compared in C, in one call.
function Sandbox:info_same(inputs)
  local raw = rawget
  local procs, n = raw(self, "procs"), 0
  if procs then for _ in pairs(procs) do n = n + 1 end end
  if n ~= inputs[1] then return false end
  local policy = raw(self, "policy_source")
  if (policy and policy.name) ~= inputs[2] then return false end
  return fields_same(self, inputs, INFO_FIELDS)
end

--- Kills everything in the box and removes it; waits until done.
-- keep_upper: move the box's writable layer there first (recipe layers).
-- on_dead (not with keep_upper): called once every process of the box is
-- dead, before its files and cgroups are removed (it may not be called:
-- the end of the wait says it then).
function Sandbox:destroy(keep_upper, on_dead)
  if self.state == "killing" or self.state == "gone" then return true end
  local reason = "killed"
  -- a freeze in flight ends first: a box it froze is thawed below
  self:freeze_wait()
  if self.state == "killing" or self.state == "gone" then return true end
  -- a frozen task cannot die (snapshot_frozen: frozen by a snapshot's copy)
  local thaw = self.state == "paused" or self.snapshot_frozen
  self.state = "killing"
  if thaw then M.box_freeze(self.box, false) end
  if self.net then self.net:close_all() end
  self:_fail_all(reason)
  local ok, err = async.wait(function(cb) self.box:destroy(cb, keep_upper, on_dead) end)
  self.state = "gone"
  return ok, err
end

return M
