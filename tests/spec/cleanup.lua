-- busted --helper for every suite (tests/run.sh): after each spec file,
-- helper.cleanup_all() releases what the file's tests started and left
-- behind (a test that failed before its own cleanup, a teardown that never
-- ran): daemons and their boxes, processes, cgroups, mounts, temp dirs.  A
-- spec that leaks is still a bug: what had to be cleaned is said on one
-- line, for finding it; the suite is not failed here (tests/run.sh's leak
-- check fails it if anything survives).
local busted = require("busted")

busted.subscribe({ "file", "end" }, function(file)
  -- busted insulates each file: the helper its specs required (if any) is
  -- in package.loaded until the file's end has been published
  local helper = package.loaded["helper"]
  if type(helper) ~= "table" or not helper.cleanup_all then return nil, true end
  local ok, done = pcall(helper.cleanup_all)
  if not ok then
    io.stderr:write(("\ncleanup after %s failed: %s\n"):format(file.name, tostring(done)))
  elseif #done > 0 then
    io.stderr:write(("\ncleanup after %s (it leaked): %s\n"):format(file.name, table.concat(done, "; ")))
  end
  return nil, true
end)
