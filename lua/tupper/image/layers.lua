--- Recipe layers: what a recipe's files and setup made, kept on disk so that
-- the next sandbox from the same recipe starts from it without running
-- setup again.
--
-- A layer is the upper dir of the box the setup ran in (overlay's own
-- format: whiteouts and opaque dirs included, so it stacks as a lower dir
-- as it is), under <state>/layers/<key>/fs, with <key>/layer.json saying
-- what made it.  The key is a SHA-256 over everything the layer depends on:
-- the image's digest, the recipe's source text and the files it places
-- (a recipe may compute them).  docs/recipes.md.
local uv = require("luv")
local core = require("tupper.core")
local json = require("tupper.util.json")
local async = require("tupper.util.async")

local M = {}

M.KEY_VERSION = "tupper-layer-1"

--- The key of a layer: hex SHA-256 of image digest, recipe source, files.
function M.key(image_digest, source, files)
  local parts = { M.KEY_VERSION, "\0", image_digest, "\0", tostring(#source), ":", source }
  local paths = {}
  for path in pairs(files or {}) do paths[#paths + 1] = path end
  table.sort(paths)
  for _, path in ipairs(paths) do
    local content = files[path]
    parts[#parts + 1] = ("\0%d:%s%d:"):format(#path, path, #content)
    parts[#parts + 1] = content
  end
  return core.sha256(table.concat(parts))
end

local Store = {}
Store.__index = Store

local function mkdir(path, mode)
  local ok, err, name = uv.fs_mkdir(path, mode)
  if not ok and name ~= "EEXIST" then return nil, err end
  return true
end

--- Opens (creating) the layer store at dir, and removes what a crashed
-- daemon left half-made (tmp-* dirs).
function M.open(dir)
  local ok, err = mkdir(dir, tonumber("711", 8))
  if not ok then return nil, err end
  local self = setmetatable({ dir = dir, building = {} }, Store)
  local h = uv.fs_scandir(dir)
  while h do
    local name = uv.fs_scandir_next(h)
    if not name then break end
    if name:match("^tmp%-") then
      -- a copy the dead daemon had started (snapshots.lua's cp) may still
      -- write into it for a moment: its removal races with it.  Moved
      -- aside first, the copy finds none of its paths (they name the old
      -- dir) and can make nothing more in it; a few tries end the rest
      local path = dir .. "/" .. name
      if not name:match("^tmp%-gone%-") and uv.fs_rename(path, dir .. "/tmp-gone-" .. name:sub(5)) then
        path = dir .. "/tmp-gone-" .. name:sub(5)
      end
      for _ = 1, 20 do
        if core.rmtree(path) or not uv.fs_lstat(path) then break end
        uv.sleep(50)
      end
    end
  end
  return self
end

local function valid_key(key)
  return type(key) == "string" and #key == 64 and not key:find("[^0-9a-f]")
end
M.valid_key = valid_key

--- The layer of key: { key, fs = lower dir, info = layer.json } or nil.
function Store:get(key)
  if not valid_key(key) then return nil end
  local base = self.dir .. "/" .. key
  local st = uv.fs_stat(base .. "/fs")
  if not st or st.type ~= "directory" then return nil end
  local info
  local fd = uv.fs_open(base .. "/layer.json", "r", 0)
  if fd then
    local text = uv.fs_read(fd, 65536, 0)
    uv.fs_close(fd)
    info = text and json.decode(text)
  end
  return { key = key, fs = base .. "/fs", info = type(info) == "table" and info or {} }
end

--- A fresh temp dir in the store for a layer being built: returns its
-- path; build the layer at <tmp>/fs, then commit.
function Store:tmp()
  local path = self.dir .. "/tmp-" .. core.random_hex(8)
  local ok, err = mkdir(path, tonumber("711", 8))
  if not ok then return nil, err end
  return path
end

--- Commits a temp dir (with fs/ in it) as the layer of key, with info
-- written as its layer.json.  A layer that appeared meanwhile (another
-- daemon on the same state dir cannot: it holds the lock) wins; the temp
-- dir goes.  Returns the layer.
function Store:commit(tmp, key, info)
  local text = json.encode(info)
  local fd = uv.fs_open(tmp .. "/layer.json", "w", tonumber("644", 8))
  if fd then uv.fs_write(fd, text); uv.fs_close(fd) end
  local final = self.dir .. "/" .. key
  if not self:get(key) and uv.fs_lstat(final) then
    core.rmtree(final) -- a layer dir without its fs: not a layer, replace it
  end
  local ok, err = uv.fs_rename(tmp, final)
  if not ok then
    core.rmtree(tmp)
    if not self:get(key) then return nil, "commit layer: " .. tostring(err) end
  end
  return self:get(key)
end

--- Drops a temp dir.
function Store:discard(tmp)
  if tmp then core.rmtree(tmp) end
end

--- Returns the layer of key, building it with build(tmp) -> true | nil, err
-- if it is not there.  Concurrent callers for one key wait for the same
-- build.  Returns layer, built (true when this call ran the build), or nil,
-- err.
function Store:ensure(key, build, info)
  local layer = self:get(key)
  if layer then return layer, false end
  local waiting = self.building[key]
  if waiting then
    local l, err = async.wait(function(cb) waiting[#waiting + 1] = cb end)
    if not l then return nil, err end
    return l, false
  end
  waiting = {}
  self.building[key] = waiting
  local tmp, err = self:tmp()
  local ok
  if tmp then
    -- a build that raises must still wake its waiters and free the key
    local pok, res, rerr = pcall(build, tmp)
    if pok then ok, err = res, rerr else ok, err = nil, "internal error: " .. tostring(res) end
  end
  if ok then
    layer, err = self:commit(tmp, key, info)
  else
    self:discard(tmp)
    layer = nil
  end
  self.building[key] = nil
  for _, cb in ipairs(waiting) do cb(layer, err) end
  if not layer then return nil, err end
  return layer, true
end

return M
