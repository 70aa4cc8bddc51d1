--- Records of the state dir: the small JSON files the daemon keeps so that
-- what it was told outlives it (templates, volumes, snapshots).  A write
-- goes to a temp file beside the record (created exclusively, mode 0600),
-- is fsynced, renamed over the record and the dir is fsynced, so a daemon
-- killed at any point leaves the old record or the new one, never half of
-- one.  A load reads at most a given number of bytes of a regular file and
-- accepts only a JSON object: the state dir is the daemon's, but a record
-- is still read as if anyone could have written it.
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")
local paths = require("tupper.util.paths")
local log = require("tupper.daemon.log").log

local M = {}

M.MAX = 65536 -- bytes of a record, unless the caller says otherwise

--- Fsyncs a directory, so that a rename or an unlink in it is on disk.
-- Best effort: a dir that cannot be opened is left as it is.
function M.fsync_dir(dir)
  local dfd = uv.fs_open(dir, "r", 0)
  if dfd then uv.fs_fsync(dfd); uv.fs_close(dfd) end
end

-- The directory part of a path ("." for a bare name).
local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

--- Writes text to path atomically: a temp file `<path>.tmp-<hex>`, fsync,
-- rename over path, fsync of the dir.  Returns true or nil, err.
function M.write(path, text)
  local tmp = path .. ".tmp-" .. core.random_hex(4)
  local fd, oerr = uv.fs_open(tmp, "wx", tonumber("600", 8))
  if not fd then return nil, ("cannot write %s: %s"):format(tmp, tostring(oerr)) end
  local n, werr = uv.fs_write(fd, text)
  local sok = n == #text and uv.fs_fsync(fd)
  uv.fs_close(fd)
  if not sok then
    uv.fs_unlink(tmp)
    return nil, ("cannot write %s: %s"):format(tmp, tostring(werr or "short write"))
  end
  local rok, rerr = uv.fs_rename(tmp, path)
  if not rok then
    uv.fs_unlink(tmp)
    return nil, ("cannot rename %s: %s"):format(tmp, tostring(rerr))
  end
  M.fsync_dir(dirname(path))
  return true
end

--- Encodes rec as JSON and writes it to path atomically (M.write).
function M.save(path, rec)
  return M.write(path, json.encode(rec))
end

--- Loads the record at path: a regular file of at most max bytes
-- (default M.MAX) holding a JSON object.  Returns the table or nil, err.
function M.load(path, max)
  local text, rerr = paths.read_file(path, max or M.MAX)
  if not text then return nil, tostring(rerr) end
  local rec, derr = json.decode(text)
  if type(rec) ~= "table" then
    return nil, ("%s is not a JSON object%s"):format(path, derr and (": " .. tostring(derr)) or "")
  end
  return rec
end

--- Loads the record at path (M.load) and checks it with valid(rec);
-- one that does not load or pass is logged as `<what>: skipping <path>:
-- ...` and skipped (a damaged state dir is never fatal).  Returns the
-- record or nil.
function M.pick(path, max, valid, what)
  local rec, err = M.load(path, max)
  if rec and not valid(rec) then rec, err = nil, ("not a %s record"):format(what) end
  if not rec then log("%s: skipping %s: %s", what, path, err) end
  return rec
end

return M
