/**
 * One connection to the daemon: JSON-RPC 2.0, one JSON object per line, over
 * its unix socket (docs/protocol.md).  Requests are matched to replies by id;
 * notifications (process output and exit, watch events) go to whoever
 * subscribed to their sandbox and pid (or watch).
 *
 * The socket does not keep Node alive when nothing waits on it: it is
 * ref'd only while a request is in flight or something holds it (a command
 * being waited on, or streaming to callbacks).
 */
import * as net from 'node:net';
import * as path from 'node:path';
import { SandboxError, TimeoutError, fromRpcError } from './errors';
import { clientSocket } from './sockets';

export const PROTOCOL = 1;
export const CLIENT = '@tupper/sdk/0.1.0';
/** How long a request may wait for its reply, unless told otherwise. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;

/** one socket read's buffer (Node's `onread`: reused while no line is left half read in it) */
const READ_SIZE = 64 * 1024;
/**
 * The longest line the daemon may send (its longest reply, an fs.read of
 * its most, base64, is far below): a peer that sends more without a
 * newline is cut off, not kept in memory without end.
 */
export const LINE_MAX = 256 * 1024 * 1024;
/**
 * Node's `onread` (a read lands in a buffer we choose, no stream between):
 * Node only; Bun and Deno get the bytes as 'data' events.
 */
const ONREAD = typeof process !== 'undefined' && !!process.versions?.node && !('bun' in process.versions) && !('Deno' in globalThis);

export interface ConnectionOpts {
  /** The daemon's socket; default: $TUPPER_SOCKET, else the daemon's own default, then the system's (sockets.ts). */
  socket?: string;
  /** How long one request may wait for its reply (0: forever). Default 60 s. */
  requestTimeoutMs?: number;
}

/**
 * Where the daemon listens, as the daemon decides it (lua/tupper/paths.lua):
 * the option, $TUPPER_SOCKET, /run/tupper/tupper.sock for root, else
 * $XDG_RUNTIME_DIR/tupper.sock, else /tmp/tupper-UID/tupper.sock.
 */
export function defaultSocket(): string {
  const env = process.env.TUPPER_SOCKET;
  if (env) return env;
  const uid = typeof process.getuid === 'function' ? process.getuid() : -1;
  if (uid === 0) return '/run/tupper/tupper.sock';
  const run = process.env.XDG_RUNTIME_DIR;
  if (run) return path.join(run, 'tupper.sock');
  return `/tmp/tupper-${uid}/tupper.sock`;
}

type Notification = (method: string, params: Record<string, unknown>) => void;

interface Pending {
  method: string;
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  onResult?: (v: unknown) => void;
  /** when it times out (performance.now() ms, a clock that never goes back; 0: never) and after how long */
  deadline: number;
  timeout: number;
}

export class Connection {
  readonly socketPath: string;
  /** hello's `process_streams` (0: the daemon has none; process bytes then come as JSON). */
  processStreams = 0;
  readonly requestTimeoutMs: number;
  private readonly sock: net.Socket;
  /** a line's first bytes, read before its newline came */
  private partial: Buffer[] = [];
  private partialLen = 0;
  /** the buffer socket reads go into (onread), until a read leaves part of a line in it */
  private rbuf: Buffer | undefined;
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly subs = new Map<string, Notification>();
  private readonly closeHandlers = new Set<(err: Error) => void>();
  private holds = 0;
  /** the socket is ref'd (changed only when the want changes: a ref() per request costs) */
  private reffed = true;
  /**
   * One timer for every request's deadline, armed at `armedAt` (or before):
   * a request only re-arms it when its deadline comes sooner, a reply does
   * not touch it; when it fires it fails what is due and arms again at the
   * next deadline.
   */
  private watchdog: NodeJS.Timeout | undefined;
  private armedAt = 0;
  private closedWith: Error | undefined;

  private constructor(sock: net.Socket, socketPath: string, requestTimeoutMs: number) {
    this.sock = sock;
    this.socketPath = socketPath;
    this.requestTimeoutMs = requestTimeoutMs;
    if (!ONREAD) sock.on('data', (chunk: Buffer) => this.onRead(chunk.length, chunk));
    sock.on('error', (e) => this.shutdown(new SandboxError(`connection to the tupper daemon failed: ${e.message}`, { cause: e })));
    sock.on('close', () => this.shutdown(new SandboxError('the connection to the tupper daemon closed')));
    this.updateRef();
  }

