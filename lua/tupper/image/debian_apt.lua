--- The host's apt sources, for Debian images (image/debian.lua): the
-- sources.list and sources.list.d files as apt reads them (one-line and
-- deb822), and the mirror a build of a suite takes from them.  A build
-- uses the mirror this host already uses, never an address of its own.
local uv = require("luv")
local paths = require("tupper.util.paths")

local M = {}

M.APT_DIR = "/etc/apt"
M.MAX_SOURCE_FILE = 1024 * 1024
M.MAX_SOURCE_FILES = 256

local function words(s)
  local t = {}
  for w in s:gmatch("%S+") do t[#t + 1] = w end
  return t
end

--- Parses deb822 sources text (a .sources file).  Returns a list of
-- entries { types, uris, suites, components, signed_by (a path or nil),
-- enabled, file, line }.
function M.parse_deb822(text, file)
  local entries, cur, last = {}, nil, nil
  local n = 0
  local function close()
    if cur then entries[#entries + 1] = cur end
    cur, last = nil, nil
  end
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:match("^%s*$") then
      close()
    elseif line:match("^#") then
      -- a comment, inside a paragraph or between them
    elseif line:match("^[ \t]") then
      -- a continuation of the last field (an inline Signed-By key)
      if cur and last then cur.fields[last] = cur.fields[last] .. "\n" .. line end
    else
      local k, v = line:match("^([%w%-]+):%s*(.-)%s*$")
      if k then
        cur = cur or { fields = {}, file = file, line = n }
        last = k:lower()
        cur.fields[last] = v
      end
    end
  end
  close()
  local out = {}
  for _, e in ipairs(entries) do
    local f = e.fields
    local signed = f["signed-by"]
    if signed and not signed:match("^/[^%s]+$") then signed = nil end -- an inline key or fingerprints
    out[#out + 1] = {
      types = words(f.types or ""), uris = words(f.uris or ""), suites = words(f.suites or ""),
      components = words(f.components or ""), signed_by = signed,
      enabled = (f.enabled or "yes"):lower() ~= "no", file = e.file, line = e.line,
    }
  end
  return out
end

--- Parses one-line sources text (sources.list, *.list).
function M.parse_list(text, file)
  local out, n = {}, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    line = line:gsub("#.*$", "")
    local typ, rest = line:match("^%s*(deb%S*)%s+(.*)$")
    if typ == "deb" or typ == "deb-src" then
      local opts = {}
      local o, after = rest:match("^%[([^%]]*)%]%s*(.*)$")
      if o then
        rest = after
        for k, v in o:gmatch("([%w%-]+)=(%S+)") do opts[k:lower()] = v end
      end
      local w = words(rest)
      if #w >= 2 then
        local comps = {}
        for i = 3, #w do comps[#comps + 1] = w[i] end
        local signed = opts["signed-by"]
        if signed and not signed:match("^/[^%s,]+$") then signed = nil end
        out[#out + 1] = { types = { typ }, uris = { w[1] }, suites = { w[2] }, components = comps,
                          signed_by = signed, enabled = true, file = file, line = n }
      end
    end
  end
  return out
end


--- The apt sources of this host: sources.list, then sources.list.d's
-- *.list and *.sources in name order, as apt reads them.  apt_dir
-- defaults to /etc/apt.
function M.host_sources(apt_dir)
  apt_dir = apt_dir or M.APT_DIR
  local out = {}
  local function add(list)
    for _, e in ipairs(list) do out[#out + 1] = e end
  end
  local main = paths.read_file(apt_dir .. "/sources.list", M.MAX_SOURCE_FILE)
  if main then add(M.parse_list(main, apt_dir .. "/sources.list")) end
  local names = {}
  local dir = uv.fs_scandir(apt_dir .. "/sources.list.d")
  while dir do
    local name = uv.fs_scandir_next(dir)
    if not name then break end
    if (name:match("%.list$") or name:match("%.sources$")) and name:match("^[%w_.%-]+$") then
      names[#names + 1] = name
    end
    if #names >= M.MAX_SOURCE_FILES then break end
  end
  table.sort(names)
  for _, name in ipairs(names) do
    local path = apt_dir .. "/sources.list.d/" .. name
    local text = paths.read_file(path, M.MAX_SOURCE_FILE)
    if text then
      add(name:match("%.sources$") and M.parse_deb822(text, path) or M.parse_list(text, path))
    end
  end
  return out
end

--- Whether u is an http(s) URI tupper passes to apt (no space, no quote).
function M.valid_uri(u)
  return type(u) == "string" and #u <= 1024 and u:match("^https?://[%w%-._~%%!$&'()*+,;=:@/%[%]]+$") ~= nil
end

--- The mirror for a suite, from apt source entries: every enabled "deb"
-- entry of the suite itself and of its -updates and -security suites (not
-- backports or proposed-updates).  Returns a list of
-- { uri, suites, components, signed_by }, or nil, err.
function M.select_mirror(entries, suite)
  local want = { [suite] = true, [suite .. "-updates"] = true, [suite .. "-security"] = true }
  local out, base = {}, false
  for _, e in ipairs(entries) do
    local deb = false
    for _, t in ipairs(e.types) do deb = deb or t == "deb" end
    if deb and e.enabled then
      local suites = {}
      for _, s in ipairs(e.suites) do
        if want[s] then suites[#suites + 1] = s end
        if s == suite then base = true end
      end
      if #suites > 0 then
        local comps = {}
        for _, c in ipairs(e.components) do
          if c:match("^[%w%-]+$") then comps[#comps + 1] = c end
        end
        for _, uri in ipairs(e.uris) do
          if M.valid_uri(uri) and #comps > 0 then
            out[#out + 1] = { uri = uri, suites = suites, components = comps, signed_by = e.signed_by }
          end
        end
      end
    end
  end
  if not base or #out == 0 then
    return nil, ("this host's apt sources (%s) have no http(s) entry for suite %q")
                  :format(M.APT_DIR, suite)
  end
  return out
end

--- The one-line apt sources of a mirror entry: one line per suite (the
-- one-line format takes one suite; more words would be components).
function M.source_lines(m)
  local opt = m.signed_by and ("[signed-by=%s] "):format(m.signed_by) or ""
  local out = {}
  for i, suite in ipairs(m.suites) do
    out[i] = ("deb %s%s %s %s"):format(opt, m.uri, suite, table.concat(m.components, " "))
  end
  return out
end

return M
