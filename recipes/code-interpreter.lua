-- A code interpreter sandbox, as E2B's code-interpreter template: Debian
-- bookworm built from this host's apt mirror with python3, Jupyter's own
-- kernel machinery (python3-ipykernel, python3-jupyter-client) and numpy,
-- pandas and matplotlib; commands run as `user` (uid 1000) in /home/user.
-- The SDKs' runCode / run_code start the driver below as one background
-- process per sandbox and speak JSON lines with it (docs/code-interpreter.md).
-- The first use builds the image (minutes; cached after).
local DRIVER = [==[
"""
tupper's code interpreter driver: runs inside a sandbox of the
code-interpreter recipe, started by the SDKs as one background process
(`python3 /usr/local/lib/tupper/interp.py`), and speaks JSON lines with
them over its stdin and stdout.  Each context is a Jupyter kernel
(ipykernel's python3) driven through jupyter_client; a cell's iopub
messages become events on stdout as they come.

Requests, one JSON object a line (id: an integer the SDK chooses):
  {"id", "op": "execute", "code", "context"?, "language"?, "timeout"?, "envs"?}
  {"id", "op": "create_context", "language"?, "cwd"?}
  {"id", "op": "list_contexts"}
  {"id", "op": "restart_context", "context"}
  {"id", "op": "remove_context", "context"}
Events, one JSON object a line, each with the request's id:
  {"type": "stdout"|"stderr", "text"}       a cell's output stream
  {"type": "result", "data", "main"}       execute_result (main) or display_data
  {"type": "error", "name", "value", "traceback"}
  {"type": "end", "execution_count"}       the cell finished
  {"type": "timeout", "restarted"}         the cell ran past its timeout and was interrupted
  {"type": "reply", "value"}               a context op's answer
  {"type": "fail", "kind", "message"}      a request refused (kind: invalid, not_found, limit, internal)

Everything is bounded: a request line (cells up to CELL_MAX bytes), a
cell's streamed text and its results (past them: one truncation marker),
the number of contexts.  The protocol's own stdin and stdout are private
descriptors: fds 0 and 1 point at /dev/null, so neither a kernel nor a
cell's subprocess can read the SDK's requests or write into its events.
"""
import json
import os
import queue
import re
import sys
import threading
import time
import uuid

REQUEST_MAX = 2 << 20          # one request line (a cell and its JSON quoting)
CELL_MAX = 1 << 20             # a cell's code, in bytes of UTF-8
STREAM_MAX = 1 << 20           # stdout + stderr text of one cell
RESULTS_MAX = 16 << 20         # the data of one cell's results
RESULT_COUNT_MAX = 256         # results of one cell
CONTEXTS_MAX = 8               # kernels at once (each is a process of ~60 MB)
REQUESTS_MAX = 64             # requests in flight (each waits on its own thread)
ENVS_MAX = 256                 # variables of one execute
ENV_BYTES_MAX = 64 << 10       # all names and values of one execute
INTERRUPT_GRACE = 5.0          # seconds an interrupted cell has to stop before a restart
START_TIMEOUT = 60.0           # seconds a kernel has to answer after its start
LANGUAGES = ("python",)

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # IPython colours its tracebacks
TRUNCATED = "\n[tupper: output truncated: this cell wrote more than %d bytes]\n"


class Refused(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


class Out:
    """The protocol's stdout: one JSON line at a time, from any thread."""

    def __init__(self, f):
        self.f = f
        self.lock = threading.Lock()

    def send(self, rid, **event):
        event["id"] = rid
        line = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass") + b"\n"
        with self.lock:
            try:
                self.f.write(line)
                self.f.flush()
            except (BrokenPipeError, ValueError):
                os._exit(0)  # the SDK is gone: nothing more to say


def private_stdio():
    """The protocol's own fds; 0 and 1 become /dev/null for everything else."""
    fin = os.fdopen(os.dup(0), "rb", buffering=0)
    fout = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    sys.stdin = open(os.devnull)
    sys.stdout = open(os.devnull, "w")
    return fin, fout


class Budget:
    """What one cell may still send: stream bytes, result bytes, result count."""

    def __init__(self):
        self.stream = STREAM_MAX
        self.results = RESULTS_MAX
        self.count = RESULT_COUNT_MAX
        self.stream_cut = False
        self.results_cut = False


class Context:
    def __init__(self, cid, language, cwd):
        from jupyter_client.manager import KernelManager  # the ipykernel's start-up cost, once a context is made

        self.id = cid
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()  # one cell at a time in a context
        self.km = KernelManager(kernel_name="python3")
        kw = {"stdin": open(os.devnull), "stdout": open(os.devnull, "w"), "stderr": open(os.devnull, "w")}
        if cwd:
            kw["cwd"] = cwd
        self.km.start_kernel(**kw)
        self.kc = None
        self._connect()

    def _connect(self):
        if self.kc is not None:
            self.kc.stop_channels()
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=START_TIMEOUT)
        except RuntimeError as e:
            raise Refused("internal", "the kernel did not start: %s" % e)

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd or ""}

    def restart(self):
        self.km.restart_kernel(now=True)
        self._connect()

    def shutdown(self):
        try:
            if self.kc is not None:
                self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        except Exception:  # a kernel already gone is removed all the same
            pass

    def _silent(self, code):
        """Runs code that says nothing (the envs of an execute), bounded by START_TIMEOUT."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                    and msg["content"].get("execution_state") == "idle":
                return

    def execute(self, out, rid, code, timeout, envs):
        budget = Budget()
        if envs:
            self._silent("import os as _tupper_os\n_tupper_saved = {k: _tupper_os.environ.get(k) for k in %r}\n"
                         "_tupper_os.environ.update(%r)\n" % (list(envs), envs))
        try:
            self._run(out, rid, code, timeout, budget)
        finally:
            if envs:
                self._silent("for _k, _v in _tupper_saved.items():\n"
                             "    _tupper_os.environ.pop(_k, None) if _v is None else _tupper_os.environ.__setitem__(_k, _v)\n"
                             "del _tupper_saved, _k, _v\n")

    def _run(self, out, rid, code, timeout, budget):
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        deadline = None if not timeout else time.monotonic() + timeout
        count = None
        interrupted = False
        while True:
            wait = 1.0
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            try:
                msg = self.kc.get_iopub_msg(timeout=wait) if wait > 0 else None
            except queue.Empty:
                msg = None
            if msg is None:
                if deadline is not None and time.monotonic() >= deadline and not interrupted:
                    interrupted = True
                    self.km.interrupt_kernel()
                    deadline = time.monotonic() + INTERRUPT_GRACE
                    continue
                if interrupted and deadline is not None and time.monotonic() >= deadline:
                    # the interrupt did not stop it (a C loop that ignores SIGINT): a fresh kernel
                    self.restart()
                    out.send(rid, type="timeout", restarted=True)
                    return
                if not self.km.is_alive():
                    self.restart()
                    out.send(rid, type="error", name="DeadKernelError",
                             value="the kernel died while running this cell; the context was restarted "
                                   "and its variables are gone", traceback="")
                    out.send(rid, type="end", execution_count=count)
                    return
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue  # what an earlier, interrupted cell still says
            kind = msg["msg_type"]
            c = msg["content"]
            if kind == "status":
                if c.get("execution_state") == "idle":
                    break
            elif kind == "execute_input":
                count = c.get("execution_count")
            elif interrupted:
                continue  # the KeyboardInterrupt of our own interrupt is not the cell's
            elif kind == "stream":
                self._stream(out, rid, budget, "stderr" if c.get("name") == "stderr" else "stdout", c.get("text", ""))
            elif kind in ("execute_result", "display_data"):
                self._result(out, rid, budget, c.get("data") or {}, kind == "execute_result")
            elif kind == "error":
                tb = ANSI.sub("", "\n".join(c.get("traceback") or []))
                out.send(rid, type="error", name=str(c.get("ename", ""))[:1024], value=str(c.get("evalue", ""))[:65536],
                         traceback=tb[:STREAM_MAX])
        if interrupted:
            out.send(rid, type="timeout", restarted=False)
            return
        out.send(rid, type="end", execution_count=count)

    def _stream(self, out, rid, budget, name, text):
        if budget.stream_cut:
            return
        b = text.encode("utf-8", "surrogatepass")
        if len(b) > budget.stream:
            text = b[:budget.stream].decode("utf-8", "ignore") + TRUNCATED % STREAM_MAX
            budget.stream_cut = True
            budget.stream = 0
        else:
            budget.stream -= len(b)
        out.send(rid, type=name, text=text)

    def _result(self, out, rid, budget, data, main):
        if budget.results_cut:
            return
        size = sum(len(json.dumps(v)) for v in data.values())
        if budget.count == 0 or size > budget.results:
            budget.results_cut = True
            out.send(rid, type="stderr", text="\n[tupper: results truncated: this cell displayed more than %d results "
                                              "or %d bytes of them]\n" % (RESULT_COUNT_MAX, RESULTS_MAX))
            return
        budget.count -= 1
        budget.results -= size
        out.send(rid, type="result", data=data, main=main)


class Turns:
    """The cells of one context in the order their requests were read.

    The reader takes a ticket as it reads a request, before the request's
    thread starts; a thread may go for the context's lock only once every
    earlier ticket went (got the lock, gave up at its timeout or failed)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.taken = 0
        self.serving = 0
        self.gone = set()  # tickets that went before their turn came

    def take(self):
        with self.cond:
            self.taken += 1
            return Turn(self, self.taken - 1)


class Turn:
    def __init__(self, turns, n):
        self.turns = turns
        self.n = n
        self.over = False

    def wait(self, timeout):
        t = self.turns
        with t.cond:
            return t.cond.wait_for(lambda: t.serving == self.n, timeout)

    def done(self):
        """Once, whatever happened: the next ticket may go."""
        t = self.turns
        with t.cond:
            if self.over:
                return
            self.over = True
            t.gone.add(self.n)
            while t.serving in t.gone:
                t.gone.discard(t.serving)
                t.serving += 1
            t.cond.notify_all()


class Driver:
    def __init__(self, out):
        self.out = out
        self.contexts = {}
        self.turns = {}  # context id -> Turns, for "default" and the contexts that are there
        self.lock = threading.Lock()  # the contexts table and the turns

    def turn(self, req):
        """The reader's ticket for an execute request, or None (the thread refuses the request)."""
        if req.get("op") != "execute":
            return None
        cid = req.get("context")
        cid = "default" if cid is None else cid
        with self.lock:
            if not isinstance(cid, str) or (cid != "default" and cid not in self.contexts):
                return None
            return self.turns.setdefault(cid, Turns()).take()

    def context(self, cid, create_default=True):
        with self.lock:
            if cid is None:
                cid = "default"
            ctx = self.contexts.get(cid)
            if ctx is not None:
                return ctx
            if cid != "default" or not create_default:
                raise Refused("not_found", "no code context %r (removed, or never made)" % cid)
            return self._make("default", "python", os.getcwd())

    def _make(self, cid, language, cwd):
        if len(self.contexts) >= CONTEXTS_MAX:
            raise Refused("limit", "at most %d code contexts at once: remove one first" % CONTEXTS_MAX)
        ctx = Context(cid, language, cwd)
        self.contexts[cid] = ctx
        return ctx

    def handle(self, req, turn=None):
        rid = req.get("id")
        try:
            if not isinstance(rid, int) or isinstance(rid, bool):
                raise Refused("invalid", "a request needs an integer id")
            op = req.get("op")
            if op == "execute":
                self.execute(rid, req, turn)
            elif op == "create_context":
                language = check_language(req.get("language"))
                cwd = req.get("cwd")
                if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd or len(cwd) > 4096):
                    raise Refused("invalid", "cwd must be an absolute path")
                if cwd is not None and not os.path.isdir(cwd):
                    raise Refused("not_found", "cwd %r is not a directory in the sandbox" % cwd)
                with self.lock:
                    ctx = self._make(uuid.uuid4().hex, language, cwd)
                self.out.send(rid, type="reply", value=ctx.info())
            elif op == "list_contexts":
                with self.lock:
                    value = [c.info() for c in self.contexts.values()]
                self.out.send(rid, type="reply", value=value)
            elif op == "restart_context":
                ctx = self.context(check_id(req.get("context")), create_default=False)
                with ctx.lock:
                    ctx.restart()
                self.out.send(rid, type="reply", value=ctx.info())
            elif op == "remove_context":
                cid = check_id(req.get("context"))
                with self.lock:
                    ctx = self.contexts.pop(cid, None)
                    self.turns.pop(cid, None)
                if ctx is None:
                    raise Refused("not_found", "no code context %r (removed, or never made)" % cid)
                ctx.shutdown()
                self.out.send(rid, type="reply", value=True)
            else:
                raise Refused("invalid", "unknown op %r" % (op,))
        except Refused as e:
            self.out.send(rid, type="fail", kind=e.kind, message=str(e))
        except Exception as e:  # a bug here must not end every context
            self.out.send(rid, type="fail", kind="internal", message="%s: %s" % (type(e).__name__, e))
        finally:
            if turn is not None:
                turn.done()

    def execute(self, rid, req, turn):
        code = req.get("code")
        if not isinstance(code, str):
            raise Refused("invalid", "code must be a string")
        if len(code.encode("utf-8", "surrogatepass")) > CELL_MAX:
            raise Refused("invalid", "a cell is at most %d bytes" % CELL_MAX)
        if req.get("language") is not None:
            check_language(req.get("language"))
        timeout = req.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise Refused("invalid", "timeout must be a number of seconds")
        envs = check_envs(req.get("envs"))
        cid = req.get("context")
        if cid is not None:
            cid = check_id(cid)
        ctx = self.context(cid)
        # the timeout counts from here: the wait behind an earlier cell of
        # the context too (the kernel's own start does not)
        start = time.monotonic()
        got = False
        try:
            if turn is None or turn.wait(timeout if timeout else None):
                left = -1 if not timeout else max(0.001, timeout - (time.monotonic() - start))
                got = ctx.lock.acquire(timeout=left)
        finally:
            if turn is not None:
                turn.done()
        if not got:
            self.out.send(rid, type="timeout", restarted=False, waited=True)
            return
        try:
            left = None if not timeout else max(0.001, timeout - (time.monotonic() - start))
            ctx.execute(self.out, rid, code, left, envs)
        finally:
            ctx.lock.release()


