--- The socket API's one source of truth: every method, its parameters and
-- its result fields.  The daemon validates requests against it, `tupper
-- schema` prints it as JSON (docs/protocol.schema.json), and the tests check
-- that docs/protocol.md documents each method and that the daemon answers
-- each of them.
local json = require("tupper.util.json")
local rpc = require("tupper.wire.rpc")
local rules = require("tupper.net.rules")
local units = require("tupper.util.units")
local backends = require("tupper.backend.registry")

local M = {}

M.PROTOCOL = rpc.PROTOCOL

local ID = { type = "string", pattern = "^[a-z0-9][a-z0-9-]*$", max = 63 }
local PATH = { type = "string", min = 1, max = 4096 }
-- Strings that reach the agent fit its field cap (TP_STR_MAX, 32 KiB):
-- an env entry travels as one "K=V" string.
-- total_max: names and values together (an env reaches the agent in one
-- frame with the image's and the process's; metadata is in the box's record)
local MAP = { type = "map", max = 1024, key_max = 1024, value_max = 31744, total_max = 262144 }
local ENCODING = { type = "enum", values = { "base64", "utf8" } }
local DURATION = { type = "duration" }
local IMAGE_REF = { type = "string", min = 1, max = 256 }
local PID = { type = "integer", min = 1, max = 4194304 }
local PTY_DIM = { type = "integer", min = 1, max = 4096 } -- TP_PTY_DIM_MAX
-- an account of the box's /etc/passwd, by name
local USER = { type = "string", min = 1, max = 32, pattern = "^[A-Za-z0-9_][A-Za-z0-9_.-]*$" }
-- zero: 0 or "unlimited" is allowed too, and means no such limit (the
-- daemon's default applies only to a limit left out: docs/limits.md)
local LIMITS = { type = "object", fields = {
  memory = { type = "size", min = 4194304, zero = true },
  cpus = { type = "number", min = 0.01, max = 1024, zero = true },
  pids = { type = "integer", min = 1, max = 4194304, zero = true },
  disk = { type = "size", min = 1048576, zero = true },
  timeout = { type = "duration", zero = true },
} }
-- A policy file sent with a create (docs/policy.md): its text, evaluated by
-- the daemon in the locked-down VM, and the name errors cite (its path).
local POLICY = { type = "object", fields = {
  source = { type = "string", min = 0, max = 262144 },
  name = { type = "string", min = 1, max = 4096 },
} }
-- shared with recipes and policy files (tupper.recipe, tupper.policy), so
-- they accept exactly what the socket API accepts
M.LIMITS, M.MAP, M.PATH = LIMITS, MAP, PATH
-- a recipe as clients send it: its source text and file name (the daemon
-- never reads client paths), or the name of a shipped recipe; lock: the
-- text of its lockfile (docs/recipes.md)
local RECIPE = { type = "object", fields = {
  name = { type = "string", min = 1, max = 256 },
  source = { type = "string", min = 1, max = 1048576 },
  lock = { type = "string", min = 1, max = 1048576 },
} }
M.RECIPE = RECIPE
-- "none", "all" or { allow = [rule...], deny = [rule...] } (tupper.netrules)
local NETWORK = { type = "network" }
-- a snapshot's id or name (daemon/snapshots.lua checks a new name's characters)
local SNAPSHOT_REF = { type = "string", min = 1, max = 128 }
local SNAPSHOT_NAME = { type = "string", min = 1, max = 128 }
M.NETWORK = NETWORK
-- where a sandbox runs: namespaces on the host's kernel, or a microVM with
-- a kernel of its own (docs/microvm.md)
M.BACKEND = { type = "enum", values = backends.NAMES }
-- a volume's name or id, checked by the daemon (daemon/volumes.lua) so that
-- '..', '/', NUL and control characters each get a clear error
local VOLUME_NAME = { type = "string", min = 1, max = 256 }
-- sandbox.create's volumes: mount point in the box -> volume name or id
-- (E2B's volumeMounts)
local VOLUME_MOUNTS = { type = "map", max = 16, key_max = 255, value_max = 256 }
M.DEFAULT_TIMEOUT = 300 -- seconds a sandbox lives unless told otherwise, as E2B (the
                        -- daemon's --default-timeout changes it: daemon/limits.lua)
M.methods = {
  ["hello"] = {
    doc = "Negotiates the protocol version; the first call of a session.",
    params = { protocol = { type = "integer", min = 1, max = 1000 },
               client = { type = "string", max = 256 } },
    result = { "protocol", "server", "version", "methods", "streams", "process_streams",
               "attach_wait" },
  },
  ["sandbox.create"] = {
    doc = "Creates and starts a sandbox.",
    params = { image = { type = "string", min = 1, max = 256 },
               env = MAP, metadata = MAP, cwd = PATH, limits = LIMITS, network = NETWORK,
               kill_on_disconnect = { type = "boolean" }, policy = POLICY, recipe = RECIPE,
               backend = M.BACKEND, template = { type = "string", min = 1, max = 256 },
               accel = { type = "enum", values = { "kvm", "tcg", "auto" } },
               volumes = VOLUME_MOUNTS, snapshot = SNAPSHOT_REF },
    result = { "id", "image", "backend", "state", "created_at", "metadata", "limits", "timeout",
               "default_user", "home" },
  },
  ["volume.create"] = {
    doc = "Makes a named persistent volume (an ext4 filesystem of `size`, default 1 GiB) in the state dir.",
    params = { name = VOLUME_NAME, size = { type = "size", min = 1 }, required = { "name" } },
    result = { "name", "id", "size", "created_at", "mounted_by" },
  },
  ["volume.list"] = {
    doc = "The daemon's volumes, by name.",
    params = {},
    result = { "volumes" },
  },
  ["volume.get"] = {
    doc = "Describes one volume (by name or id), with the sandboxes that mount it.",
    params = { name = VOLUME_NAME, required = { "name" } },
    result = { "name", "id", "size", "created_at", "mounted_by" },
  },
  ["volume.destroy"] = {
    doc = "Removes a volume and its data; refused while a sandbox mounts it.",
    params = { name = VOLUME_NAME, required = { "name" } },
    result = { "destroyed" },
  },
  ["recipe.build"] = {
    doc = "Builds a recipe's layer (files and setup) unless cached, and returns what a lockfile of it pins.",
    params = { recipe = RECIPE, required = { "recipe" } },
    result = { "recipe", "image", "image_digest", "layer", "cached", "lock" },
  },
  ["recipe.register"] = {
    doc = "Keeps a recipe (its source text) under a name, across restarts: sandbox.create's `template` finds it; `build` builds its layer first.",
    params = { name = { type = "string", min = 1, max = 256 }, source = RECIPE.fields.source,
               file = { type = "string", min = 1, max = 256 }, lock = RECIPE.fields.lock,
               build = { type = "boolean" }, logs = ID, required = { "name", "source" } },
    result = { "name", "recipe", "file", "sha256", "registered_at", "locked", "build" },
  },
  ["recipe.list"] = {
    doc = "The recipes registered with the daemon, by name.",
    params = {},
    result = { "recipes" },
  },
  ["recipe.remove"] = {
    doc = "Forgets a registered recipe; false when there was none.  Its cached layer stays.",
    params = { name = { type = "string", min = 1, max = 256 }, required = { "name" } },
    result = { "removed" },
  },
  ["sandbox.get"] = {
    doc = "Describes one sandbox.",
    params = { id = ID, required = { "id" } },
    result = { "id", "image", "backend", "state", "created_at", "metadata", "processes", "limits", "timeout",
               "default_user", "home" },
  },
  ["sandbox.pause"] = {
    doc = "Freezes every process of the sandbox (cgroup freezer); its lifetime stands still.  With keep_memory (true or false) the pause is also written to disk and survives daemon restarts and host reboots (docs/snapshots.md): true keeps the frozen box while the host runs, false removes it (its files are kept).",
    params = { id = ID, keep_memory = { type = "boolean" }, required = { "id" } },
    result = { "state", "persisted", "box" },
  },
  ["sandbox.resume"] = {
    doc = "Thaws a paused sandbox; one paused to disk whose box is gone gets a new box of the same id with its files (restarted: true, no processes).",
    params = { id = ID, required = { "id" } },
    result = { "state" },
  },
  ["sandbox.metrics"] = {
    doc = "The sandbox's resource counters, from its cgroup; with series, also its recent samples.",
    params = { id = ID, series = { type = "boolean" }, required = { "id" } },
    result = { "cpu_usage_usec", "memory_bytes", "pids", "oom_kills" },
  },
  ["sandbox.set_timeout"] = {
    doc = "Sets how long from now the sandbox lives (0: until killed).",
    params = { id = ID, timeout = DURATION, required = { "id", "timeout" } },
    result = { "timeout" },
  },
  ["sandbox.update_network"] = {
    doc = "Replaces the sandbox's network rules; the next connection and DNS query follow them.",
    params = { id = ID, network = NETWORK, required = { "id", "network" } },
    result = { "network" },
  },
  ["sandbox.network_log"] = {
    doc = "The sandbox's recent network decisions (allow/deny, host, port, reason, time), oldest first.",
    params = { id = ID, required = { "id" } },
    result = { "entries" },
  },
  ["sandbox.expose"] = {
    doc = "Forwards a port on the host's 127.0.0.1 (chosen by the daemon) to a port inside the sandbox.",
    params = { id = ID, port = { type = "integer", min = 1, max = 65535 }, required = { "id", "port" } },
    result = { "host", "port" },
  },
  ["sandbox.list"] = {
    doc = "Lists the sandboxes.",
    params = {},
    result = { "sandboxes" },
  },
  ["sandbox.snapshot"] = {
    doc = "Freezes the sandbox, copies its files into a read-only snapshot layer, thaws it (docs/snapshots.md).",
    params = { id = ID, name = SNAPSHOT_NAME, required = { "id" } },
    result = { "id", "names", "sandbox", "image", "created_at", "size", "sandboxes" },
  },
  ["sandbox.fork"] = {
    doc = "One snapshot of the sandbox, then count sandboxes made from it with its env, limits, network rules and policy.",
    params = { id = ID, count = { type = "integer", min = 1, max = 64 }, name = SNAPSHOT_NAME,
               kill_on_disconnect = { type = "boolean" }, required = { "id" } },
    result = { "snapshot", "sandboxes" },
  },
  ["snapshot.list"] = {
    doc = "The daemon's snapshots.",
    params = {},
    result = { "snapshots" },
  },
  ["snapshot.delete"] = {
    doc = "Deletes a snapshot (by id or name); refused while a sandbox uses it.",
    params = { id = SNAPSHOT_REF, required = { "id" } },
    result = { "deleted" },
  },
  ["sandbox.kill"] = {
    doc = "Kills every process of a sandbox and removes it; false when unknown.",
    params = { id = ID, required = { "id" } },
    result = { "killed" },
  },
  ["process.start"] = {
    doc = "Starts a process: argv, or cmd run by /bin/sh -c.  Output and exit arrive as notifications.",
    params = { sandbox = ID, argv = { type = "array", min = 1, max = 4096, item_max = 32768 },
               cmd = { type = "string", min = 1, max = 32760 }, env = MAP, cwd = PATH,
               stdin = { type = "boolean" }, encoding = ENCODING, timeout = DURATION, user = USER,
               streams = { type = "boolean" },
               required = { "sandbox" }, one_of = { "argv", "cmd" } },
    result = { "pid" },
  },
  ["process.stdin"] = {
    doc = "Writes to a process's stdin (started with stdin = true).",
    params = { sandbox = ID, pid = { type = "integer", min = 1, max = 4194304 },
               data = { type = "string", max = 1398104, binary = true }, encoding = ENCODING,
               required = { "sandbox", "pid", "data" } },
    result = {},
  },
  ["process.connect"] = {
    doc = "Attaches this connection to a running process: the reply carries its recent output "
      .. "(the last 64 KiB the daemon kept), then its output and exit arrive as notifications. "
      .. "exited = true also takes one of the box's last 16 exited processes: the reply then has its exit.",
    params = { sandbox = ID, pid = PID, encoding = ENCODING, exited = { type = "boolean" },
               streams = { type = "boolean" }, required = { "sandbox", "pid" } },
    result = { "pid", "output", "dropped" },
  },
  ["pty.create"] = {
    doc = "Starts a program (default /bin/sh -i -l) on a new terminal of cols x rows; its output "
      .. "arrives as process.output (stream stdout), its end as process.exit; input goes by process.stdin.",
    params = { sandbox = ID, cols = PTY_DIM, rows = PTY_DIM, env = MAP, cwd = PATH, user = USER,
               argv = { type = "array", min = 1, max = 4096, item_max = 32768 },
               timeout = DURATION, streams = { type = "boolean" },
               required = { "sandbox", "cols", "rows" } },
    result = { "pid" },
  },
  ["pty.resize"] = {
    doc = "Resizes a process's terminal; its foreground programs get SIGWINCH.",
    params = { sandbox = ID, pid = PID, cols = PTY_DIM, rows = PTY_DIM,
               required = { "sandbox", "pid", "cols", "rows" } },
    result = {},
  },
  ["fs.watch"] = {
    doc = "Watches a directory (recursive = true: its whole tree, new directories too); events "
      .. "arrive as fs.event notifications on this connection until fs.unwatch or disconnect.",
    params = { sandbox = ID, user = USER, path = PATH, recursive = { type = "boolean" }, required = { "sandbox", "path" } },
    result = { "watch" },
  },
  ["fs.unwatch"] = {
    doc = "Stops a watch made by this connection.",
    params = { sandbox = ID, watch = { type = "integer", min = 1, max = 9007199254740991 },
               required = { "sandbox", "watch" } },
    result = {},
  },
  ["process.close_stdin"] = {
    doc = "Closes a process's stdin once what was written is delivered.",
    params = { sandbox = ID, pid = { type = "integer", min = 1, max = 4194304 },
               required = { "sandbox", "pid" } },
    result = {},
  },
  ["process.signal"] = {
    doc = "Sends a signal to a process and its whole process group.",
    params = { sandbox = ID, pid = { type = "integer", min = 1, max = 4194304 },
               signal = { type = "signal" }, required = { "sandbox", "pid" } },
    result = {},
  },
  ["process.list"] = {
    doc = "Lists the running processes started through the API; exited = true adds the box's "
      .. "last 16 exited ones, each with its exit.",
    params = { sandbox = ID, exited = { type = "boolean" }, required = { "sandbox" } },
    result = { "processes" },
  },
  ["fs.read"] = {
    doc = "Reads up to length bytes (at most 1 MiB) of a file from offset.",
    params = { sandbox = ID, user = USER, path = PATH, offset = { type = "integer", min = 0, max = 99999999999999 },
               length = { type = "integer", min = 0, max = 1048576 }, encoding = ENCODING,
               required = { "sandbox", "path" } },
    result = { "data", "encoding", "size", "eof" },
  },
  ["fs.write"] = {
    doc = "Writes data (at most 1 MiB) to a file at offset, or appends; creates missing parents.",
    params = { sandbox = ID, user = USER, path = PATH, data = { type = "string", max = 1398104, binary = true },
               encoding = ENCODING, offset = { type = "integer", min = 0, max = 99999999999999 },
               append = { type = "boolean" }, truncate = { type = "boolean" },
               mode = { type = "integer", min = 0, max = 4095 },
               required = { "sandbox", "path", "data" } },
    result = { "size" },
  },
  ["fs.read_stream"] = {
    doc = "Opens a stream that sends a file's bytes from offset on the data connection (stream frames).",
    params = { sandbox = ID, user = USER, path = PATH, offset = { type = "integer", min = 0, max = 99999999999999 },
               length = { type = "integer", min = 0, max = 99999999999999 },
               required = { "sandbox", "path" } },
    result = { "stream", "size" },
  },
  ["fs.write_stream"] = {
    doc = "Opens a stream that writes the bytes the client sends on the data connection to a file.",
    params = { sandbox = ID, user = USER, path = PATH, offset = { type = "integer", min = 0, max = 99999999999999 },
               append = { type = "boolean" }, truncate = { type = "boolean" },
               mode = { type = "integer", min = 0, max = 4095 },
               required = { "sandbox", "path" } },
    result = { "stream" },
  },
  ["fs.read_fd"] = {
    doc = "Opens a file of a linux sandbox for reading and hands the open file to the client with the reply (SCM_RIGHTS on a unix socket).",
    params = { sandbox = ID, user = USER, path = PATH, required = { "sandbox", "path" } },
    result = { "size", "mode" },
  },
  ["fs.write_fd"] = {
    doc = "Opens (creates, truncates) a file of a linux sandbox for writing and hands the open file to the client with the reply (SCM_RIGHTS on a unix socket).",
    params = { sandbox = ID, user = USER, path = PATH, append = { type = "boolean" }, truncate = { type = "boolean" },
               mode = { type = "integer", min = 0, max = 4095 }, required = { "sandbox", "path" } },
    result = { "size", "mode" },
  },
  ["stream.channel"] = {
    doc = "Gives a single-use token for opening this connection's data connection.",
    params = { token = { type = "string", min = 32, max = 32 } },
    result = { "token" },
  },
  ["stream.attach"] = {
    doc = "The first and only JSON call of a data connection: stream frames follow its reply.",
    params = { token = { type = "string", min = 32, max = 32 },
               window = { type = "integer", min = 65536, max = 67108864 },
               required = { "token" } },
    result = { "protocol", "window", "frame_max" },
  },
  ["fs.list"] = {
    doc = "Lists a directory, sorted by name.",
    params = { sandbox = ID, user = USER, path = PATH, required = { "sandbox", "path" } },
    result = { "entries", "truncated" },
  },
  ["fs.stat"] = {
    doc = "Describes a file without following a final symlink.",
    params = { sandbox = ID, user = USER, path = PATH, required = { "sandbox", "path" } },
    -- (and, when present: link; name_raw, path_raw, link_raw: the base64
    -- bytes of a name, path or target that is not UTF-8, docs/protocol.md)
    result = { "name", "path", "type", "size", "mode", "mtime", "uid", "gid" },
  },
  ["fs.mkdir"] = {
    doc = "Makes a directory (parents too with parents = true); created is false when it existed.",
    params = { sandbox = ID, user = USER, path = PATH, parents = { type = "boolean" },
               mode = { type = "integer", min = 0, max = 4095 }, required = { "sandbox", "path" } },
    result = { "created" },
  },
  ["fs.remove"] = {
    doc = "Removes a file or directory (recursive = true for a non-empty one).",
    params = { sandbox = ID, user = USER, path = PATH, recursive = { type = "boolean" },
               required = { "sandbox", "path" } },
    result = {},
  },
  ["image.list"] = {
    doc = "Lists the images of the store, by ref.",
    params = {},
    result = { "images" },
  },
  ["image.inspect"] = {
    doc = "Describes one image: its digest, layers and config (env, entrypoint, cmd, workdir, user).",
    params = { ref = IMAGE_REF, required = { "ref" } },
    result = { "config", "layers" },
  },
  ["image.remove"] = {
    doc = "Removes an image's ref, and its blobs and layers unless something else needs them; refused while a sandbox uses it.",
    params = { ref = IMAGE_REF, required = { "ref" } },
    result = { "ref", "digest", "blobs", "layers" },
  },
  ["image.prune"] = {
    doc = "Removes blobs and layers nothing reaches; all = true also removes every image no sandbox uses and no pin holds.",
    params = { all = { type = "boolean" } },
    result = { "refs", "blobs", "layers" },
  },
  ["image.import"] = {
    doc = "Imports an OCI image layout, a docker-archive tar or a rootfs tar or directory (an absolute path on the daemon's host) as ref.",
    params = { path = PATH, ref = IMAGE_REF, required = { "path" } },
    result = { "ref", "digest" },
  },
  ["fs.rename"] = {
    doc = "Renames a file or directory.",
    params = { sandbox = ID, user = USER, from = PATH, to = PATH, required = { "sandbox", "from", "to" } },
    result = {},
  },
}

M.methods["fs.setattr"] = {
  doc = "Sets a file's mode (chmod; ignored for a symlink) and/or its access and modification "
    .. "time (seconds since the epoch), never following a final symlink.",
  params = { sandbox = ID, user = USER, path = PATH, mode = { type = "integer", min = 0, max = 4095 },
             mtime = { type = "integer", min = 0, max = 99999999999 }, required = { "sandbox", "path" } },
  result = {},
}
M.methods["fs.symlink"] = {
  doc = "Makes path a symlink to target (taken as text, never resolved by the daemon); an existing path is an error.",
  params = { sandbox = ID, user = USER, path = PATH, target = PATH, required = { "sandbox", "path", "target" } },
  result = {},
}

M.methods["image.pull"] = {
  doc = "Pulls an image from its registry into the daemon's store (linux/amd64); progress = true sends image.progress notifications.",
  params = { ref = { type = "string", min = 1, max = 512 }, progress = { type = "boolean" },
             required = { "ref" } },
  result = { "ref", "digest", "size", "layers" },
}

M.notifications = {
  ["process.output"] = { "sandbox", "pid", "stream", "data", "encoding" },
  ["process.exit"] = { "sandbox", "pid", "exit_code", "signal", "timed_out", "oom_killed" },
  ["image.progress"] = { "ref", "done", "total" },
  ["recipe.log"] = { "sandbox", "pid", "stream", "data", "encoding" },
  ["fs.event"] = { "sandbox", "watch", "type", "name", "message" }, -- and name_raw (docs/protocol.md)
}

local SIGNALS = { HUP = 1, INT = 2, QUIT = 3, KILL = 9, USR1 = 10, USR2 = 12, TERM = 15,
                  CONT = 18, STOP = 19, TSTP = 20, WINCH = 28 }
M.SIGNALS = SIGNALS

-- A name of a map's entry in a message: at most 64 bytes of it.
local function entry_name(k)
  return #k > 64 and (k:sub(1, 64) .. "...") or k
end

-- A "map" field (env, metadata): names to strings.  Each message names the
-- rule that was broken.
local function check_map(name, spec, v)
  if type(v) ~= "table" then return ("'%s' must be an object of strings"):format(name) end
  local n, total = 0, 0
  for k, x in pairs(v) do
    n = n + 1
    if n > spec.max then return ("'%s' has more than %d entries"):format(name, spec.max) end
    if type(k) ~= "string" then return ("'%s' must be an object of strings"):format(name) end
    if #k == 0 then return ("'%s': a name must not be empty"):format(name) end
    if #k > spec.key_max then
      return ("'%s': name '%s' is longer than %d bytes"):format(name, entry_name(k), spec.key_max)
    end
    if k:find("\0", 1, true) then return ("'%s': a name must not contain a NUL byte"):format(name) end
    if k:find("=", 1, true) then
      return ("'%s': name '%s' must not contain '='"):format(name, entry_name(k))
    end
    if type(x) ~= "string" then return ("'%s.%s' must be a string"):format(name, entry_name(k)) end
    if #x > spec.value_max then
      return ("'%s.%s' is longer than %d bytes"):format(name, entry_name(k), spec.value_max)
    end
    if x:find("\0", 1, true) then
      return ("'%s.%s' must not contain a NUL byte"):format(name, entry_name(k))
    end
    total = total + #k + #x
    if spec.total_max and total > spec.total_max then
      return ("'%s' is over %d bytes in all (names and values)"):format(name, spec.total_max)
    end
  end
  return nil, v
end

local check
function check(name, spec, v)
  local t = spec.type
  if spec.zero and (v == 0 or v == "unlimited" or v == "0") then return nil, 0 end
  if t == "string" or t == "enum" then
    if type(v) ~= "string" then return ("'%s' must be a string"):format(name) end
    if t == "enum" then
      for _, ok in ipairs(spec.values) do if v == ok then return nil, v end end
      return ("'%s' must be one of: %s"):format(name, table.concat(spec.values, ", "))
    end
    if spec.min and #v < spec.min then return ("'%s' is too short"):format(name) end
    if spec.max and #v > spec.max then return ("'%s' is longer than %d bytes"):format(name, spec.max) end
    if spec.pattern and not v:match(spec.pattern) then return ("'%s' is malformed"):format(name) end
    if not spec.binary and v:find("\0", 1, true) then return ("'%s' contains a NUL byte"):format(name) end
    return nil, v
  elseif t == "integer" then
    local i = type(v) == "number" and math.tointeger(v)
    if not i then return ("'%s' must be an integer"):format(name) end
    if (spec.min and i < spec.min) or (spec.max and i > spec.max) then
      return ("'%s' is out of range"):format(name)
    end
    return nil, i
  elseif t == "boolean" then
    if type(v) ~= "boolean" then return ("'%s' must be a boolean"):format(name) end
    return nil, v
  elseif t == "signal" then
    if type(v) == "string" then
      local n = SIGNALS[v:upper():gsub("^SIG", "")]
      if not n then return ("'%s': unknown signal %q"):format(name, v) end
      return nil, n
    end
    local i = type(v) == "number" and math.tointeger(v)
    if not i or i < 1 or i > 64 then return ("'%s' must be a signal name or 1..64"):format(name) end
    return nil, i
  elseif t == "number" then
    if type(v) ~= "number" or v ~= v then return ("'%s' must be a number"):format(name) end
    if (spec.min and v < spec.min) or (spec.max and v > spec.max) then
      return ("'%s' is out of range"):format(name)
    end
    return nil, v
  elseif t == "size" then
    local n, err = units.size(v)
    if not n then return ("'%s': %s"):format(name, err) end
    if spec.min and n < spec.min then return ("'%s' must be at least %s"):format(name, units.format_size(spec.min)) end
    return nil, n
  elseif t == "duration" then
    local n, err = units.duration(v)
    if not n then return ("'%s': %s"):format(name, err) end
    return nil, n
  elseif t == "object" then
    if type(v) ~= "table" then return ("'%s' must be an object"):format(name) end
    local out = {}
    for k, x in pairs(v) do
      local sub = type(k) == "string" and spec.fields[k]
      if not sub then return ("'%s' has an unknown field '%s'"):format(name, tostring(k)) end
      local err, val = check(name .. "." .. k, sub, x)
      if err then return err end
      out[k] = val
    end
    return nil, out
  elseif t == "array" then
    if type(v) ~= "table" then return ("'%s' must be an array of strings"):format(name) end
    local n = #v
    for k in pairs(v) do
      if math.type(k) ~= "integer" or k < 1 or k > n then
        return ("'%s' must be an array of strings"):format(name)
      end
    end
    if n < (spec.min or 0) then return ("'%s' must not be empty"):format(name) end
    if n > spec.max then return ("'%s' has more than %d items"):format(name, spec.max) end
    for i = 1, n do
      if type(v[i]) ~= "string" or #v[i] > spec.item_max or v[i]:find("\0", 1, true) then
        return ("'%s[%d]' must be a string without NUL bytes"):format(name, i)
      end
    end
    return nil, v
  elseif t == "network" then
    local rs, err = rules.compile(v)
    if not rs then return ("'%s': %s"):format(name, err) end
    return nil, rs.spec
  elseif t == "map" then
    return check_map(name, spec, v)
  end
  error("schema: unknown type " .. tostring(t))
end

--- Checks one value v, named name in messages, against a field spec
-- (M.LIMITS, M.MAP, ...): returns nil, the normalised value; or an error.
M.check = check

-- A field spec compiled once into a closure (name, v) -> err, value that
-- does what check does, test for test and message for message, without
-- dispatching on spec.type and reading spec's fields on each request (the
-- daemon validates every request: issue 14).  Types whose work is mostly in
-- a library call (size, duration, network, map, array, signal) keep to check.
-- Cached by spec (weak keys); the specs are not changed after load.
local compiled = setmetatable({}, { __mode = "k" })

local compile
local function compile_type(spec)
  local t = spec.type
  if t == "string" then
    local min, max, pattern, binary = spec.min, spec.max, spec.pattern, spec.binary
    return function(name, v)
      if type(v) ~= "string" then return ("'%s' must be a string"):format(name) end
      if min and #v < min then return ("'%s' is too short"):format(name) end
      if max and #v > max then return ("'%s' is longer than %d bytes"):format(name, max) end
      if pattern and not v:match(pattern) then return ("'%s' is malformed"):format(name) end
      if not binary and v:find("\0", 1, true) then return ("'%s' contains a NUL byte"):format(name) end
      return nil, v
    end
  elseif t == "enum" then
    local set = {}
    for _, ok in ipairs(spec.values) do set[ok] = true end
    local values = spec.values
    return function(name, v)
      if type(v) ~= "string" then return ("'%s' must be a string"):format(name) end
      if set[v] then return nil, v end
      return ("'%s' must be one of: %s"):format(name, table.concat(values, ", "))
    end
  elseif t == "integer" then
    local min, max = spec.min, spec.max
    return function(name, v)
      local i = type(v) == "number" and math.tointeger(v)
      if not i then return ("'%s' must be an integer"):format(name) end
      if (min and i < min) or (max and i > max) then return ("'%s' is out of range"):format(name) end
      return nil, i
    end
  elseif t == "boolean" then
    return function(name, v)
      if type(v) ~= "boolean" then return ("'%s' must be a boolean"):format(name) end
      return nil, v
    end
  elseif t == "object" then
    local fields = {}
    for k, sub in pairs(spec.fields) do fields[k] = compile(sub) end
    return function(name, v)
      if type(v) ~= "table" then return ("'%s' must be an object"):format(name) end
      local out = {}
      for k, x in pairs(v) do
        local sub = type(k) == "string" and fields[k]
        if not sub then return ("'%s' has an unknown field '%s'"):format(name, tostring(k)) end
        local err, val = sub(name .. "." .. k, x)
        if err then return err end
        out[k] = val
      end
      return nil, out
    end
  elseif t == "size" or t == "duration" then
    -- a string's value, parsed once: clients send the same few ("64M",
    -- "10m") again and again.  Bounded: emptied when full.
    local parse, min, seen, n = t == "size" and units.size or units.duration, t == "size" and spec.min, {}, 0
    return function(name, v)
      local x = type(v) == "string" and seen[v]
      if not x then
        local err
        x, err = parse(v)
        if not x then return ("'%s': %s"):format(name, err) end
        if type(v) == "string" then
          if n >= 64 then seen, n = {}, 0 end
          seen[v], n = x, n + 1
        end
      end
      if min and x < min then return ("'%s' must be at least %s"):format(name, units.format_size(min)) end
      return nil, x
    end
  end
  return function(name, v) return check(name, spec, v) end
end

function compile(spec)
  local f = compiled[spec]
  if f then return f end
  f = compile_type(spec)
  if spec.zero then
    local inner = f
    f = function(name, v)
      if v == 0 or v == "unlimited" or v == "0" then return nil, 0 end
      return inner(name, v)
    end
  end
  compiled[spec] = f
  return f
end
M.compile = compile

-- A method's params compiled (weak keys, by the method's table): each
-- param's checker, and its required and one_of lists.
local compiled_methods = setmetatable({}, { __mode = "k" })
local NONE = {}

