--- The socket API's snapshot methods (docs/snapshots.md, docs/protocol.md):
-- sandbox.snapshot, sandbox.fork, snapshot.list, snapshot.delete, and
-- sandbox.pause and sandbox.resume (in place, or to disk with keep_memory).
-- The mechanisms are daemon/snapshots.lua's and daemon/pause.lua's.
local rpc = require("tupper.wire.rpc")
local json = require("tupper.util.json")

local M = {}
local h = {}
M.handlers = h

local function live(d, id)
  local sb = d.sandboxes[id]
  -- a pause or resume in flight (in the thread pool) ends first
  if sb and sb.freezing then
    sb:freeze_wait()
    sb = d.sandboxes[id]
  end
  if not sb or (sb.state ~= "running" and sb.state ~= "paused") then
    return nil, rpc.NOT_FOUND, ("no sandbox '%s'"):format(id)
  end
  return sb
end

-- A sandbox with a box (not one paused to disk whose box is gone).
local function boxed(d, id)
  local sb, code, msg = live(d, id)
  if sb and sb.dormant then
    return nil, rpc.SANDBOX_ERROR, ("sandbox '%s' is paused to disk: resume it first"):format(id)
  end
  return sb, code, msg
end

-- keep_memory: absent, the cgroup freezer in place (nothing written); true
-- or false, a pause to disk that survives daemon restarts and reboots
-- (daemon/pause.lua), keeping the frozen box or not.
function h.sandbox_pause(d, conn, p)
  local sb, code, msg = live(d, p.id)
  if not sb then return nil, code, msg end
  if sb.snapshotting then return nil, rpc.SANDBOX_ERROR, ("sandbox '%s' is being snapshotted: pause it after"):format(p.id) end
  if p.keep_memory ~= nil then
    local ok, err = d:pause_persist(sb, p.keep_memory)
    if not ok then return nil, rpc.SANDBOX_ERROR, err end
    sb = d.sandboxes[p.id] or sb
    return { state = "paused", persisted = true, box = not sb.dormant }
  end
  if sb.state == "paused" then return { state = "paused", persisted = sb.persist ~= nil, box = not sb.dormant } end
  if sb.pausing then return nil, rpc.SANDBOX_ERROR, ("sandbox '%s' is being paused to disk"):format(p.id) end
  local ok, err = sb:freeze(true)
  if not ok then return nil, rpc.SANDBOX_ERROR, err end
  d:pause_timeout(sb)
  d:save(sb)
  return { state = "paused", persisted = false, box = true }
end

function h.sandbox_resume(d, conn, p)
  local sb, code, msg = live(d, p.id)
  if not sb then return nil, code, msg end
  if sb.state == "running" then return { state = "running" } end
  if sb.snapshotting or sb.pausing then
    return nil, rpc.SANDBOX_ERROR, ("sandbox '%s' is being snapshotted or paused: resume it after"):format(p.id)
  end
  if sb.persist then
    local was_dormant = sb.dormant
    local out, err, data = d:resume_persisted(sb)
    if not out then return nil, data and rpc.BUSY or rpc.SANDBOX_ERROR, err, data end
    -- from a dormant one: a new box, its files as paused, no processes
    return { state = "running", restarted = was_dormant == true }
  end
  local ok, err = sb:freeze(false)
  if not ok then return nil, rpc.SANDBOX_ERROR, err end
  d:resume_timeout(sb)
  d:save(sb)
  return { state = "running" }
end

function h.sandbox_snapshot(d, conn, p)
  local sb, code, msg = boxed(d, p.id)
  if not sb then return nil, code, msg end
  local rec, err = d:snapshot_sandbox(sb, p.name)
  if not rec then return nil, rpc.SANDBOX_ERROR, err end
  local info = d:snapshot_info(rec)
  info.names, info.sandboxes = json.array(info.names), json.array(info.sandboxes)
  return info
end

function h.sandbox_fork(d, conn, p)
  local sb, code, msg = boxed(d, p.id)
  if not sb then return nil, code, msg end
  local rec, made, data = d:fork_sandbox(sb, p.count or 1, { name = p.name, kill_on_disconnect = p.kill_on_disconnect })
  if not rec then return nil, data and rpc.BUSY or rpc.SANDBOX_ERROR, made, data end
  local out = {}
  for i, child in ipairs(made) do
    if p.kill_on_disconnect then
      conn.owned = conn.owned or {}
      conn.owned[child.id] = true
    end
    out[i] = child:info()
  end
  if p.kill_on_disconnect and conn.closed then
    for _, child in ipairs(made) do d:kill_sandbox(child.id) end
    return nil, rpc.SANDBOX_ERROR, "the client went away"
  end
  return { snapshot = rec.id, sandboxes = json.array(out) }
end

function h.snapshot_list(d, conn, p)
  local list = {}
  for _, rec in pairs(d.snapshots) do
    if rec.pause_of then goto continue end -- a pause to disk's own (daemon/pause.lua)
    local info = d:snapshot_info(rec)
    info.names, info.sandboxes = json.array(info.names), json.array(info.sandboxes)
    list[#list + 1] = info
    ::continue::
  end
  table.sort(list, function(a, b)
    if a.created_at ~= b.created_at then return a.created_at < b.created_at end
    return a.id < b.id
  end)
  return { snapshots = json.array(list) }
end

function h.snapshot_delete(d, conn, p)
  local rec = d:snapshot_find(p.id)
  if rec and rec.pause_of then
    return nil, rpc.SANDBOX_ERROR, ("snapshot '%s' holds the files of sandbox %s, paused to disk: it goes with that sandbox"):format(
      rec.id, rec.pause_of)
  end
  local ok, err, kind = d:snapshot_delete(p.id)
  if not ok then return nil, kind == "not_found" and rpc.NOT_FOUND or rpc.SANDBOX_ERROR, err end
  return { deleted = true }
end

return M