  /** Connects to the daemon and says hello (protocol 1). */
  static async open(opts: ConnectionOpts = {}): Promise<Connection> {
    const picked = opts.socket === undefined ? clientSocket() : { path: opts.socket, alsoTried: '' };
    const socketPath = picked.path;
    const timeout = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    if (!Number.isFinite(timeout) || timeout < 0) throw new SandboxError(`bad requestTimeoutMs: ${timeout}`);
    let conn: Connection | undefined;
    const onread = ONREAD
      ? {
          buffer: (): Buffer => (conn ? conn.nextBuffer() : Buffer.allocUnsafe(READ_SIZE)),
          // the daemon speaks only after hello: nothing is read before conn exists
          callback: (n: number, buf: Buffer): boolean => {
            conn?.onRead(n, buf);
            return true;
          },
        }
      : undefined;
    const sock = await new Promise<net.Socket>((resolve, reject) => {
      const s = net.createConnection(onread ? { path: socketPath, onread } : { path: socketPath });
      const fail = (e: NodeJS.ErrnoException) => {
        s.destroy();
        reject(
          new SandboxError(
            `cannot reach the tupper daemon at ${socketPath} (${e.code ?? e.message})${picked.alsoTried}: ` +
              'is `tupper daemon` running? Pass { socket } or set TUPPER_SOCKET to use another one',
            { cause: e },
          ),
        );
      };
      s.once('error', fail);
      s.once('connect', () => {
        s.off('error', fail);
        resolve(s);
      });
    });
    conn = new Connection(sock, socketPath, timeout);
    try {
      const hello = await conn.call<{ protocol: number; server: string; process_streams?: number }>('hello', { protocol: PROTOCOL, client: CLIENT });
      if (hello.protocol !== PROTOCOL) throw new SandboxError(`the daemon speaks protocol ${hello.protocol}, not ${PROTOCOL}`);
      conn.processStreams = hello.process_streams ?? 0;
    } catch (e) {
      conn.close();
      throw e;
    }
    return conn;
  }

  get closed(): boolean {
    return this.closedWith !== undefined;
  }