local function compile_method(m)
  local checks = {}
  for k, spec in pairs(m.params) do
    if k ~= "required" and k ~= "one_of" then checks[k] = compile(spec) end
  end
  local cm = { checks = checks, required = m.params.required or NONE, one_of = m.params.one_of }
  compiled_methods[m] = cm
  return cm
end

--- Validates params of method; returns the normalised params, or nil, err.
function M.validate(method, params)
  local m = M.methods[method]
  if not m then return nil, "unknown method" end
  local cm = compiled_methods[m] or compile_method(m)
  if params == nil then params = {} end
  if type(params) ~= "table" then return nil, "params must be an object" end
  local checks, out = cm.checks, {}
  for k, v in pairs(params) do
    -- checks has string keys only, and neither "required" nor "one_of"
    local f = checks[k]
    if not f then return nil, ("unknown parameter '%s'"):format(tostring(k)) end
    local err, val = f(k, v)
    if err then return nil, err end
    out[k] = val
  end
  local required = cm.required
  for i = 1, #required do
    local k = required[i]
    if out[k] == nil then return nil, ("missing parameter '%s'"):format(k) end
  end
  local one_of = cm.one_of
  if one_of then
    local n = 0
    for _, k in ipairs(one_of) do if out[k] ~= nil then n = n + 1 end end
    if n ~= 1 then
      return nil, ("exactly one of '%s' is required"):format(table.concat(one_of, "', '"))
    end
  end
  return out
