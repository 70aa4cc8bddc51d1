/**
 * The SDK's side of the code interpreter's driver: one background process
 * per Sandbox object (`python3 /usr/local/lib/tupper/interp.py`, shipped
 * by the code-interpreter recipe), started on first use through the
 * daemon's process API, fed JSON lines on its stdin, read as JSON lines
 * from its stdout (the protocol is described at the top of the driver, in
 * recipes/code-interpreter.lua).
 */
import { startParams } from './account';
import { sandboxGone } from './command-handle';
import type { Commands } from './commands';
import { InvalidArgumentError, NotFoundError, SandboxError, TimeoutError } from './errors';
import type { SandboxLink } from './link';
import { decodeData, exitStatus, outputStream } from './wire';

/** Where the recipe puts the driver. */
export const DRIVER_PATH = '/usr/local/lib/tupper/interp.py';
/** Most bytes of one line from the driver: its results cap (16 MiB) and JSON quoting. */
const EVENT_LINE_MAX = 40 << 20;
/** How long the driver has to say it is ready. */
const READY_TIMEOUT_MS = 60_000;
/** The driver's stderr kept for an error message. */
const STDERR_KEEP = 4096;
/** The exit code of the start command when the sandbox has no driver (or no python3). */
export const NO_DRIVER_EXIT = 78;
/** How the driver is started: a sandbox without it (or without python3) exits NO_DRIVER_EXIT. */
export const DRIVER_CMD =
  `[ -f ${DRIVER_PATH} ] && command -v python3 >/dev/null 2>&1 || exit ${NO_DRIVER_EXIT}; exec python3 ${DRIVER_PATH}`;

/** One event of the driver (see the protocol). */
export type DriverEvent = Record<string, unknown> & { id: number | null; type: string };

interface Request {
  onEvent: (e: DriverEvent) => void;
  resolve: (e: DriverEvent) => void;
  reject: (e: Error) => void;
}

const TERMINAL = new Set(['end', 'timeout', 'reply', 'fail']);

/** The error a driver's `fail` event stands for. */
export function failure(e: DriverEvent, what: string): SandboxError {
  const msg = `${what}: ${String(e.message)}`;
  if (e.kind === 'invalid') return new InvalidArgumentError(msg);
  if (e.kind === 'not_found') return new NotFoundError(msg);
  return new SandboxError(msg);
}

export class Driver {
  private readonly link: SandboxLink;
  private readonly commands: Commands;
  private pid: number | undefined;
  private starting: Promise<void> | undefined;
  private nextId = 1;
  private readonly requests = new Map<number, Request>();
  private chunks: Buffer[] = [];
  private chunkBytes = 0;
  private stderr = '';
  private writing: Promise<void> = Promise.resolve();
  private dropCloseHandler: () => void = () => {};
  private ready: { resolve: () => void; reject: (e: Error) => void } | undefined;

  constructor(link: SandboxLink, commands: Commands) {
    this.link = link;
    this.commands = commands;
  }

  /** Sends one request; resolves with its terminal event, calling onEvent for each event before it. */
  async request(op: string, params: Record<string, unknown>, onEvent: (e: DriverEvent) => void = () => {}): Promise<DriverEvent> {
    await this.start();
    const id = this.nextId++;
    const line = Buffer.from(JSON.stringify({ ...params, id, op }) + '\n', 'utf8');
    const done = new Promise<DriverEvent>((resolve, reject) => this.requests.set(id, { onEvent, resolve, reject }));
    this.link.conn.hold();
    try {
      // one line at a time: a line sent in 1 MiB chunks must not interleave with another
      const write = this.writing.then(() => this.commands.sendStdin(this.pid!, line));
      this.writing = write.catch(() => {});
      await write;
      return await done;
    } catch (e) {
      this.requests.delete(id);
      throw e;
    } finally {
      this.link.conn.release();
    }
  }

  /** Stops the driver (its kernels with it); the next request starts a new one. */
  async stop(): Promise<void> {
    const pid = this.pid;
    if (pid === undefined) return;
    this.gone(new SandboxError('the code interpreter was stopped'));
    await this.commands.kill(pid);
  }

  private start(): Promise<void> {
    if (this.pid !== undefined && this.starting === undefined) return Promise.resolve();
    this.starting ??= this.spawn().finally(() => {
      this.starting = undefined;
    });
    return this.starting;
  }