  /**
   * Sends a request and resolves with its result.  `onResult` runs
   * synchronously when the reply is read, before any later line: a caller
   * that must see every notification that follows the reply (process.start)
   * subscribes there.
   */
  call<T = Record<string, unknown>>(
    method: string,
    params: Record<string, unknown>,
    opts: { onResult?: (v: T) => void; timeoutMs?: number } = {},
  ): Promise<T> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    const id = this.nextId++;
    const line = JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n';
    return new Promise<T>((resolve, reject) => {
      const timeout = opts.timeoutMs ?? this.requestTimeoutMs;
      const deadline = timeout > 0 ? performance.now() + timeout : 0;
      const p: Pending = {
        method,
        resolve: resolve as (v: unknown) => void,
        reject,
        onResult: opts.onResult as ((v: unknown) => void) | undefined,
        deadline,
        timeout,
      };
      this.pending.set(id, p);
      if (deadline > 0 && (this.watchdog === undefined || deadline < this.armedAt)) this.arm(deadline);
      this.updateRef();
      this.sock.write(line);
    });
  }

  /** Receives the notifications of one process of one sandbox. */
  subscribe(sandbox: string, pid: number, fn: Notification): void {
    this.subs.set(`${sandbox}/${pid}`, fn);
  }

  unsubscribe(sandbox: string, pid: number): void {
    this.subs.delete(`${sandbox}/${pid}`);
  }

  /** Receives the fs.event notifications of one watch of one sandbox. */
  subscribeWatch(sandbox: string, watch: number, fn: Notification): void {
    this.subs.set(`${sandbox}/w${watch}`, fn);
  }

  unsubscribeWatch(sandbox: string, watch: number): void {
    this.subs.delete(`${sandbox}/w${watch}`);
  }

  /** Called once when the connection goes away (not after close()). */
  onClose(fn: (err: Error) => void): () => void {
    this.closeHandlers.add(fn);
    return () => this.closeHandlers.delete(fn);
  }

  /** Keeps Node alive until release(): something waits on this connection. */
  hold(): void {
    this.holds++;
    this.updateRef();
  }

  release(): void {
    if (this.holds > 0) this.holds--;
    this.updateRef();
  }

  /** Closes the connection; what still waits on it fails. */
  close(): void {
    this.closeHandlers.clear();
    this.shutdown(new SandboxError('the connection was closed'));
    this.sock.destroy();
  }

  private updateRef(): void {
    if (this.closedWith) return;
    const want = this.pending.size > 0 || this.holds > 0;
    if (want === this.reffed) return;
    this.reffed = want;
    if (want) this.sock.ref();
    else this.sock.unref();
  }

  /** Arms the watchdog at deadline (a performance.now() time). */
  private arm(deadline: number): void {
    if (this.watchdog !== undefined) clearTimeout(this.watchdog);
    this.armedAt = deadline;
    this.watchdog = setTimeout(() => this.expire(), Math.max(1, Math.ceil(deadline - performance.now())));
    this.watchdog.unref();
  }

  /** The watchdog fired: the requests whose deadline passed fail, and it is armed at the next one. */
  private expire(): void {
    this.watchdog = undefined;
    if (this.closedWith) return;
    const now = performance.now();
    let next = 0;
    for (const [id, p] of this.pending) {
      if (p.deadline === 0) continue;
      if (p.deadline <= now) {
        this.pending.delete(id);
        p.reject(
          new TimeoutError(
            `[canceled] ${p.method}: no answer from the daemon in ${p.timeout} ms: This error is likely due to exceeding 'requestTimeoutMs'.`,
          ),
        );
      } else if (next === 0 || p.deadline < next) {
        next = p.deadline;
      }
    }
    if (next > 0) this.arm(next);
    this.updateRef();
  }

  private shutdown(err: Error): void {
    if (this.closedWith) return;
    this.closedWith = err;
    if (this.watchdog !== undefined) clearTimeout(this.watchdog);
    this.watchdog = undefined;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    const handlers = [...this.closeHandlers];
    this.closeHandlers.clear();
    for (const h of handlers) h(err);
    this.sock.destroy();
  }

  /** The buffer the next socket read goes into (Node's `onread`). */
  private nextBuffer(): Buffer {
    this.rbuf ??= Buffer.allocUnsafe(READ_SIZE);
    return this.rbuf;
  }

  /**
   * n bytes read into buf: each whole line is parsed from where it lies;
   * the bytes of a line whose newline is still to come are kept (the buffer
   * itself when they fill most of it, else a copy).  Never throws: it runs
   * in Node's read callback, where a throw would be an uncaught exception.
   */
  private onRead(n: number, buf: Buffer): void {
    if (n <= 0 || this.closedWith) return;
    try {
      const b = n === buf.length ? buf : buf.subarray(0, n); // a reused buffer: nothing past n is this read's
      let start = 0;
      let nl = b.indexOf(0x0a, 0);
      while (nl >= 0) {
        let line: string;
        if (this.partialLen > 0) {
          this.partial.push(b.subarray(start, nl));
          line = Buffer.concat(this.partial, this.partialLen + nl - start).toString('utf8');
          this.partial = [];
          this.partialLen = 0;
        } else {
          line = b.toString('utf8', start, nl);
        }
        if (line.length > 0) this.onLine(line);
        if (this.closedWith) return;
        start = nl + 1;
        nl = b.indexOf(0x0a, start);
      }
      if (start < n) this.keep(buf, start, n);
    } catch (e) {
      this.shutdown(new SandboxError(`reading the daemon's replies failed: ${(e as Error).message}`, { cause: e }));
    }
  }

  /** Keeps bytes start..n of buf: the first part of a line. */
  private keep(buf: Buffer, start: number, n: number): void {
    const k = n - start;
    if (this.partialLen + k > LINE_MAX) {
      this.shutdown(new SandboxError(`the daemon sent a line of more than ${LINE_MAX} bytes`));
      return;
    }
    if (buf !== this.rbuf || k >= READ_SIZE / 2) {
      // a chunk of its own ('data'), or most of the read buffer: kept as it is
      this.partial.push(buf.subarray(start, n));
      if (buf === this.rbuf) this.rbuf = undefined; // the next read gets a new buffer
    } else {
      this.partial.push(Buffer.from(buf.subarray(start, n)));
    }
    this.partialLen += k;
  }

  private onLine(line: string): void {
    let msg: Record<string, unknown>;
    try {
      msg = JSON.parse(line) as Record<string, unknown>;
    } catch {
      this.shutdown(new SandboxError('the daemon sent a line that is not JSON'));
      return;
    }
    if (typeof msg !== 'object' || msg === null || Array.isArray(msg)) {
      this.shutdown(new SandboxError('the daemon sent a line that is not a JSON object'));
      return;
    }
    if (typeof msg.method === 'string' && msg.id === undefined) {
      const params = (msg.params ?? {}) as Record<string, unknown>;
      const key =
        msg.method === 'fs.event' ? `${String(params.sandbox)}/w${String(params.watch)}` : `${String(params.sandbox)}/${String(params.pid)}`;
      const fn = this.subs.get(key);
      if (fn) fn(msg.method, params);
      return;
    }
    const id = typeof msg.id === 'number' ? msg.id : NaN;
    const p = this.pending.get(id);
    if (!p) return; // a late reply to a request that timed out
    this.pending.delete(id);
    this.updateRef();
    if (msg.error !== undefined && msg.error !== null) {
      p.reject(fromRpcError(msg.error as Record<string, unknown>, p.method));
      return;
    }
    if (p.onResult) {
      try {
        p.onResult(msg.result);
      } catch (e) {
        p.reject(e as Error);
        return;
      }
    }
    p.resolve(msg.result);
  }
}

/** Runs fn on a connection of its own, closed after. */
export async function withConnection<T>(opts: ConnectionOpts | undefined, fn: (c: Connection) => Promise<T>): Promise<T> {
  const conn = await Connection.open(opts);
  try {
    return await fn(conn);
  } finally {
    conn.close();
  }
}

/** Only the connection options of opts (a server's options carry more). */
export function connectionOpts(opts: ConnectionOpts): ConnectionOpts {
  const conn: ConnectionOpts = {};
  if (opts.socket !== undefined) conn.socket = opts.socket;
  if (opts.requestTimeoutMs !== undefined) conn.requestTimeoutMs = opts.requestTimeoutMs;
  return conn;
}