end

--- The reference: validate as check alone does it, spec by spec, with no
-- compiled closures (the unit specs hold M.validate to its every answer).
function M.validate_interpreted(method, params)
  local m = M.methods[method]
  if not m then return nil, "unknown method" end
  if params == nil then params = {} end
  if type(params) ~= "table" then return nil, "params must be an object" end
  local out = {}
  for k, v in pairs(params) do
    local spec = type(k) == "string" and k ~= "required" and k ~= "one_of" and m.params[k]
    if not spec then return nil, ("unknown parameter '%s'"):format(tostring(k)) end
    local err, val = check(k, spec, v)
    if err then return nil, err end
    out[k] = val
  end
  for _, k in ipairs(m.params.required or {}) do
    if out[k] == nil then return nil, ("missing parameter '%s'"):format(k) end
  end
  if m.params.one_of then
    local n = 0
    for _, k in ipairs(m.params.one_of) do if out[k] ~= nil then n = n + 1 end end
    if n ~= 1 then
      return nil, ("exactly one of '%s' is required"):format(table.concat(m.params.one_of, "', '"))
    end
  end
  return out
end

--- The schema as a plain table for JSON (`tupper schema`).
function M.export()
  local out = { protocol = M.PROTOCOL, methods = {}, notifications = {} }
  local names = {}
  for name in pairs(M.methods) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local m = M.methods[name]
    local params = {}
    for k, spec in pairs(m.params) do
      if k ~= "required" and k ~= "one_of" then
        local p = {}
        for sk, sv in pairs(spec) do p[sk] = type(sv) == "table" and json.array(sv) or sv end
        params[k] = p
      end
    end
    out.methods[#out.methods + 1] = {
      name = name, doc = m.doc, params = params,
      required = json.array(m.params.required or {}),
      one_of = m.params.one_of and json.array(m.params.one_of) or nil,
      result = json.array(m.result),
    }
  end
  for name, fields in pairs(M.notifications) do out.notifications[name] = fields end
  return out
end

return M
