--- The socket API's snapshot methods (docs/snapshots.md, docs/protocol.md):
-- sandbox.snapshot, sandbox.fork, snapshot.list, snapshot.delete.  The
-- mechanism is daemon/snapshots.lua's.
local rpc = require("tupper.wire.rpc")
local json = require("tupper.util.json")

local M = {}
local h = {}
M.handlers = h

local function live(d, id)
  local sb = d.sandboxes[id]
  if not sb or (sb.state ~= "running" and sb.state ~= "paused") then
    return nil, rpc.NOT_FOUND, ("no sandbox '%s'"):format(id)
  end
  return sb
end

function h.sandbox_snapshot(d, conn, p)
  local sb, code, msg = live(d, p.id)
  if not sb then return nil, code, msg end
  local rec, err = d:snapshot_sandbox(sb, p.name)
  if not rec then return nil, rpc.SANDBOX_ERROR, err end
  local info = d:snapshot_info(rec)
  info.names, info.sandboxes = json.array(info.names), json.array(info.sandboxes)
  return info
end

function h.sandbox_fork(d, conn, p)
  local sb, code, msg = live(d, p.id)
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
    local info = d:snapshot_info(rec)
    info.names, info.sandboxes = json.array(info.names), json.array(info.sandboxes)
    list[#list + 1] = info
  end
  table.sort(list, function(a, b)
    if a.created_at ~= b.created_at then return a.created_at < b.created_at end
    return a.id < b.id
  end)
  return { snapshots = json.array(list) }
end

function h.snapshot_delete(d, conn, p)
  local ok, err, kind = d:snapshot_delete(p.id)
  if not ok then return nil, kind == "not_found" and rpc.NOT_FOUND or rpc.SANDBOX_ERROR, err end
  return { deleted = true }
end

return M