def check_language(language):
    if language is None:
        return "python"
    if language not in LANGUAGES:
        raise Refused("invalid", "language %r is not supported: this interpreter runs %s"
                      % (language, ", ".join(LANGUAGES)))
    return language


def check_id(cid):
    if not isinstance(cid, str) or not (0 < len(cid) <= 64):
        raise Refused("invalid", "a context id is a string of 1 to 64 characters")
    return cid


def check_envs(envs):
    if envs is None:
        return None
    if not isinstance(envs, dict) or len(envs) > ENVS_MAX:
        raise Refused("invalid", "envs must be an object of at most %d strings" % ENVS_MAX)
    size = 0
    for k, v in envs.items():
        if not isinstance(v, str) or not k or "=" in k or "\0" in k or "\0" in v:
            raise Refused("invalid", "envs: %r must name a variable (no '=' or NUL) and have a string value" % (k,))
        size += len(k) + len(v)
    if size > ENV_BYTES_MAX:
        raise Refused("invalid", "envs: at most %d bytes of names and values" % ENV_BYTES_MAX)
    return envs


def read_requests(fin):
    """Lines of fin, each at most REQUEST_MAX bytes; a longer one is skipped whole and reported as None."""
    buf = b""
    skipping = False
    while True:
        chunk = fin.read(65536)
        if not chunk:
            return
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > REQUEST_MAX:
                    if not skipping:
                        skipping = True
                        yield None
                    buf = b""
                break
            line, buf = buf[:nl], buf[nl + 1:]
            if skipping:
                skipping = False
                continue
            if len(line) > REQUEST_MAX:
                yield None
                continue
            yield line


