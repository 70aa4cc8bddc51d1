--- `tupper cp`: files and directory trees between the host and a box, and
-- tar streams (`-` as SRC or DST).  docs/cli.md describes the verb.
--
-- A copy is a stream of entries: { path = "a/b" (relative to the copy's
-- root, "" for the root itself), type = "file" | "dir" | "symlink" |
-- "hardlink" | "other", mode, mtime, size, link, copy = function(write) }.
-- Sources: a box's tree (through fs.stat/fs.list/fs.read), a host tree, a
-- tar stream.  Sinks: a host tree, a box's tree (fs.mkdir/fs.write/
-- fs.setattr/fs.symlink/fs.rename), a tar stream.  The box never runs a
-- tool of its own: any image works, with or without tar.
--
-- What comes out of a box is hostile: the host sink writes only below the
-- copy's root.  It checks every name (no "..", no absolute or empty names,
-- bounded lengths), never follows a symlink (each parent must be a real
-- directory: one the copy made or found), keeps a symlink only when its
-- target stays inside the copy, a hard link only to a file this copy
-- wrote, skips devices, FIFOs and sockets with a warning, drops setuid and
-- setgid bits, and stops past MAX_BYTES or MAX_ENTRIES.  Every file is
-- written under a temporary name beside its target and renamed over it
-- once whole, on both sides, so an interrupted copy leaves no truncated
-- file where one was asked for.
local uv = require("luv")
-- tupper.core is the binary's (the fd calls below); the specs load this file in plain Lua
local core = package.loaded["tupper.core"] or select(2, pcall(require, "tupper.core"))
if type(core) ~= "table" then core = nil end
local json = require("tupper.util.json")
local async = require("tupper.util.async")
local b64 = require("tupper.util.b64")
local schema = require("tupper.wire.schema")
local cli_tty = require("tupper.client.cli_tty")
local stream = require("tupper.wire.stream")

local M = {}

M.CHUNK = schema.methods["fs.read"].params.length.max -- bytes per fs.read/fs.write
M.NAME_MAX = 255
M.PATH_MAX = 4096
M.DEPTH_MAX = 256
M.MAX_ENTRIES = 1000000
M.MAX_BYTES = 16 * 1024 * 1024 * 1024 -- of one copy out of a box (a sparse file is not a reason to fill the host)

local function errmsg(e) return type(e) == "table" and tostring(e.message) or tostring(e) end

-- A name for warnings: what a box chose is shown, never obeyed by the terminal.
local function shown(s) return cli_tty.escape(s) .. cli_tty.flush(cli_tty.new_state()) end

local function warn(fmt, ...)
  io.stderr:write("tupper: cp: ", fmt:format(...), "\n")
end

