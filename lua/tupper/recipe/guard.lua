--- Policy enforcement in the daemon (docs/policy.md).  Every request passes
-- through guard.check after schema validation and before its handler:
--
--   * sandbox.create: the daemon's own policy (`tupper daemon --policy`),
--     then the policy file the client sent, cap and may rewrite the params;
--     the sandbox keeps both for its whole life (re-adoption after a crash
--     included: the record carries the client's policy text);
--   * process starts: each policy's on_exec sees the argv and may refuse or
--     rewrite it; the handler runs exactly what the hooks returned;
--   * file operations: paths are made absolute and cleaned (no `.`, `..`
--     or `//` left) before on_file sees them, and the handler uses that
--     same path, so what a hook approved is what the agent is asked to do;
--     a relative path is taken from the home of the request's `user` (its
--     account, looked up here in the box and handed to the handler as
--     params._account), else from /;
--   * any other method on a sandbox whose policy has hooks is refused
--     unless listed below as harmless: a new method is closed until it is
--     classified here (fail closed).
local policy = require("tupper.recipe.policy")
local rpc = require("tupper.wire.rpc")
local paths = require("tupper.util.paths")

local M = {}

-- file methods: the on_file op and the params that hold paths
M.FILE_METHODS = {
  ["fs.read"] = { op = "read", paths = { "path" } },
  ["fs.write"] = { op = "write", paths = { "path" } },
  ["fs.read_stream"] = { op = "read", paths = { "path" } },
  ["fs.write_stream"] = { op = "write", paths = { "path" } },
  ["fs.read_fd"] = { op = "read", paths = { "path" } },
  ["fs.write_fd"] = { op = "write", paths = { "path" } },
  ["fs.list"] = { op = "list", paths = { "path" } },
  ["fs.stat"] = { op = "stat", paths = { "path" } },
  ["fs.mkdir"] = { op = "mkdir", paths = { "path" } },
  ["fs.remove"] = { op = "remove", paths = { "path" } },
  ["fs.rename"] = { op = "rename", paths = { "from", "to" } },
  -- a watch reveals the names in a tree, as listing it does
  ["fs.watch"] = { op = "list", paths = { "path" } },
}

-- methods that start a process: a function giving the argv from params,
-- and one that puts the (possibly rewritten) argv back
M.EXEC_METHODS = {
  ["process.start"] = {
    argv = function(p) return p.argv or { "/bin/sh", "-c", p.cmd } end,
    set = function(p, argv) p.argv, p.cmd = argv, nil end,
  },
  ["pty.create"] = {
    argv = function(p) return p.argv or { "/bin/sh", "-i", "-l" } end,
    set = function(p, argv) p.argv = argv end,
  },
}

-- methods that neither run code nor touch files of the box
M.HARMLESS = {
  ["hello"] = true, ["sandbox.get"] = true, ["sandbox.list"] = true, ["sandbox.kill"] = true,
  ["sandbox.pause"] = true, ["sandbox.resume"] = true, ["sandbox.metrics"] = true,
  ["sandbox.set_timeout"] = true, ["process.stdin"] = true, ["process.close_stdin"] = true,
  ["process.signal"] = true, ["process.list"] = true, ["sandbox.network_log"] = true,
  -- output of a process the policy let start; a terminal's size; stopping a watch
  ["process.connect"] = true, ["pty.resize"] = true, ["fs.unwatch"] = true,
  -- network rules: the daemon narrows them by every policy itself
  -- (netrules.with_policies); an inbound port of the box on the host's
  -- loopback runs nothing and touches no file
  ["sandbox.update_network"] = true, ["sandbox.expose"] = true,
}

-- the errno names an account's lookup may fail with
M.ERRNO_CODES = { [2] = "ENOENT", [5] = "EIO", [7] = "E2BIG", [22] = "EINVAL", [27] = "EFBIG" }

--- Loads the policy a client sent with a create ({source, name}).
-- Returns the policy or nil, err.
function M.load_client_policy(p)
  if type(p.source) ~= "string" then return nil, "'policy.source' is required" end
  local name = p.name or "tupper.lua"
  return policy.load_string(p.source, name)
end

local function has_hooks(pols)
  for _, pol in ipairs(pols) do
    if pol.on_exec or pol.on_file or pol.on_create then return true end
  end
  return false
end

-- The policies that bind a sandbox: the daemon's, then its own.
local function policies_of(d, sb)
  local pols = {}
  if d.policy then pols[#pols + 1] = d.policy end
  if sb and sb.policy then pols[#pols + 1] = sb.policy end
  return pols
end
M.policies_of = policies_of

local function check_create(d, params)
  local pols = {}
  if d.policy then pols[#pols + 1] = d.policy end
  local sent = params.policy
  params.policy = nil
  local client_pol
  if sent then
    local pol, err = M.load_client_policy(sent)
    if not pol then return nil, "policy: " .. err, rpc.INVALID_PARAMS end
    client_pol = pol
    pols[#pols + 1] = pol
  end
  for _, pol in ipairs(pols) do
    local out, err = policy.apply_create(pol, params, d.defaults)
    if not out then return nil, err end
    params = out
  end
  -- internal: the handler attaches these to the sandbox
  params._policy, params._policy_source = client_pol, sent
  return params
end

--- Checks a validated request against the policies that bind it; runs in
-- the request's coroutine (an account's lookup asks the box's agent).
-- Returns params (possibly rewritten), or nil, err[, code, data] for a
-- refusal.
function M.check(d, method, params)
  if method == "sandbox.create" then return check_create(d, params) end
  -- process.* and fs.* name their sandbox `sandbox`, sandbox.* name it `id`
  local key = params.sandbox or params.id
  local sb = type(key) == "string" and d.sandboxes[key] or nil
  local pols = policies_of(d, sb)
  local file = M.FILE_METHODS[method]
  if file then
    -- always cleaned, so the handler and the hooks see one path
    local base = "/"
    if params.user and sb and sb.state == "running" and sb.account then
      local acct, err, errno = sb:account(params.user)
      if not acct then
        errno = math.tointeger(errno) or 5
        return nil, err, rpc.FS_ERROR, { errno = errno, code = M.ERRNO_CODES[errno] or ("E" .. errno) }
      end
      params._account, base = acct, acct.home
    end
    for _, key in ipairs(file.paths) do
      if params[key] then params[key] = paths.clean_path(params[key], base) end
    end
    for _, pol in ipairs(pols) do
      for _, key in ipairs(file.paths) do
        if params[key] then
          local ok, err = policy.check_file(pol, file.op, params[key])
          if not ok then return nil, err end
        end
      end
    end
    return params
  end
  local exec = M.EXEC_METHODS[method]
  if exec then
    if #pols == 0 then return params end
    local argv = exec.argv(params)
    for _, pol in ipairs(pols) do
      local out, err = policy.check_exec(pol, argv)
      if not out then return nil, err end
      argv = out
    end
    exec.set(params, argv)
    return params
  end
  if sb and not M.HARMLESS[method] and has_hooks(pols) then
    return nil, ("policy: '%s' is not covered by this sandbox's policy hooks, so it is refused"):format(method)
  end
  return params
end

return M