def run_one(driver, inflight, req, turn):
    try:
        driver.handle(req, turn)
    finally:
        inflight.release()


def main():
    fin, fout = private_stdio()
    # the kernels inherit it: ipykernel's debugger otherwise warns on every start
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    out = Out(fout)
    driver = Driver(out)
    inflight = threading.BoundedSemaphore(REQUESTS_MAX)
    out.send(0, type="ready", languages=list(LANGUAGES), limits={
        "cell": CELL_MAX, "stream": STREAM_MAX, "results": RESULTS_MAX, "contexts": CONTEXTS_MAX})
    for line in read_requests(fin):
        if line is None:
            out.send(None, type="fail", kind="invalid", message="a request line is at most %d bytes" % REQUEST_MAX)
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            out.send(None, type="fail", kind="invalid", message="not JSON: %s" % e)
            continue
        if not isinstance(req, dict):
            out.send(None, type="fail", kind="invalid", message="a request is a JSON object")
            continue
        if not inflight.acquire(blocking=False):
            rid = req.get("id")
            out.send(rid if isinstance(rid, int) else None, type="fail", kind="limit",
                     message="at most %d requests at once" % REQUESTS_MAX)
            continue
        # each request on its own thread: a cell waits only for its own context
        # in the order read: a context's cells take turns as they came
        threading.Thread(target=run_one, args=(driver, inflight, req, driver.turn(req)), daemon=True).start()
    # stdin closed: the SDK let go; stop every kernel
    with driver.lock:
        ctxs = list(driver.contexts.values())
        driver.contexts.clear()
    for c in ctxs:
        c.shutdown()


if __name__ == "__main__":
    main()
]==]

return recipe "code-interpreter" {
  image = {
    debian = "bookworm",
    packages = {
      "python3", "python3-ipykernel", "python3-jupyter-client",
      "python3-matplotlib", "python3-numpy", "python3-pandas",
      -- fonttools (matplotlib's) depends on "python3-scipy | python3-munkres":
      -- munkres named here keeps apt from taking scipy, which would bring
      -- pythran, Boost's headers and a C++ compiler (about 500 MB)
      "python3-munkres",
    },
  },
  env = { LANG = "C.UTF-8", PYTHONUNBUFFERED = "1" },
  workdir = "/home/user",
  user = "user",
  files = { ["/usr/local/lib/tupper/interp.py"] = DRIVER },
}