M.FD_CALL_TIMEOUT_MS = 120000 -- how long an fs.*_fd call may take (the box's own open)

--- The box's file at params.path opened by its agent and handed over
-- (fs.read_fd or fs.write_fd: docs/protocol.md, "Files as descriptors"),
-- on a connection of the CLI's own: the control connection is luv's,
-- whose reads would drop the fd.  Returns the open file (a core file) and
-- the reply's result; nil where the daemon, the box or this connection
-- cannot (the caller then uses the streams: an older daemon, a microVM, a
-- busy channel; TUPPER_FILE_FDS=0 asks for the streams); or false and the
-- daemon's error object (the open itself failed: ENOENT, EACCES...).
function M.fd_open(c, method, params)
  if not core or c.no_fds or not (c.server and c.server.file_fds == 1) or os.getenv("TUPPER_FILE_FDS") == "0" then
    return nil
  end
  if not c.fd_sock then
    local sock = core.fd_connect(c.socket)
    if not sock then c.no_fds = true; return nil end
    c.fd_sock, c.fd_id = sock, 0
  end
  c.fd_id = c.fd_id + 1
  local line, f = core.fd_call(c.fd_sock, json.encode({ jsonrpc = "2.0", id = c.fd_id, method = method,
    params = params }) .. "\n", M.FD_CALL_TIMEOUT_MS)
  local msg = line and json.decode(line)
  if type(msg) ~= "table" or math.tointeger(msg.id) ~= c.fd_id then
    -- the connection is out of step (or gone): not used again
    if f then f:close() end
    c.fd_sock:close()
    c.fd_sock, c.no_fds = nil, true
    return nil
  end
  if msg.error ~= nil then
    if f then f:close() end
    if type(msg.error) ~= "table" or (type(msg.error.data) == "table" and msg.error.data.fallback) then
      return nil
    end
    return false, msg.error
  end
  if not f or type(msg.result) ~= "table" then
    if f then f:close() end
    return nil
  end
  return f, msg.result
end

--- Closes the connection of M.fd_open.
function M.fd_close(c)
  if c.fd_sock then c.fd_sock:close(); c.fd_sock = nil end
end

M.COPY_STEP = 64 * 1024 * 1024 -- bytes copied between two turns of the loop (a Ctrl-C is taken there)

-- One turn of the loop (its signals read) before the caller goes on: an
-- idle handle, since a timer of 0 ms started from a timer runs in the same
-- turn, before the loop polls.
local function loop_turn()
  async.wait(function(cb)
    local i = uv.new_idle()
    i:start(function() i:stop(); i:close(); cb() end)
  end)
end

-- core.file_copy from src to dst in steps, at most limit bytes (nil: to
-- src's end): the bytes copied, or nil, msg, errno, side.
local function copy_fd(src, dst, limit)
  local total = 0
  while true do
    local step = limit and math.min(M.COPY_STEP, limit - total) or M.COPY_STEP
    if step <= 0 then return total end
    local n, err, errno, side = core.file_copy(src, dst, step)
    if not n then return nil, err, errno, side end
    total = total + n
    if n < step then return total end
    loop_turn()
  end
end

-- An error of core.file_copy as the streams would say it.
local function copy_error(err, errno)
  local names = { [28] = "No space left on device", [122] = "Disk quota exceeded", [27] = "File too large" }
  return names[errno] or tostring(err)
end

--- The components of a relative entry path, or nil and why not.  A tar's
-- leading "./" is dropped; nothing else is forgiven.
function M.check_path(path)
  if type(path) ~= "string" then return nil, "not a name" end
  if path:find("\0", 1, true) then return nil, "a NUL byte in a name" end
  if #path > M.PATH_MAX then return nil, "a name longer than " .. M.PATH_MAX .. " bytes" end
  if path:sub(1, 1) == "/" then return nil, "an absolute name" end
  local parts = {}
  for comp in path:gmatch("[^/]+") do
    if comp == ".." then return nil, "a name with '..'" end
    if #comp > M.NAME_MAX then return nil, "a name component longer than " .. M.NAME_MAX .. " bytes" end
    if comp ~= "." then parts[#parts + 1] = comp end
  end
  if #parts > M.DEPTH_MAX then return nil, "more than " .. M.DEPTH_MAX .. " levels" end
  return parts
end

--- Does a symlink at components `parts` (of the copy) with target `link`
-- stay inside the copy?  Only relative targets whose ".." all lead and
-- climb no higher than the link's own directory qualify: a ".." after
-- another name could come after a symlink, where the kernel's ".." and a
-- lexical one part.
function M.link_inside(parts, link)
  if type(link) ~= "string" or link == "" or link:sub(1, 1) == "/" or link:find("\0", 1, true) then return false end
  if #link > M.PATH_MAX then return false end
  local up, named = 0, false
  for comp in link:gmatch("[^/]+") do
    if comp == ".." then
      if named then return false end
      up = up + 1
    elseif comp ~= "." then
      named = true
    end
  end
  return up <= #parts - 1
end

local function tmp_name(dir, base)
  local r = uv.random(6)
  local hexs = r and r:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end) or tostring(os.time())
  return dir .. "/." .. base:sub(1, 200) .. ".tupper-" .. hexs
end

local function join(a, b)
  if b == "" then return a end
  if a == "" then return b end
  if a:sub(-1) == "/" then return a .. b end
  return a .. "/" .. b
end

local function basename(p)
  return p:gsub("/+$", ""):match("([^/]*)$")
end

local function dirname(p)
  p = p:gsub("/+$", "")
  local d = p:match("^(.*)/[^/]*$")
  if d == nil then return "." end
  if d == "" then return "/" end
  return d
end

-- ---- interrupts --------------------------------------------------------------

-- Temporary files in flight (host paths, and box paths with their box), so
-- that ^C removes them before the CLI ends.
local inflight = { host = {}, box = {} }

local function guard_signals(c)
  local sigs = {}
  for _, name in ipairs({ "sigint", "sigterm", "sighup" }) do
    local s = uv.new_signal()
    s:start(name, function(signame)
      for p in pairs(inflight.host) do uv.fs_unlink(p) end
      async.spawn(function()
        for p, sb in pairs(inflight.box) do c:call("fs.remove", { sandbox = sb, path = p }) end
        io.stderr:write("tupper: cp: interrupted; nothing half-written was left in place\n")
        os.exit(128 + (signame == "sigint" and 2 or signame == "sigterm" and 15 or 1))
      end)
    end)
    sigs[#sigs + 1] = s
  end
  return function() for _, s in ipairs(sigs) do s:close() end end
end

-- ---- sources -------------------------------------------------------------------

--- fs.stat of path in box sid, following symlinks (SRC itself is followed,
-- as on the host; symlinks below it are copied as symlinks): the path
-- reached and its stat.  Raises a string.
function M.box_follow(c, sid, path)
  local st, err = c:call("fs.stat", { sandbox = sid, path = path })
  if not st then error(errmsg(err), 0) end
  local hops = 0
  while st.type == "symlink" do
    hops = hops + 1
    if hops > 40 or type(st.link) ~= "string" or st.link == "" then
      error(("%s: too many levels of symbolic links"):format(shown(path)), 0)
    end
    path = st.link:sub(1, 1) == "/" and st.link or join(dirname(path), st.link)
    st, err = c:call("fs.stat", { sandbox = sid, path = path })
    if not st then error(("%s: %s"):format(shown(path), errmsg(err)), 0) end
  end
  return path, st
end

--- The entries of a box's tree at path (a file: one entry), in pre-order,
-- passed to emit(entry) one by one; raises a string on a failed call.  Entries are counted
-- and each file is read no further than the size it was listed with.
function M.box_source(c, sid, root, recursive)
  return function(emit)
    local st
    root, st = M.box_follow(c, sid, root)
    local count = 0
    local function file_copy(path, size)
      return function(write)
        if c.data_conn then -- binary frames, no base64 (docs/protocol.md, "Stream frames")
          local n, e = c.data_conn:read_file(c, { sandbox = sid, path = path, length = size },
            function(data) write(data); return true end)
          if not n then error(("read %s: %s"):format(shown(path), errmsg(e)), 0) end
          return
        end
        local offset = 0
        while offset < size do
          local r, e = c:call("fs.read", { sandbox = sid, path = path, offset = offset,
            length = math.min(M.CHUNK, size - offset) })
          if not r then error(("read %s: %s"):format(shown(path), errmsg(e)), 0) end
          local data = b64.decode(r.data or "") or ""
          if #data == 0 then break end -- shrank meanwhile
          if #data > size - offset then data = data:sub(1, size - offset) end
          write(data)
          offset = offset + #data
        end
      end
    end
    -- a file's bytes straight to a host fd, in C (the data connection's
    -- pump): the bytes written, or raises a string
    local function file_copy_fd(path, size)
      return function(fd)
        -- the box's file itself, from its agent: copied here, at most size bytes
        local f, r = M.fd_open(c, "fs.read_fd", { sandbox = sid, path = path })
        if f == false then error(("read %s: %s"):format(shown(path), errmsg(r)), 0) end
        if f then
          local n, cerr, errno, side = copy_fd(f, fd, size)
          f:close()
          if not n then
            if side == "read" then error(("read %s: %s"):format(shown(path), copy_error(cerr, errno)), 0) end
            error(copy_error(cerr, errno), 0)
          end
          return n
        end
        local n, e = c.data_conn:read_file(c, { sandbox = sid, path = path, length = size }, fd, size)
        if not n then
          if e.loc then error(errmsg(e), 0) end
          error(("read %s: %s"):format(shown(path), errmsg(e)), 0)
        end
        return n
      end
    end
    local function entry(rel, path, e)
      local size = math.tointeger(e.size) or 0
      local ent = { path = rel, type = e.type, mode = math.tointeger(e.mode) or 420,
                    mtime = math.tointeger(e.mtime), size = size }
      if e.type == "file" then
        ent.copy = file_copy(path, size)
        if c.data_conn then ent.copy_fd = file_copy_fd(path, size) end
      elseif e.type == "symlink" then
        local ls = e.link and e or c:call("fs.stat", { sandbox = sid, path = path })
        ent.link = ls and ls.link
      end
      return ent
    end
    if st.type == "dir" and not recursive then
      error(("%s is a directory: use -r"):format(shown(root)), 0)
    end
    local function walk(rel, path, e, depth)
      count = count + 1
      if count > M.MAX_ENTRIES then error(("more than %d entries"):format(M.MAX_ENTRIES), 0) end
      emit(entry(rel, path, e))
      if e.type ~= "dir" then return end
      if depth >= M.DEPTH_MAX then error(("%s: more than %d levels"):format(shown(path), M.DEPTH_MAX), 0) end
      local l, lerr = c:call("fs.list", { sandbox = sid, path = path })
      if not l then error(("list %s: %s"):format(shown(path), errmsg(lerr)), 0) end
      if l.truncated then error(("%s has more entries than one listing holds"):format(shown(path)), 0) end
      for _, sub in ipairs(l.entries) do
        walk(join(rel, sub.name), join(path, sub.name), sub, depth + 1)
      end
    end
    walk("", root, st, 0)
  end
end

--- The entries of a host tree at path, in pre-order (symlinks below the
-- root are entries, never followed; the root itself is followed).
function M.host_source(root, recursive)
  return function(emit)
    local st, err = uv.fs_stat(root)
    if not st then error(err, 0) end
    if st.type == "directory" and not recursive then error(("%s is a directory: use -r"):format(root), 0) end
    local function entry(rel, path, s)
      local t = s.type == "directory" and "dir" or s.type == "file" and "file" or s.type == "link" and "symlink" or "other"
      local ent = { path = rel, type = t, mode = s.mode & 4095, mtime = s.mtime.sec, size = s.size }
      if t == "symlink" then ent.link = uv.fs_readlink(path) end
      if t == "file" then
        ent.open = function() return uv.fs_open(path, "r", 0) end
        ent.copy = function(write)
          local fd, oerr = uv.fs_open(path, "r", 0)
          if not fd then error(oerr, 0) end
          local offset = 0
          while true do
            local data, rerr = uv.fs_read(fd, M.CHUNK, offset)
            if not data then uv.fs_close(fd); error(rerr, 0) end
            if #data == 0 then break end
            write(data)
            offset = offset + #data
          end
          uv.fs_close(fd)
        end
      end
      return ent
    end
    local function walk(rel, path, s)
      emit(entry(rel, path, s))
      if s.type ~= "directory" then return end
      local names = {}
      local h, serr = uv.fs_scandir(path)
      if not h then error(serr, 0) end
      while true do
        local name = uv.fs_scandir_next(h)
        if not name then break end
        names[#names + 1] = name
      end
      table.sort(names)
      for _, name in ipairs(names) do
        local p = join(path, name)
        local ls = uv.fs_lstat(p)
        if ls then walk(join(rel, name), p, ls) end
      end
    end
    walk("", root, st)
  end
end

-- ---- sinks ------------------------------------------------------------------------

--- Writes entries below dest on the host (dest is the copy's root: made
-- when missing, merged into when a directory).  Returns the number of
-- entries written, or raises a string.  See the module's doc for what is
-- refused; refusals of single entries are warnings, the copy goes on.
function M.host_sink(dest, opts)
  opts = opts or {}
  local max_bytes = opts.max_bytes or M.MAX_BYTES
  local total, written = 0, 0
  local dirs = {}    -- rel path -> true: a real directory (made or checked)
  local files = {}   -- rel path -> true: a file this copy wrote (hard link targets)
  local fixups, fixups_by = {}, {} -- directories' modes and times, applied last (deepest first)
  local skipped = 0
  local function skip(ent, why)
    skipped = skipped + 1
    warn("skipped %s: %s", shown(ent.path == "" and "." or ent.path), why)
  end
  -- the real directory of rel (parts 1..n), made when missing
  local function ensure_dir(parts, n)
    local rel = table.concat(parts, "/", 1, n)
    if dirs[rel] then return true end
    if n > 0 then
      local ok, err = ensure_dir(parts, n - 1)
      if not ok then return false, err end
    end
    local path = join(dest, rel)
    local st = uv.fs_lstat(path)
    if not st then
      local ok, err = uv.fs_mkdir(path, 448) -- 0700 while we fill it
      if not ok then return false, err end
      st = uv.fs_lstat(path)
      local fx = { path = path, mode = 493 }
      fixups[#fixups + 1] = fx
      fixups_by[path] = fx
    end
    if not st or st.type ~= "directory" then
      return false, ("%s is not a directory (a symlink is never followed)"):format(shown(rel == "" and dest or rel))
    end
    dirs[rel] = true
    return true
  end
  -- writes data from ent at a temporary name beside target, then renames
  local function place(target, make)
    local st = uv.fs_lstat(target)
    if st and st.type == "directory" then return false, "a directory is in the way" end
    local tmp = tmp_name(dirname(target), basename(target))
    inflight.host[tmp] = true
    local ok, err = pcall(make, tmp)
    if ok and err ~= false then
      local rok, rerr = uv.fs_rename(tmp, target)
      if rok then inflight.host[tmp] = nil; return true end
      err = rerr
    end
    uv.fs_unlink(tmp)
    inflight.host[tmp] = nil
    return false, err
  end
  local sink = {}
  function sink.put(ent)
    written = written + 1
    if written > M.MAX_ENTRIES then error(("more than %d entries"):format(M.MAX_ENTRIES), 0) end
    local parts, perr = M.check_path(ent.path)
    if not parts then
      skip(ent, perr)
    elseif ent.type == "dir" then
      local ok, err = ensure_dir(parts, #parts)
      if not ok then
        if #parts == 0 then error(err, 0) end
        skip(ent, err)
      else
        -- a directory this copy made takes the entry's mode and time; one
        -- that was there (a merge) keeps its own
        local fx = fixups_by[join(dest, table.concat(parts, "/"))]
        if fx then fx.mode, fx.mtime = (ent.mode or 493) & 1023, ent.mtime end
        if (ent.mode or 0) & 3072 ~= 0 then warn("%s: setuid/setgid bits dropped", shown(ent.path ~= "" and ent.path or basename(dest))) end
      end
    else
      local ok, err = true, nil
      if #parts == 0 and (ent.type == "file" or ent.type == "symlink") then
        -- the copy is one file: dest names it
      else
        ok, err = ensure_dir(parts, #parts - 1)
      end
      local rel = table.concat(parts, "/")
      local target = #parts == 0 and dest or join(dest, rel)
      if not ok then
        skip(ent, err)
      elseif ent.type == "file" then
        local size = math.tointeger(ent.size) or 0
        if size < 0 or total + size > max_bytes then
          error(("%s: the copy would pass %d bytes"):format(shown(ent.path), max_bytes), 0)
        end
        local mode = (ent.mode or 420) & 1023
        if (ent.mode or 0) & 3072 ~= 0 then warn("%s: setuid/setgid bits dropped", shown(ent.path ~= "" and ent.path or basename(dest))) end
        local pok, perr2 = place(target, function(tmp)
          local fd, oerr = uv.fs_open(tmp, "wx", 384) -- O_EXCL: never through a link
          if not fd then error(oerr, 0) end
          local offset = 0
          local wok, werr
          if ent.copy_fd then -- the bytes go to fd in C, no more than size of them
            wok, werr = pcall(function() offset = ent.copy_fd(fd) end)
          else
            wok, werr = pcall(ent.copy or function() end, function(data)
              if offset + #data > size then error(("%s grew past its listed size"):format(shown(ent.path)), 0) end
              local n, e = uv.fs_write(fd, data, offset)
              if not n then error(e, 0) end
              offset = offset + #data
            end)
          end
          if wok then
            uv.fs_fchmod(fd, mode)
            if ent.mtime then uv.fs_futime(fd, ent.mtime, ent.mtime) end
          end
          uv.fs_close(fd)
          if not wok then error(werr, 0) end
          total = total + offset
        end)
        if not pok then error(("%s: %s"):format(shown(ent.path ~= "" and ent.path or basename(dest)), tostring(perr2)), 0) end
        files[rel] = true
      elseif ent.type == "symlink" then
        if not M.link_inside(parts, ent.link) then
          skip(ent, ("a symlink to %s, outside the copy"):format(shown(tostring(ent.link))))
        else
          local pok, perr2 = place(target, function(tmp)
            local lok, lerr = uv.fs_symlink(ent.link, tmp)
            if not lok then error(lerr, 0) end
          end)
          if not pok then skip(ent, tostring(perr2)) else files[rel] = nil end
        end
      elseif ent.type == "hardlink" then
        local lparts = M.check_path(ent.link or "")
        local lrel = lparts and table.concat(lparts, "/")
        if not lrel or not files[lrel] then
          skip(ent, ("a hard link to %s, not a file of this copy"):format(shown(tostring(ent.link))))
        else
          local pok, perr2 = place(target, function(tmp)
            local lok, lerr = uv.fs_link(join(dest, lrel), tmp)
            if not lok then error(lerr, 0) end
          end)
          if not pok then skip(ent, tostring(perr2)) else files[rel] = true end
        end
      else
        skip(ent, "not a file, directory or symlink (a device, FIFO or socket)")
      end
    end
  end
  -- deepest first, so a read-only directory is filled before it closes
  function sink.finish()
    table.sort(fixups, function(a, b) return #a.path > #b.path end)
    for _, f in ipairs(fixups) do
      uv.fs_chmod(f.path, f.mode)
      if f.mtime then uv.fs_utime(f.path, f.mtime, f.mtime) end
    end
    return written, skipped
  end
  return sink
end

--- Writes entries below dest in box sid through the daemon (dest: the
-- copy's root, made when missing, merged into when a directory).  The
-- box's own isolation bounds what a name can reach; names are checked all
-- the same.  archive keeps setuid/setgid bits, which are dropped otherwise.
function M.box_sink(c, sid, dest, archive)
  local fixups, n = {}, 0
  local function call(method, params)
    params.sandbox = sid
    local r, err = c:call(method, params)
    if not r then error(("%s: %s"):format(method, errmsg(err)), 0) end
    return r
  end
  -- fs.setattr takes no time before the epoch
  local function time_of(ent) return ent.mtime and math.max(ent.mtime, 0) end
  local function mode_of(ent, def)
    local m = (ent.mode or def) & 4095
    if not archive then m = m & 1023 end
    return m
  end
  local function place(target, make)
    local tmp = tmp_name(dirname(target), basename(target))
    inflight.box[tmp] = sid
    local ok, err = pcall(make, tmp)
    if ok then
      local r, rerr = c:call("fs.rename", { sandbox = sid, from = tmp, to = target })
      if r then inflight.box[tmp] = nil; return end
      err = errmsg(rerr)
    end
    c:call("fs.remove", { sandbox = sid, path = tmp })
    inflight.box[tmp] = nil
    error(("%s: %s"):format(target, tostring(err)), 0)
  end
  local sink = {}
  function sink.put(ent)
    n = n + 1
    local parts, perr = M.check_path(ent.path)
    if not parts then error(("%s: %s"):format(shown(tostring(ent.path)), perr), 0) end
    local target = join(dest, table.concat(parts, "/"))
    if ent.type == "dir" then
      call("fs.mkdir", { path = target, parents = #parts == 0, mode = 448 })
      fixups[#fixups + 1] = { path = target, mode = mode_of(ent, 493), mtime = time_of(ent) }
    elseif ent.type == "file" then
      place(target, function(tmp)
        local offset, wrote = 0, false
        local f, fr
        if ent.open then -- the box's file itself, from its agent: the host file is copied into it here
          f, fr = M.fd_open(c, "fs.write_fd", { sandbox = sid, path = tmp, mode = 384 })
          if f == false then error(("write %s: %s"):format(shown(target), errmsg(fr)), 0) end
        end
        if f then
          local fd, oerr = ent.open()
          if not fd then f:close(); error(oerr, 0) end
          local n, cerr, errno, side = copy_fd(fd, f)
          uv.fs_close(fd)
          f:close()
          if not n then
            if side == "read" then error(("read %s: %s"):format(ent.path, copy_error(cerr, errno)), 0) end
            error(("write %s: %s"):format(shown(target), copy_error(cerr, errno)), 0)
          end
          wrote = true
        elseif c.data_conn and ent.open then -- a host file: its bytes go from C
          local fd, oerr = ent.open()
          if not fd then error(oerr, 0) end
          local w, e = c.data_conn:writer(c, { sandbox = sid, path = tmp, mode = 384 })
          if not w then uv.fs_close(fd); error(("fs.write_stream: %s"):format(errmsg(e)), 0) end
          local n, fe = w:pump(fd)
          uv.fs_close(fd)
          if not n then
            if fe.loc then error(("read %s: %s"):format(ent.path, errmsg(fe)), 0) end
            error(("write %s: %s"):format(shown(target), errmsg(fe)), 0)
          end
          wrote = true
        elseif c.data_conn then
          local w, e = c.data_conn:writer(c, { sandbox = sid, path = tmp, mode = 384 })
          if not w then error(("fs.write_stream: %s"):format(errmsg(e)), 0) end
          ent.copy(function(data)
            local ok, we = w:write(data)
            if not ok then error(("write %s: %s"):format(shown(target), errmsg(we)), 0) end
          end)
          local n, fe = w:finish()
          if not n then error(("write %s: %s"):format(shown(target), errmsg(fe)), 0) end
          wrote = true
        end
        if not wrote then ent.copy(function(data)
          call("fs.write", { path = tmp, data = b64.encode(data), offset = offset, mode = 384, truncate = offset == 0 })
          offset, wrote = offset + #data, true
        end) end
        if not wrote then call("fs.write", { path = tmp, data = "", offset = 0, mode = 384, truncate = true }) end
        call("fs.setattr", { path = tmp, mode = mode_of(ent, 420), mtime = time_of(ent) })
      end)
    elseif ent.type == "symlink" and type(ent.link) == "string" and ent.link ~= "" then
      place(target, function(tmp)
        call("fs.symlink", { path = tmp, target = ent.link })
        if ent.mtime then call("fs.setattr", { path = tmp, mtime = time_of(ent) }) end
      end)
    else
      warn("skipped %s: not a file, directory or symlink", shown(ent.path == "" and "." or ent.path))
    end
  end
  function sink.finish()
    table.sort(fixups, function(a, b) return #a.path > #b.path end)
    for _, f in ipairs(fixups) do call("fs.setattr", { path = f.path, mode = f.mode, mtime = f.mtime }) end
    return n
  end
  return sink
end

-- ---- tar streams (ustar, with pax headers for long names and big sizes) -----------

local BLOCK = 512
M.TAR_META_MAX = 1048576 -- bytes of one pax or GNU long-name header

local function octal(v, width)
  return ("%0" .. (width - 1) .. "o"):format(v) .. "\0"
end

local function pax_record(key, value)
  local body = " " .. key .. "=" .. value .. "\n"
  local n = #body + 1
  while #tostring(n) + #body ~= n do n = #tostring(n) + #body end
  return n .. body
end

local function header(name, mode, size, mtime, flag, link)
  local h = name:sub(1, 100) .. ("\0"):rep(100 - math.min(#name, 100))
    .. octal(mode, 8) .. octal(0, 8) .. octal(0, 8) .. octal(size, 12) .. octal(math.max(mtime, 0), 12)
    .. "        " .. flag .. link:sub(1, 100) .. ("\0"):rep(100 - math.min(#link, 100))
    .. "ustar\0" .. "00" .. ("\0"):rep(32 + 32 + 8 + 8 + 155 + 12)
  local sum = 0
  for k = 1, #h do sum = sum + h:byte(k) end
  return h:sub(1, 148) .. ("%06o\0 "):format(sum) .. h:sub(157)
end

--- A tar writer over out(bytes): add(entry) for the entries of a copy
-- (hard links and "other" entries are left out), finish() for the end.
function M.tar_writer(out)
  local w = {}
  function w.add(ent)
    local flag, size, link = "0", 0, ""
    local name = ent.path
    if ent.type == "dir" then flag, name = "5", name .. "/"
    elseif ent.type == "symlink" then flag, link = "2", tostring(ent.link or "")
    elseif ent.type == "file" then size = math.tointeger(ent.size) or 0
    else return false end
    local mtime = math.tointeger(ent.mtime) or 0
    local pax = {}
    if #name > 100 then pax[#pax + 1] = pax_record("path", name) end
    if #link > 100 then pax[#pax + 1] = pax_record("linkpath", link) end
    if size > 8589934591 then pax[#pax + 1] = pax_record("size", tostring(size)) end
    if #pax > 0 then
      local body = table.concat(pax)
      out(header("././@PaxHeader", 420, #body, mtime, "x", ""))
      out(body .. ("\0"):rep((BLOCK - #body % BLOCK) % BLOCK))
    end
    out(header(name, (ent.mode or 420) & 4095, size > 8589934591 and 0 or size, mtime, flag, link))
    if flag == "0" then
      local done = 0
      if ent.copy then
        ent.copy(function(data)
          if done + #data > size then data = data:sub(1, size - done) end
          out(data)
          done = done + #data
        end)
      end
      if done < size then out(("\0"):rep(size - done)) end -- it shrank: the header said size
      out(("\0"):rep((BLOCK - size % BLOCK) % BLOCK))
    end
    return true
  end
  function w.finish() out(("\0"):rep(2 * BLOCK)) end
  return w
end

local function cstr(s) return (s:match("^([^\0]*)")) end

local function num(field)
  if field:byte(1) and field:byte(1) >= 0x80 then -- base-256 (GNU)
    local v = field:byte(1) & 0x7f
    for k = 2, #field do
      v = v * 256 + field:byte(k)
      if v > 2 ^ 53 then return nil end
    end
    return math.tointeger(v)
  end
  local digits = field:match("^[ \0]*([0-7]*)")
  if digits == "" then return 0 end
  return tonumber(digits, 8)
end

--- Entries of a tar stream read through read(n) (returns up to n bytes or
-- nil at the end), passed to emit(entry) one by one; raises a string on a malformed stream.
-- A file's data is there for copy(write) until emit returns; then skipped.  Understood: ustar, pax 'x' headers (path,
-- linkpath, size, mtime), GNU 'L'/'K' long names; devices, FIFOs and the
-- rest come as type "other".
function M.tar_reader(read)
  local function read_exact(n)
    local parts, got = {}, 0
    while got < n do
      local d = read(n - got)
      if not d or #d == 0 then error("tar: the stream ends inside an entry", 0) end
      parts[#parts + 1] = d
      got = got + #d
    end
    return table.concat(parts)
  end
  local function skip(n)
    while n > 0 do
      local k = math.min(n, 65536)
      read_exact(k)
      n = n - k
    end
  end
  return function(emit)
    local pax, long_name, long_link = {}, nil, nil
    while true do
      local first = read(BLOCK)
      if not first or #first == 0 then return end -- no end blocks: take it as the end
      local h = #first < BLOCK and first .. read_exact(BLOCK - #first) or first
      if h == ("\0"):rep(BLOCK) then return end
      local sum = 0
      for k = 1, BLOCK do sum = sum + (k > 148 and k <= 156 and 32 or h:byte(k)) end
      if num(h:sub(149, 156)) ~= sum then error("tar: a header's checksum is wrong", 0) end
      local flag = h:sub(157, 157)
      local size = num(h:sub(125, 136))
      if not size or size < 0 then error("tar: a bad size field", 0) end
      if flag == "x" or flag == "g" or flag == "L" or flag == "K" then
        if size > M.TAR_META_MAX then error("tar: a metadata header over " .. M.TAR_META_MAX .. " bytes", 0) end
        local body = size > 0 and read_exact(size) or ""
        skip((BLOCK - size % BLOCK) % BLOCK)
        if flag == "x" then
          local i = 1
          while i <= #body do
            local len = body:match("^(%d+) ", i)
            local n = tonumber(len)
            if not n or n < #len + 3 or i + n - 1 > #body then error("tar: a malformed pax record", 0) end
            local rec = body:sub(i + #len + 1, i + n - 2)
            local k, v = rec:match("^([^=]+)=(.*)$")
            if not k then error("tar: a malformed pax record", 0) end
            pax[k] = v
            i = i + n
          end
        elseif flag == "L" then long_name = cstr(body)
        elseif flag == "K" then long_link = cstr(body) end
      else
        local name = cstr(h:sub(1, 100))
        if h:sub(258, 263) == "ustar\0" or h:sub(258, 263) == "ustar " then
          local prefix = cstr(h:sub(346, 500))
          if prefix ~= "" and h:sub(258, 263) == "ustar\0" then name = prefix .. "/" .. name end
        end
        name = pax.path or long_name or name
        local link = pax.linkpath or long_link or cstr(h:sub(158, 257))
        if pax.size then
          size = math.tointeger(tonumber(pax.size))
          if not size or size < 0 then error("tar: a bad pax size", 0) end
        end
        local mtime = num(h:sub(137, 148))
        if pax.mtime then mtime = math.tointeger(math.floor(tonumber(pax.mtime) or 0)) end
        pax, long_name, long_link = {}, nil, nil
        local t = (flag == "0" or flag == "\0" or flag == "7") and "file" or flag == "5" and "dir"
          or flag == "2" and "symlink" or flag == "1" and "hardlink" or "other"
        if t == "dir" then name = name:gsub("/+$", "") end
        local ent = { path = name, type = t, mode = (num(h:sub(101, 108)) or 420) & 4095, mtime = mtime,
                      size = t == "file" and size or 0, link = link }
        local left = size -- data bytes of this entry not read yet
        if t == "file" then
          ent.copy = function(write)
            while left > 0 do
              local d = read_exact(math.min(left, M.CHUNK))
              left = left - #d
              write(d)
            end
          end
        end
        emit(ent)
        skip(left)
        skip((BLOCK - size % BLOCK) % BLOCK)
      end
    end
  end
end

-- ---- the verb ------------------------------------------------------------------------

local function split_remote(s)
  return s:match("^([a-z0-9][a-z0-9-]*):(.*)$")
end

-- docker cp's rule for the copy's root: into dest when dest is a directory
-- (or ends in "/": then it must be one), else dest itself.  `src/.` copies
-- what src holds.  dest_kind: "dir", "file"/"other", or nil (missing).
local function copy_root(src, src_is_dir, dest, dest_kind)
  local contents = src:match("/%.$") ~= nil
  if dest:sub(-1) == "/" and dest_kind ~= "dir" then
    if dest_kind == nil and src_is_dir then return dest:gsub("/+$", "") end
    return nil, ("%s is not a directory"):format(dest)
  end
  if dest_kind == "dir" and not contents then
    local base = basename(src)
    if base == "" or base == "." or base == ".." then return nil, "cannot tell the name to copy to: name a target" end
    return join(dest:gsub("/+$", ""), base)
  end
  if src_is_dir and dest_kind ~= nil and dest_kind ~= "dir" then
    return nil, ("cannot copy a directory onto %s, which is not one"):format(dest)
  end
  return (dest == "/" and dest) or dest:gsub("/+$", "")
end

local function abs(p) return p:sub(1, 1) == "/" and p or "/" .. p end

--- tupper cp [-r] [-a] SRC DST: see docs/cli.md.  o: { recursive, archive }.
function M.cp(c, o, args)
  if #args ~= 2 then io.stderr:write("tupper: cp wants SRC DST\n"); return 125 end
  local src, dst = args[1], args[2]
  local sid, spath = split_remote(src)
  local did, dpath = split_remote(dst)
  local function fail(fmt, ...) io.stderr:write("tupper: cp: ", fmt:format(...), "\n"); return 125 end
  if (sid and did) or (not sid and not did) then
    return fail("copies between the host and a sandbox: SRC ID:/path, ID:/path DST (- for a tar stream)")
  end
  local recursive = o.recursive or o.archive
  local unguard = guard_signals(c)
  -- file bytes go as binary frames on a data connection when the daemon has
  -- one (else as base64 inside JSON, the slow path of older daemons)
  c.data_conn = stream.open(c) or nil
  local ok, res = pcall(function()
    if did then
      dpath = abs(dpath)
      local entries, src_is_dir
      if src == "-" then
        local st = c:call("fs.stat", { sandbox = did, path = dpath })
        if not st or st.type ~= "dir" then error(("%s is not a directory of the box"):format(dpath), 0) end
        local sink = M.box_sink(c, did, dpath, o.archive)
        M.tar_reader(function(n) return io.stdin:read(n) end)(sink.put)
        sink.finish()
        return 0
      end
      local st, serr = uv.fs_stat(src)
      if not st then error(serr, 0) end
      src_is_dir = st.type == "directory"
      local dst_st = c:call("fs.stat", { sandbox = did, path = dpath })
      if dst_st and dst_st.type == "symlink" then dst_st = c:call("fs.stat", { sandbox = did, path = dpath .. "/." }) end
      local root, rerr = copy_root(src, src_is_dir, dpath, dst_st and (dst_st.type == "dir" and "dir" or "file"))
      if not root then error(rerr, 0) end
      local sink = M.box_sink(c, did, root, o.archive)
      M.host_source(src, recursive)(sink.put)
      sink.finish()
      return 0
    end
    spath = abs(spath)
    if dst == "-" then
      if uv.guess_handle(1) == "tty" then error("will not write a tar stream to a terminal: redirect it", 0) end
      local w = M.tar_writer(function(data)
        if not io.stdout:write(data) then os.exit(141) end
      end)
      local base = basename(spath)
      if base == "" then base = "." end
      M.box_source(c, sid, spath, true)(function(ent)
        local parts = M.check_path(ent.path)
        if parts then
          ent.path = #parts == 0 and base or base .. "/" .. table.concat(parts, "/")
          w.add(ent)
        end
      end)
      w.finish()
      io.stdout:flush()
      return 0
    end
    local _, st = M.box_follow(c, sid, spath)
    local dst_st = uv.fs_stat(dst)
    local root, rerr = copy_root(spath, st.type == "dir", dst,
      dst_st and (dst_st.type == "directory" and "dir" or "file"))
    if not root then error(rerr, 0) end
    if st.type ~= "dir" and st.type ~= "file" then
      error(("%s is not a file or directory"):format(shown(spath)), 0)
    end
    local sink = M.host_sink(root)
    M.box_source(c, sid, spath, recursive)(sink.put)
    local _, skipped = sink.finish()
    if skipped > 0 then warn("%d entries skipped", skipped) end
    return 0
  end)
  unguard()
  M.fd_close(c)
  if c.data_conn then c.data_conn:close(); c.data_conn = nil end
  if not ok then return fail("%s", tostring(res)) end
  return res
end

return M
