--- The `tupper` command line as data: every verb's name, synopsis,
-- summary, description, options, positional arguments and examples.  The
-- parser (client/cli_args.lua), `--help` and `tupper help`, the shell
-- completions (client/cli_doc.lua) and the tupper(1) man page are all made
-- from this table, so they cannot disagree.
--
-- An option: long (without "--"), short (one letter, optional), value (the
-- name its value shows as; nil for a flag), kind (what the value is: it
-- picks the parser's check and the completion), repeatable, values (an
-- enum's choices), key (the field of the parsed options; default the long
-- name in snake_case), summary (one line), min/max (of an int).
--
-- A positional argument: name, kind, optional, repeatable.  Kinds that
-- completion knows: id (a sandbox id), image, file, dir, remote (a host
-- file or ID:/path), command (a command line: everything after it is its
-- own), script, verb, shell.
local M = {}

-- Options shared by several verbs, by name.
local O = {}
local function opt(name, t)
  if t.long == nil then t.long = name end
  t.key = t.key or t.long:gsub("-", "_")
  O[name] = t
end

-- global options (before the verb)
opt("socket", { value = "PATH", kind = "file", summary = "the daemon's socket (default: $TUPPER_SOCKET, else the per-user default)" })
opt("state-dir", { value = "DIR", kind = "dir", summary = "the state directory of a daemon --autostart starts (and the one doctor checks)" })
opt("autostart", { summary = "start a private daemon when none answers (also TUPPER_AUTOSTART=1)" })
opt("help", { short = "h", summary = "show this help" })
opt("version", { summary = "print the version" })

-- run, create, exec
opt("interactive", { short = "i", summary = "pass stdin through" })
opt("tty", { short = "t", summary = "on a terminal of the box (-it: and stdin, in raw mode)" })
opt("detach-keys", { value = "KEYS", kind = "string", summary = "keys that detach from a terminal, e.g. ctrl-p,ctrl-q (default ctrl-]; '' none)" })
opt("env", { short = "e", value = "K=V", kind = "kv", repeatable = true, summary = "set an environment variable" })
opt("workdir", { short = "w", value = "DIR", kind = "string", summary = "working directory (in the box)" })
opt("image", { value = "NAME", kind = "image", summary = "image (default: the embedded 'default')" })
opt("backend", { value = "NAME", kind = "enum", values = { "linux", "microvm" },
  summary = "linux (namespaces, the default) or microvm (a VM with its own kernel)" })
opt("metadata", { value = "K=V", kind = "kv", repeatable = true, summary = "attach metadata" })
opt("rm", { summary = "remove the sandbox after the command (the default)" })
opt("memory", { value = "SIZE", kind = "size", summary = "memory limit, e.g. 256M" })
opt("cpus", { value = "N", kind = "number", summary = "CPU quota in cores, e.g. 0.5" })
opt("pids", { value = "N", kind = "int", min = 1, summary = "most processes at once" })
opt("disk", { value = "SIZE", kind = "size", summary = "most the box can write, e.g. 1G" })
opt("timeout", { value = "DURATION", kind = "duration", summary = "lifetime, e.g. 10m; 0 = until killed" })
opt("policy", { value = "FILE", kind = "file", summary = "policy file (default: the nearest tupper.lua from here upward)" })
opt("no-policy", { summary = "send no policy file" })
opt("allow", { value = "RULE", kind = "rule", repeatable = true, summary = "let the box reach RULE, e.g. pypi.org:443 or 10.0.0.0/8:5432" })
opt("deny", { value = "RULE", kind = "rule", repeatable = true, summary = "never let the box reach RULE" })
opt("network", { value = "MODE", kind = "enum", values = { "all", "none" },
  summary = "every public address, or nothing (the default)" })
opt("volume", { short = "v", value = "NAME:/PATH", kind = "string", repeatable = true,
  summary = "mount the volume NAME at /PATH in the box (tupper volume create)" })