  private async spawn(): Promise<void> {
    const params: Record<string, unknown> = {
      sandbox: this.link.sandboxId,
      cmd: DRIVER_CMD,
      encoding: 'base64',
      stdin: true,
      ...startParams(this.link, {}, 0),
    };
    const ready = new Promise<void>((resolve, reject) => {
      this.ready = { resolve, reject };
    });
    ready.catch(() => {});
    this.link.conn.hold();
    try {
      await this.link.conn.call<{ pid: number }>('process.start', params, {
        onResult: (r) => {
          this.pid = r.pid;
          this.link.conn.subscribe(this.link.sandboxId, r.pid, (m, p) => this.onNotification(m, p));
          this.dropCloseHandler = this.link.conn.onClose((e) => this.gone(new SandboxError(`code interpreter: ${e.message}`, { cause: e })));
        },
      });
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new TimeoutError(`the code interpreter did not start in ${READY_TIMEOUT_MS} ms`)), READY_TIMEOUT_MS);
      });
      try {
        await Promise.race([ready, late]);
      } finally {
        clearTimeout(timer);
      }
    } catch (e) {
      const pid = this.pid;
      this.gone(e as Error);
      if (pid !== undefined) await this.commands.kill(pid).catch(() => false);
      const g = await sandboxGone(this.link);
      throw g ?? e;
    } finally {
      this.link.conn.release();
    }
  }

  /** Every request waiting fails with err; the next request starts a new driver. */
  private gone(err: Error): void {
    if (this.pid !== undefined) this.link.conn.unsubscribe(this.link.sandboxId, this.pid);
    this.pid = undefined;
    this.dropCloseHandler();
    this.dropCloseHandler = () => {};
    this.chunks = [];
    this.chunkBytes = 0;
    this.ready?.reject(err);
    this.ready = undefined;
    const waiting = [...this.requests.values()];
    this.requests.clear();
    for (const r of waiting) r.reject(err);
  }

  private onNotification(method: string, p: Record<string, unknown>): void {
    if (method === 'process.output') {
      const bytes = decodeData(p.data, p.encoding);
      if (outputStream(p) === 'stderr') {
        this.stderr = (this.stderr + bytes.toString('utf8')).slice(-STDERR_KEEP);
        return;
      }
      this.onStdout(bytes);
    } else if (method === 'process.exit') {
      void this.onExit(p);
    }
  }

  private async onExit(p: Record<string, unknown>): Promise<void> {
    const { exitCode, error } = exitStatus(p);
    const wasReady = this.ready === undefined;
    const g = await sandboxGone(this.link);
    if (g) return this.gone(g);
    const tail = this.stderr.trim();
    if (!wasReady && exitCode === NO_DRIVER_EXIT) {
      return this.gone(
        new SandboxError(
          `this sandbox has no code interpreter (${DRIVER_PATH}): create it from the code-interpreter recipe ` +
            "(`Sandbox.create()` of '@tupper/sdk/code-interpreter' does)",
        ),
      );
    }
    if (!wasReady && /No module named/.test(tail)) {
      return this.gone(new SandboxError(`the code interpreter cannot start: ${tail.split('\n').pop()}`));
    }
    this.gone(new SandboxError(`the code interpreter stopped (${error ?? 'exit 0'})${tail ? ': ' + tail.slice(-1024) : ''}`));
  }

  private onStdout(bytes: Buffer): void {
    let start = 0;
    for (let nl = bytes.indexOf(10); nl >= 0; nl = bytes.indexOf(10, start)) {
      this.chunks.push(bytes.subarray(start, nl));
      const line = Buffer.concat(this.chunks).toString('utf8');
      this.chunks = [];
      this.chunkBytes = 0;
      start = nl + 1;
      this.onLine(line);
      if (this.pid === undefined) return;
    }
    if (start < bytes.length) {
      this.chunks.push(bytes.subarray(start));
      this.chunkBytes += bytes.length - start;
      if (this.chunkBytes > EVENT_LINE_MAX) {
        const pid = this.pid;
        this.gone(new SandboxError(`the code interpreter sent a line of more than ${EVENT_LINE_MAX} bytes; it was stopped`));
        if (pid !== undefined) void this.commands.kill(pid).catch(() => false);
      }
    }
  }

  private onLine(line: string): void {
    let e: DriverEvent;
    try {
      e = JSON.parse(line) as DriverEvent;
    } catch {
      return; // not the driver's (it writes nothing else; its fd 1 is private)
    }
    if (e === null || typeof e !== 'object') return;
    if (e.type === 'ready' && e.id === 0) {
      this.ready?.resolve();
      this.ready = undefined;
      return;
    }
    if (typeof e.id !== 'number') return; // a malformed line: the driver said so, and nobody waits on it
    const r = this.requests.get(e.id);
    if (!r) return;
    if (TERMINAL.has(e.type)) {
      this.requests.delete(e.id);
      r.resolve(e);
    } else {
      try {
        r.onEvent(e);
      } catch {
        // a callback's throw is the caller's, not the driver's
      }
    }
  }
}