opt("size", { value = "SIZE", kind = "size", summary = "a volume's capacity, e.g. 256M (default 1G)" })
opt("recipe", { value = "FILE|NAME", kind = "file", summary = "make the sandbox from a recipe: a Lua file (with its .lock) or a shipped recipe's name" })
opt("snapshot", { value = "ID|NAME", kind = "string", summary = "make the sandbox from a snapshot's files and settings (tupper snapshot)" })
opt("keep-memory", { summary = "pause to disk: survives daemon restarts and reboots; the frozen box is kept while the host runs" })
opt("files-only", { summary = "pause to disk, keeping the files only: the box is removed now; resume starts a new one" })
opt("count", { short = "n", value = "N", kind = "int", min = 1, max = 64, summary = "how many sandboxes (default 1, at most 64)" })

-- listings and logs
opt("json", { summary = "print JSON" })
opt("network-log", { long = "network", key = "network", summary = "the network decisions instead of output" })
opt("quiet", { short = "q", summary = "print only the ids" })
opt("no-trunc", { summary = "do not shorten ids, references and digests" })
opt("follow", { short = "f", summary = "keep printing as new output comes" })
opt("tail", { value = "N", kind = "int", min = 0, summary = "print only the last N lines" })
opt("no-stream", { summary = "print once and exit (the default when stdout is not a terminal)" })
opt("recursive", { short = "r", summary = "copy directories and what is in them" })
opt("recursive-R", { long = false, short = "R", key = "recursive", summary = "the same as -r" })
opt("archive", { short = "a", summary = "also keep setuid/setgid bits into a box (implies -r)" })

-- daemon
local function dopt(name, t) opt(name, t); O[name].daemon = true end
dopt("log", { value = "FILE", kind = "file", summary = "append the log to FILE (default: stderr)" })
dopt("pool", { value = "N", kind = "int", min = 0, max = 64, summary = "linux boxes kept started for fast creates (default 2)" })
dopt("vm-pool", { value = "N", kind = "int", min = 0, max = 16, summary = "microVMs kept frozen for fast creates (default 0)" })
dopt("max-layer", { value = "SIZE", kind = "size", summary = "most an image layer may unpack to (default 16G)" })
dopt("uid-base", { value = "UID", kind = "int", min = 1, summary = "first host uid of the boxes' mapped ranges" })
dopt("default-memory", { value = "SIZE", kind = "string", summary = "the default memory limit of a box (0: none; docs/limits.md)" })
dopt("default-cpus", { value = "N", kind = "string", summary = "the default CPU quota in cores (0: none)" })
dopt("default-pids", { value = "N", kind = "string", summary = "the default pids limit (0: none)" })
dopt("default-disk", { value = "SIZE", kind = "string", summary = "the default disk cap (0: none)" })
dopt("default-timeout", { value = "DURATION", kind = "string", summary = "the default lifetime of a created box (0: until killed)" })
dopt("max-sandboxes", { value = "N", kind = "string", summary = "most live sandboxes (default 1024; 0: no cap)" })
dopt("max-memory", { value = "SIZE", kind = "string", summary = "most the sandboxes' memory limits may total (default: the host's memory; 0: no cap)" })
dopt("max-clients", { value = "N", kind = "string", summary = "most connections at once (default 1024; 0: no cap)" })
dopt("max-requests", { value = "N", kind = "string", summary = "most requests in flight on one connection (default 256; 0: no cap)" })
dopt("max-streams", { value = "N", kind = "string", summary = "most watches, process attachments and port forwards of one connection (default 256; 0: no cap)" })
dopt("max-queued", { value = "SIZE", kind = "string", summary = "most bytes queued to one connection before its client reads them; past it the client is dropped (default 64M; 0: no cap)" })
dopt("idle-timeout", { value = "DURATION", kind = "string", summary = "close a connection idle this long (default 600s; 0: never)" })
dopt("accel", { value = "MODE", kind = "enum", values = { "auto", "kvm", "tcg" },
  summary = "the microVMs' accelerator: auto (try KVM), kvm or tcg (run, create: this microVM's; auto: the daemon's)" })

-- the rest
opt("eval", { long = false, short = "e", key = "eval", value = "CODE", kind = "string", repeatable = true,
  summary = "run CODE and print what it returns" })
opt("listen", { value = "ADDR:PORT", kind = "string", summary = "where to listen (default 127.0.0.1:8787); any address but loopback needs a token" })
opt("token", { value = "TOKEN", kind = "string", summary = "every request must carry Authorization: Bearer TOKEN (at least 16 characters; default: $TUPPER_HTTP_TOKEN)" })
opt("max-body", { value = "BYTES", kind = "string", summary = "largest file upload or stdin body (default 1 GiB)" })
opt("max-json", { value = "BYTES", kind = "string", summary = "largest JSON body (default 1 MiB)" })
opt("all", { short = "a", summary = "also images no sandbox uses and no lockfile pins" })
opt("kvm-check", { summary = "boot the guest kernel once under KVM to see whether it runs (up to 10 s)" })
opt("scdoc", { summary = "print the tupper(1) man page's scdoc source" })

M.OPTIONS = O

--- The global options, in the order help shows them.
M.GLOBAL = { "socket", "state-dir", "autostart", "help", "version" }

local LIMITS = { "memory", "cpus", "pids", "disk", "timeout", "policy", "no-policy", "allow", "deny",
  "network", "backend", "accel" }
local function list(...)
  local out = {}
  for _, l in ipairs({ ... }) do
    for _, v in ipairs(type(l) == "table" and l or { l }) do out[#out + 1] = v end
  end
  return out
end

local ID = { name = "ID", kind = "id" }
local IDS = { name = "ID", kind = "id", repeatable = true }

--- The verbs, in the order the overview shows them.  group: the section of
-- the overview; daemon = true: the verb talks to a daemon.
M.VERBS = {
  { name = "run", group = "sandboxes", daemon = true,
    synopsis = "[OPTIONS] [--] [CMD [ARG...]]",
    summary = "run CMD in a new sandbox, then remove it",
    description = {
      "Creates a sandbox, runs CMD in it with its output streamed to this terminal, and removes the sandbox when CMD exits (or when this client goes). The exit code is CMD's; 125 when tupper itself failed, 126 when CMD cannot run, 127 when it is not found, 128+N when a signal N ended it.",
      "With no CMD, the image's Entrypoint and Cmd run (an image of the store), or /bin/sh. Options stop at CMD; `--` ends them explicitly. The box lives as long as CMD unless --timeout says otherwise.",
    },
    options = list("interactive", "tty", "detach-keys", "env", "workdir", "image", "metadata", "rm", "recipe", "volume", LIMITS),
    args = { { name = "CMD", kind = "command", optional = true, repeatable = true } },
    examples = {
      { "tupper run -- sh -c 'echo hi; exit 3'", "prints hi, exits 3" },
      { "echo data | tupper run -i -- wc -c", "stdin passed through" },
      { "tupper run -it -- sh", "a shell on a terminal" },
      { "tupper run --memory 256M --cpus 0.5 --allow pypi.org:443 -- pip download x", "limits and a network rule" },
      { "tupper run --recipe python -- python3 -c 'print(1)'", "a shipped recipe" },
    } },
  { name = "create", group = "sandboxes", daemon = true,
    synopsis = "[OPTIONS]",
    summary = "create a sandbox and print its id",
    description = {
      "Creates a sandbox that stays: it lives 5 minutes unless --timeout says otherwise (0: until killed). Prints its id.",
    },
    options = list("env", "workdir", "image", "metadata", "recipe", "volume", "snapshot", LIMITS),
    args = {},
    examples = {
      { "id=$(tupper create --timeout 1h --memory 1G)", "" },
      { "tupper create --snapshot base", "from the snapshot named base" },
      { "tupper create --backend microvm --cpus 2 --disk 2G", "a VM with its own kernel" },
    } },
  { name = "exec", group = "sandboxes", daemon = true,
    synopsis = "[OPTIONS] ID [--] CMD [ARG...]",
    summary = "run CMD in a sandbox",
    description = {
      "Runs CMD in the sandbox ID with its output streamed to this terminal; the exit code is CMD's (as for run). Options come before CMD; `--` ends them explicitly.",
      "With -t the command runs on a terminal of the box (-it: with this terminal's keys, in raw mode); the detach keys (default ctrl-]) leave it running there, and tupper attach goes back to it.",
    },
    options = { "interactive", "tty", "detach-keys", "env", "workdir" },
    args = { ID, { name = "CMD", kind = "command", repeatable = true } },
    examples = {
      { "tupper exec $id -- ps", "its processes: the agent is PID 1" },
      { "tupper exec -it $id sh", "a shell on a terminal" },
      { "tupper exec -e DEBUG=1 -w /tmp $id -- env", "" },
    } },
  { name = "attach", group = "sandboxes", daemon = true,
    synopsis = "[--detach-keys KEYS] ID PID",
    summary = "back onto the terminal of a process exec -it started",
    description = { "Shows what the terminal of process PID of sandbox ID showed last, sizes it to this window, and sends it this terminal's keys again, until the process exits or the detach keys (default ctrl-]) are typed." },
    options = { "detach-keys" },
    args = { ID, { name = "PID", kind = "string" } },
    examples = { { "tupper attach $id 12", "" } } },
  { name = "ls", group = "sandboxes", daemon = true,
    synopsis = "[--json] [-q] [--no-trunc]",
    summary = "list sandboxes",
    description = { "Lists the sandboxes of the daemon: id, image, state, creation time and number of processes. Columns fit their content; a long image reference is shortened with an ellipsis unless --no-trunc." },
    options = { "json", "quiet", "no-trunc" },
    args = {},
    examples = { { "tupper ls", "" }, { "tupper ls -q | xargs tupper kill", "kill every sandbox" } } },
  { name = "cp", group = "sandboxes", daemon = true,
    synopsis = "[-r] [-a] SRC DST",
    summary = "copy files or trees between the host and a sandbox",
    description = { "Copies SRC to ID:DEST (host to box) or ID:SRC to DEST (box to host), as docker cp does: a directory needs -r; modes, times and symlinks are kept; every file is written under a temporary name and renamed once whole. `-` as DEST writes a tar stream of ID:SRC to stdout; `-` as SRC unpacks a tar stream from stdin into ID:DIR. What comes out of a box never writes outside DEST (docs/cli.md)." },
    options = { "recursive", "recursive-R", "archive" },
    args = { { name = "SRC", kind = "remote" }, { name = "DST", kind = "remote" } },
    examples = {
      { "tupper cp ./script.sh $id:/root/script.sh", "" },
      { "tupper cp $id:/root/out.txt ./out.txt", "" },
      { "tupper cp -r ./project $id:/home/user", "" },
      { "tupper cp $id:/var/log - | tar tv", "a tar stream" },
    } },
  { name = "kill", group = "sandboxes", daemon = true,
    synopsis = "ID...",
    summary = "kill sandboxes and remove them",
    description = { "Kills every process of each sandbox and removes it: its mounts, files and cgroups go. Prints each id killed; the exit code is 125 if one of them was not there." },
    options = {},
    args = { IDS },
    examples = { { "tupper kill $id", "" } } },
  { name = "snapshot", group = "sandboxes", daemon = true,
    synopsis = "ID [NAME] | snapshot ls [--json] | snapshot rm ID|NAME...",
    summary = "snapshot a sandbox's files",
    description = { "Freezes the sandbox, copies its files into a read-only snapshot, thaws it, and prints the snapshot's id (docs/snapshots.md). NAME, if given, also names it. tupper create --snapshot makes a sandbox from it; tupper fork snapshots and creates in one step." },
    options = {},
    args = { ID, { name = "NAME", kind = "string", optional = true } },
    examples = { { "tupper snapshot $id base", "" }, { "tupper create --snapshot base", "" } } },
  { name = "snapshot ls", group = "sandboxes", daemon = true,
    synopsis = "[--json]",
    summary = "list the snapshots",
    description = { "Lists the snapshots: id, names, the sandbox it was taken of, size, creation time and the sandboxes using it." },
    options = { "json" },
    args = {},
    examples = { { "tupper snapshot ls", "" } } },
  { name = "snapshot rm", group = "sandboxes", daemon = true,
    synopsis = "ID|NAME...",
    summary = "delete snapshots",
    description = { "Deletes each snapshot; refused while a sandbox uses it. The exit code is 125 if one of them could not be deleted." },
    options = {},
    args = { { name = "SNAPSHOT", kind = "string", repeatable = true } },
    examples = { { "tupper snapshot rm base", "" } } },
  { name = "fork", group = "sandboxes", daemon = true,
    synopsis = "[-n N] ID",
    summary = "copy a running sandbox N times",
    description = { "Snapshots the sandbox ID and creates N sandboxes (default 1, at most 64) from it: each sees its files as they were at that instant, writes on its own, and has its env, limits, network rules and policy. Prints the new ids, one a line." },
    options = { "count" },
    args = { ID },
    examples = { { "tupper fork -n 3 $id", "three copies" } } },
  { name = "pause", group = "sandboxes", daemon = true,
    synopsis = "[--keep-memory | --files-only] ID...",
    summary = "freeze every process of sandboxes",
    description = { "Freezes every process of each sandbox (the cgroup freezer); resume thaws them. Nothing is written: a daemon restart keeps a paused box, a reboot loses it.",
      "With --keep-memory or --files-only the pause is also written to disk: the sandbox survives daemon restarts and host reboots, listed as paused. On the linux backend that is a snapshot of its files: --keep-memory keeps the frozen box while the host runs (resume thaws its processes), --files-only removes it now, and once the box is gone resume gives the sandbox a new box with its files and no processes. A microVM's (--keep-memory only) is a snapshot of the whole VM, which is removed: resume starts it again with every process (docs/snapshots.md)." },
    options = { "keep-memory", "files-only" },
    args = { IDS },
    examples = { { "tupper pause $id", "" }, { "tupper pause --files-only $id", "free its memory, keep its files" } } },
  { name = "resume", group = "sandboxes", daemon = true,
    synopsis = "ID...",
    summary = "thaw the processes of paused sandboxes",
    description = { "Thaws every process of each sandbox that pause froze; a sandbox paused to disk whose box is gone gets a new box with its files (no processes)." },
    options = {},
    args = { IDS },
    examples = { { "tupper resume $id", "" } } },
  { name = "stats", group = "sandboxes", daemon = true,
    synopsis = "[--json] [--no-stream] [ID...]",
    summary = "resource counters of sandboxes",
    description = { "Prints the resource counters (CPU time, memory, processes, throttling, OOM kills) of each sandbox named, or of every sandbox: one line each. On a terminal the table is redrawn every 2 seconds until interrupted, unless --no-stream. With one ID and not on a terminal (or with --no-stream), one counter a line; --json prints the object of one ID, else an array." },
    options = { "json", "no-stream" },
    args = { { name = "ID", kind = "id", optional = true, repeatable = true } },
    examples = { { "tupper stats", "every sandbox" }, { "tupper stats --json $id", "" } } },
  { name = "logs", group = "sandboxes", daemon = true,
    synopsis = "[OPTIONS] ID [PID]",
    summary = "a sandbox's process output, or its network decisions",
    description = { "With no PID, lists the sandbox's processes started through the API, and its last 16 exited ones with how they ended; with a PID, prints what it wrote lately (the daemon keeps 64 KiB, exited or not), and with -f follows it until it exits (the exit code is then the process's). With --network, the sandbox's network decisions: each connection allowed or denied, and why." },
    options = { "network-log", "json", "follow", "tail" },
    args = { ID, { name = "PID", kind = "string", optional = true } },
    examples = { { "tupper logs $id", "its processes" }, { "tupper logs -f --tail 20 $id 12", "" },
      { "tupper logs --network $id", "what it tried to reach" } } },
  { name = "port", group = "sandboxes", daemon = true,
    synopsis = "ID PORT",
    summary = "forward a port of a sandbox to the host's loopback",
    description = { "Forwards PORT of the sandbox to a port of 127.0.0.1 on the host and prints 127.0.0.1:HOSTPORT." },
    options = {},
    args = { ID, { name = "PORT", kind = "string" } },
    examples = { { "tupper port $id 8000", "" } } },
  { name = "pull", group = "images", daemon = true,
    synopsis = "[-q] REF",
    summary = "pull an image from its registry",
    description = { "Pulls an image (linux/amd64) from its registry into the daemon's store, every blob verified against its digest, with a progress bar on a terminal; prints REF@DIGEST. Credentials come from a docker-style ~/.config/tupper/auth.json." },
    options = { { name = "quiet", summary = "no progress bar" } },
    args = { { name = "REF", kind = "string" } },
    examples = { { "tupper pull alpine", "" }, { "tupper pull ghcr.io/org/app:1.2", "" } } },
  { name = "import", group = "images", daemon = true,
    synopsis = "PATH [NAME]",
    summary = "import an image from a file or directory",
    description = { "Imports an OCI image layout, a `docker save` tar, or a rootfs tar or directory into the store, as NAME (default: the name it carries)." },
    options = {},
    args = { { name = "PATH", kind = "file" }, { name = "NAME", kind = "string", optional = true } },
    examples = { { "tupper import ./alpine-oci alpine:3.20", "" }, { "docker save img -o img.tar && tupper import img.tar", "" } } },
  { name = "images", group = "images", daemon = true,
    synopsis = "[--json] [-q] [--no-trunc]",
    summary = "list the images of the store",
    description = { "Lists the images of the daemon's store: reference, digest, size, layers and creation time. Columns fit their content; a long reference is shortened with an ellipsis and the digest to 19 characters unless --no-trunc. -q prints the references only." },
    options = { "json", { name = "quiet", summary = "print only the references" }, "no-trunc" },
    args = {},
    examples = { { "tupper images", "" } } },
  { name = "rmi", group = "images", daemon = true,
    synopsis = "NAME...",
    summary = "remove images",
    description = { "Removes each image from the store; its blobs and layers go with the next prune unless another image needs them." },
    options = {},
    args = { { name = "NAME", kind = "image", repeatable = true } },
    examples = { { "tupper rmi alpine:3.20", "" } } },
  { name = "image ls", group = "images", daemon = true, alias = "images",
    synopsis = "[--json] [-q] [--no-trunc]",
    summary = "list the images of the store (as images)",
    description = { "The same as tupper images." },
    options = { "json", { name = "quiet", summary = "print only the references" }, "no-trunc" },
    args = {},
    examples = { { "tupper image ls --json", "" } } },
  { name = "image inspect", group = "images", daemon = true,
    synopsis = "NAME",
    summary = "an image's digest, layers and config (JSON)",
    description = { "Prints the image's digest, layers and config as JSON." },
    options = {},
    args = { { name = "NAME", kind = "image" } },
    examples = { { "tupper image inspect alpine:3.20", "" } } },
  { name = "image rm", group = "images", daemon = true, alias = "rmi",
    synopsis = "NAME...",
    summary = "remove images (as rmi)",
    description = { "The same as tupper rmi." },
    options = {},
    args = { { name = "NAME", kind = "image", repeatable = true } },
    examples = { { "tupper image rm alpine:3.20", "" } } },
  { name = "image import", group = "images", daemon = true, alias = "import",
    synopsis = "PATH [NAME]",
    summary = "import an image (as import)",
    description = { "The same as tupper import." },
    options = {},
    args = { { name = "PATH", kind = "file" }, { name = "NAME", kind = "string", optional = true } },
    examples = { { "tupper image import img.tar app:1", "" } } },
  { name = "image prune", group = "images", daemon = true,
    synopsis = "[--all]",
    summary = "remove blobs and layers no image needs",
    description = { "Removes every blob and layer that no image reaches; with --all also the images that no sandbox uses and no lockfile pins." },
    options = { "all" },
    args = {},
    examples = { { "tupper image prune --all", "" } } },
  { name = "volume create", group = "volumes", daemon = true,
    synopsis = "[--size SIZE] NAME",
    summary = "make a named persistent volume",
    description = { "Makes a volume: an ext4 filesystem of SIZE (default 1G, 16M to 64G) kept in the daemon's state dir until tupper volume rm. Mount it with --volume NAME:/PATH on run or create; what the box writes there outlives the box. See docs/volumes.md." },
    options = { "size", "json" },
    args = { { name = "NAME", kind = "string" } },
    examples = { { "tupper volume create --size 2G data && tupper run -v data:/mnt/data -- sh -c 'date > /mnt/data/t'", "" } } },
  { name = "volume ls", group = "volumes", daemon = true,
    synopsis = "[--json] [-q]",
    summary = "list the volumes",
    description = { "Lists the daemon's volumes: name, id, size, creation time and the sandbox that mounts it. -q prints the names only." },
    options = { "json", { name = "quiet", summary = "print only the names" } },
    args = {},
    examples = { { "tupper volume ls", "" } } },
  { name = "volume inspect", group = "volumes", daemon = true,
    synopsis = "NAME",
    summary = "a volume's id, size and mounts (JSON)",
    description = { "Prints the volume (by name or id) as JSON: name, id, size, created_at and mounted_by, the sandboxes that mount it and where." },
    options = {},
    args = { { name = "NAME", kind = "string" } },
    examples = { { "tupper volume inspect data", "" } } },
  { name = "volume rm", group = "volumes", daemon = true,
    synopsis = "NAME...",
    summary = "remove volumes and their data",
    description = { "Removes each volume (by name or id) and everything in it. Refused while a sandbox mounts it: the error names the sandbox." },
    options = {},
    args = { { name = "NAME", kind = "string", repeatable = true } },
    examples = { { "tupper volume rm data", "" } } },
  { name = "build", group = "recipes", daemon = true,
    synopsis = "RECIPE",
    summary = "build a recipe's layer and write its lockfile",
    description = { "Runs a recipe's files and setup once (a cached layer) and writes RECIPE.lock beside it, pinning the image and the layer; for a shipped recipe's name, prints the lock. See tupper-recipe(5)." },
    options = {},
    args = { { name = "RECIPE", kind = "file" } },
    examples = { { "tupper build ./tupper-python.lua", "" } } },
  { name = "daemon", group = "servers",
    synopsis = "[OPTIONS]",
    summary = "run the daemon in the foreground",
    description = { "Runs the daemon that owns the sandboxes, in the foreground, until SIGTERM or SIGINT (which destroy its sandboxes). See tupper-daemon(8) for its socket, state directory, signals and files." },
    options = { { name = "socket", summary = "listen on PATH (default: $TUPPER_SOCKET, else the per-user default)" },
      { name = "state-dir", summary = "keep the state in DIR (default: $TUPPER_STATE_DIR, else the per-user default)" },
      "log", "pool", "vm-pool",
      { name = "policy", summary = "bind every sandbox to this policy file, whatever clients send (tupper-policy(5))" },
      "max-layer", "uid-base", "default-memory", "default-cpus", "default-pids", "default-disk", "default-timeout",
      "max-sandboxes", "max-memory", "max-clients", "max-requests", "max-streams", "max-queued", "idle-timeout", "accel" },
    args = {},
    examples = {
      { "tupper daemon &", "a daemon for this user" },
      { "tupper daemon --socket /tmp/t.sock --state-dir /tmp/t-state --pool 0", "a private one" },
    } },
  { name = "repl", group = "servers",
    synopsis = "[-e CODE]... [SCRIPT [ARG...]]",
    summary = "a Lua prompt with the client API loaded",
    description = { "A Lua prompt with the client API loaded as the global `tupper` (docs/repl.md). -e CODE runs CODE and prints what it returns; SCRIPT runs a Lua file, its ARGs in `arg` and `...`. With neither, an interactive prompt (or, when stdin is not a terminal, the chunks read from stdin). Options stop at SCRIPT." },
    options = { "eval" },
    args = { { name = "SCRIPT", kind = "script", optional = true }, { name = "ARG", kind = "string", optional = true, repeatable = true } },
    examples = { { "tupper repl", "" }, { "tupper repl -e 'return tupper.ls()'", "" } } },
  { name = "mcp", group = "servers",
    synopsis = "[--socket PATH]",
    summary = "serve MCP on stdio (needs node)",
    description = { "Serves the Model Context Protocol on stdin and stdout for an agent: tools to create sandboxes, run commands in them, read, write and list their files, and kill them (docs/mcp.md). Every sandbox the session created is killed when it ends, except those created with a name (kept). Needs node and the built @tupper/sdk package." },
    options = { "socket" },
    args = {},
    examples = { { "tupper mcp", "" } } },
  { name = "http", group = "servers",
    synopsis = "[--listen ADDR:PORT] [--token TOKEN] [--socket PATH]",
    summary = "serve the HTTP API (needs node)",
    description = { "Serves the HTTP API (docs/http.md; sdk/js/openapi.json, also at /openapi.json) on ADDR:PORT, in the foreground. Needs node and the built @tupper/sdk package." },
    options = { "listen", "token", "socket", "max-body", "max-json" },
    args = {},
    examples = { { "tupper http --listen 127.0.0.1:8787 --token $(cat token)", "" } } },
  { name = "doctor", group = "host",
    synopsis = "[--json] [--kvm-check]",
    summary = "report what this host can do and what to fix",
    description = { "Checks cgroups (v1, v2 or hybrid, and which controllers are usable), user namespaces, overlayfs, seccomp, KVM, QEMU, the open-files limit, the daemon's socket and the state directory; prints one line each, with a hint to fix what fails. The exit code is 1 only when something that every sandbox needs is missing." },
    options = { "json", "kvm-check" },
    args = {},
    examples = { { "tupper doctor", "" }, { "tupper doctor --json --kvm-check", "" } } },
  { name = "schema", group = "host",
    synopsis = "",
    summary = "print the socket API's schema (JSON)",
    description = { "Prints the JSON schema of the socket API (docs/protocol.md)." },
    options = {},
    args = {},
    examples = { { "tupper schema > protocol.schema.json", "" } } },
  { name = "completion", group = "host",
    synopsis = "bash|zsh",
    summary = "print a shell completion script",
    description = { "Prints the completion script of bash or zsh: verbs, options, files, and sandbox ids from a daemon that answers." },
    options = {},
    args = { { name = "SHELL", kind = "shell" } },
    examples = {
      { "source <(tupper completion bash)", "" },
      { "tupper completion zsh > ~/.zfunc/_tupper", "" },
    } },
  { name = "help", group = "host",
    synopsis = "[VERB] [--scdoc]",
    summary = "show the help of tupper or of a verb",
    description = { "Shows the overview, or the usage, options and examples of VERB (the same as tupper VERB --help)." },
    options = { "scdoc" },
    args = { { name = "VERB", kind = "verb", optional = true, repeatable = true } },
    examples = { { "tupper help run", "" } } },
  { name = "version", group = "host",
    synopsis = "",
    summary = "print the version",
    description = { "Prints the version." },
    options = {},
    args = {},
    examples = { { "tupper version", "" } } },
}

M.GROUPS = {
  { "sandboxes", "sandboxes" }, { "images", "images" }, { "volumes", "volumes" }, { "recipes", "recipes" },
  { "servers", "daemon and servers" }, { "host", "this host" },
}

-- resolve option references: a name, or { name =, summary = } (a verb's
-- own wording of a shared option)
M.BY_NAME = {}
for _, v in ipairs(M.VERBS) do
  local opts = {}
  for _, ref in ipairs(v.options) do
    local name = type(ref) == "table" and ref.name or ref
    local base = assert(O[name], "cli_table: no option " .. name)
    if type(ref) == "table" then
      local copy = {}
      for k, x in pairs(base) do copy[k] = x end
      for k, x in pairs(ref) do if k ~= "name" then copy[k] = x end end
      base = copy
    end
    opts[#opts + 1] = base
  end
  opts[#opts + 1] = O.help
  v.options = opts
  M.BY_NAME[v.name] = v
end

--- The verb entry of name ("image prune" for a sub-verb), or nil.
function M.verb(name)
  return M.BY_NAME[name]
end

--- The sub-verbs of a group verb ("image"): their entries, in order.
function M.subverbs(group)
  local out = {}
  for _, v in ipairs(M.VERBS) do
    if v.name:match("^(%S+) ") == group then out[#out + 1] = v end
  end
  return out
end

--- The names of the verbs that take option name (its "which verbs").
function M.verbs_of(name)
  local out = {}
  for _, v in ipairs(M.VERBS) do
    for _, o in ipairs(v.options) do
      if o.key == O[name].key and name ~= "help" then out[#out + 1] = v.name; break end
    end
  end
  return out
end

--- The top-level verb names (an "image X" counts as "image"), in order.
function M.top_names()
  local out, seen = {}, {}
  for _, v in ipairs(M.VERBS) do
    local top = v.name:match("^%S+")
    if not seen[top] then seen[top] = true; out[#out + 1] = top end
  end
  return out
end

return M
