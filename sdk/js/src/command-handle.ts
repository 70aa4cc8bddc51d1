/**
 * CommandHandle: one process of a sandbox as this client follows it (a
 * command of sbx.commands, a terminal of sbx.pty): its output, its end, and
 * the means to feed and kill it.
 */
import { StringDecoder } from 'node:string_decoder';
import type { CommandRequestOpts, Commands } from './commands';
import { CommandExitError, type CommandResult, InvalidArgumentError, NotFoundError, SandboxError, TimeoutError } from './errors';
import type { SandboxLink } from './link';
import type { DataConn, ProcessInput, ProcessStreamIds } from './stream';
import { decodeData, exitStatus, outputStream } from './wire';

/** @internal a process's streams on the data connection (docs/protocol.md, "Process streams") */
export interface HandleStreams {
  dc: DataConn;
  ids: ProcessStreamIds;
}

/** @internal what a handle is made with */
export interface HandleOpts {
  onStdout?: (data: string) => void | Promise<void>;
  onStderr?: (data: string) => void | Promise<void>;
  /** A terminal's raw bytes (pty.create): output goes here, not to stdout. */
  onData?: (data: Uint8Array) => void | Promise<void>;
  /** Most bytes kept per stream (the newest); undefined: all. */
  maxOutputBytes?: number;
}

/**
 * A command was aborted through the AbortSignal it was started with: it was
 * killed (or never started).  `result` holds what it wrote until then.
 */
export class AbortError extends SandboxError {
  /** The output until the abort, and the kill's exit status, when it had started. */
  readonly result?: CommandResult;

  constructor(message: string, reason?: unknown, result?: CommandResult) {
    super(message, reason === undefined ? {} : { cause: reason });
    this.name = 'AbortError';
    if (result) this.result = result;
  }
}

/** A maxOutputBytes the caller gave: an integer 0 or more (or Infinity), else InvalidArgumentError. */
export function checkMaxOutputBytes(n: unknown, what: string): number | undefined {
  if (n === undefined || n === Infinity) return undefined;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0) throw new InvalidArgumentError(`${what}: bad maxOutputBytes ${String(n)}`);
  return n;
}

/**
 * The output of one stream as a handle keeps it: all of it, or its newest
 * `max` bytes (cut at a character boundary), with the count dropped.
 */
class Retained {
  private parts: string[] = [];
  private bytes = 0;
  private cache: string | undefined = '';
  dropped = 0;

  constructor(private readonly max: number | undefined) {}

  add(text: string): void {
    this.parts.push(text);
    this.cache = undefined;
    if (this.max === undefined) return;
    this.bytes += Buffer.byteLength(text, 'utf8');
    while (this.bytes > this.max) {
      const first = Buffer.from(this.parts[0], 'utf8');
      const excess = this.bytes - this.max;
      if (first.length <= excess) {
        this.parts.shift();
        this.bytes -= first.length;
        this.dropped += first.length;
        continue;
      }
      // drop the first `excess` bytes, and the rest of a character they split
      let cut = excess;
      while (cut < first.length && (first[cut] & 0xc0) === 0x80) cut++;
      this.parts[0] = first.subarray(cut).toString('utf8');
      this.bytes -= cut;
      this.dropped += cut;
    }
  }

  toString(): string {
    if (this.cache === undefined) {
      this.cache = this.parts.join('');
      this.parts = this.cache === '' ? [] : [this.cache];
    }
    return this.cache;
  }
}

/** What E2B says after a command's or a watch's "[deadline_exceeded]" (code matches on it). */
export const DEADLINE_HINT =
  "This error is likely due to exceeding 'timeoutMs' — the total time a long running request " +
  "(like command execution or directory watch) can be active. It can be modified by passing 'timeoutMs' " +
  "when making the request. Use '0' to disable the timeout.";

function gone(sandboxId: string, why: string): TimeoutError {
  // E2B's words after its own "[unavailable]" prefix: code matches on them
  return new TimeoutError(
    `[unavailable] sandbox ${sandboxId} is gone (${why}): it was killed or its lifetime ran out: ` +
      "This error is likely due to sandbox timeout. You can modify the sandbox timeout by passing 'timeoutMs' " +
      "when starting the sandbox or calling '.setTimeout' on the sandbox with the desired timeout.",
  );
}

/** A TimeoutError when the sandbox is gone, else undefined (it still runs). */
export async function sandboxGone(link: SandboxLink): Promise<TimeoutError | undefined> {
  if (link.killed) return gone(link.sandboxId, 'killed');
  try {
    const info = await link.conn.call<{ state?: string }>('sandbox.get', { id: link.sandboxId });
    if (info.state === 'running' || info.state === 'paused') return undefined;
    return gone(link.sandboxId, `state ${String(info.state)}`);
  } catch (e) {
    if (e instanceof NotFoundError) return gone(link.sandboxId, 'not found');
    return gone(link.sandboxId, (e as Error).message);
  }
}

/**
 * A command started with `background: true` (and behind every run): its pid,
 * its output so far, and the means to wait for it, feed it and kill it.
 */
export class CommandHandle implements Partial<CommandResult> {
  readonly pid: number;
  private readonly link: SandboxLink;
  private readonly commands: Commands;
  private readonly out: Retained;
  private readonly err: Retained;
  private readonly capped: boolean;
  private abortedBy: { reason: unknown } | undefined;
  private dropAbort: () => void = () => {};
  private readonly decoders = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
  private readonly onStdout?: (d: string) => void | Promise<void>;
  private readonly onStderr?: (d: string) => void | Promise<void>;
  private readonly onData?: (d: Uint8Array) => void | Promise<void>;
  private result: CommandResult | undefined;
  private readonly done: Promise<CommandResult>;
  private settle!: { resolve: (r: CommandResult) => void; reject: (e: Error) => void };
  private finished = false;
  private killedByUs = false;
  private holding = false;
  private waiters = 0;
  private dropCloseHandler: () => void = () => {};
  private readonly streams?: HandleStreams;
  /** all its output streams ended (their END); undefined: its output comes as JSON */
  private streamsDone?: Promise<void>;
  /** @internal its stdin (or terminal) stream, when it has one */
  readonly _input?: ProcessInput;

  /** @internal made by Commands */
  constructor(link: SandboxLink, commands: Commands, pid: number, opts: HandleOpts, streams?: HandleStreams) {
    this.link = link;
    this.commands = commands;
    this.pid = pid;
    this.onStdout = opts.onStdout;
    this.onStderr = opts.onStderr;
    this.onData = opts.onData;
    this.out = new Retained(opts.maxOutputBytes);
    this.err = new Retained(opts.maxOutputBytes);
    this.capped = opts.maxOutputBytes !== undefined;
    this.done = new Promise<CommandResult>((resolve, reject) => {
      this.settle = { resolve, reject };
    });
    // nobody has to call wait(): an unobserved failure is not an unhandled rejection
    this.done.catch(() => {});
    link.conn.subscribe(link.sandboxId, pid, (method, params) => this.onNotification(method, params));
    this.dropCloseHandler = link.conn.onClose((e) =>
      this.fail(link.killed ? gone(link.sandboxId, 'killed') : new SandboxError(`command ${pid}: ${e.message}`, { cause: e })),
    );
    // streaming to callbacks keeps Node alive until the end, as waiting does
    if (this.onStdout || this.onStderr || this.onData) this.hold();
    if (streams) {
      this.streams = streams;
      const { dc, ids } = streams;
      const inSid = ids.pty ?? ids.stdin;
      if (inSid !== undefined) this._input = dc.input(inSid);
      const drains: Array<Promise<number>> = [];
      if (ids.pty !== undefined) drains.push(dc.drain(ids.pty, (b) => this.onBytes('stdout', b), 'pty'));
      if (ids.stdout !== undefined) drains.push(dc.drain(ids.stdout, (b) => this.onBytes('stdout', b), 'commands.run'));
      if (ids.stderr !== undefined) drains.push(dc.drain(ids.stderr, (b) => this.onBytes('stderr', b), 'commands.run'));
      this.streamsDone = Promise.all(drains).then(
        () => undefined,
        async (e: Error) => {
          // the sandbox went away under it (TimeoutError, as for JSON output), or
          // the data connection did (or a stream failed): the command runs on unread
          const g = await sandboxGone(this.link);
          this.fail(g ?? new SandboxError(`command ${pid}: its output stream failed: ${e.message}; it keeps running in the sandbox`, { cause: e }));
        },
      );
    }
  }

  /** A chunk of a stream: to the callback (waited for: credit follows it) and the kept output. */
  private async onBytes(stream: 'stdout' | 'stderr', b: Buffer): Promise<void> {
    if (this.finished) return;
    try {
      if (this.onData) {
        await this.onData(new Uint8Array(b.buffer, b.byteOffset, b.byteLength));
        return;
      }
      await this.push(stream, this.decoders[stream].write(b));
    } catch {
      // a callback that throws loses its chunk, as with JSON output
    }
  }

  /** Everything the command wrote to stdout so far. */
  get stdout(): string {
    return this.out.toString();
  }
  /** Everything the command wrote to stderr so far. */
  get stderr(): string {
    return this.err.toString();
  }
  /** True when maxOutputBytes made it drop older output of a stream. */
  get truncated(): boolean {
    return this.out.dropped + this.err.dropped > 0;
  }
  /** Its exit code, once it ended. */
  get exitCode(): number | undefined {
    return this.result?.exitCode;
  }
  /** Why it failed, once it ended and if it did. */
  get error(): string | undefined {
    return this.result?.error;
  }

  /**
   * Waits for the end.  Resolves with the result on exit code 0; rejects with
   * CommandExitError on any other code or a signal, with TimeoutError when
   * its timeoutMs killed it or when its sandbox went away.
   */
  async wait(): Promise<CommandResult> {
    if (arguments[0] !== undefined) throw new InvalidArgumentError('CommandHandle.wait: takes no options');
    this.waiters++;
    this.hold();
    try {
      return await this.done;
    } finally {
      this.waiters--;
    }
  }

  /** Kills the command and its whole tree (SIGKILL); false when it was no longer running. */
  async kill(): Promise<boolean> {
    if (arguments[0] !== undefined) throw new InvalidArgumentError('CommandHandle.kill: takes no options');
    if (this.finished) return false;
    this.killedByUs = true;
    return this.commands.kill(this.pid);
  }

  /** Writes to its stdin (started with `stdin: true`). */
  async sendStdin(data: string | Uint8Array, opts?: CommandRequestOpts): Promise<void> {
    return this.commands.sendStdin(this.pid, data, opts);
  }

  /** Closes its stdin once what was written is delivered. */
  async closeStdin(opts?: CommandRequestOpts): Promise<void> {
    return this.commands.closeStdin(this.pid, opts);
  }

  /**
   * Stops receiving its output and its end; the command keeps running (kill
   * it with commands.kill(pid)).  A wait() still pending rejects.
   */
  async disconnect(): Promise<void> {
    if (arguments[0] !== undefined) throw new InvalidArgumentError('CommandHandle.disconnect: takes no options');
    if (this.finished) return;
    this.fail(new SandboxError(`command ${this.pid}: disconnected; it keeps running in the sandbox`));
  }

  private hold(): void {
    if (this.holding || this.finished) return;
    this.holding = true;
    this.link.conn.hold();
  }

  /** @internal kills the command when signal aborts (at once if it did already) */
  _abortOn(signal: AbortSignal): void {
    if (this.finished) return;
    const onAbort = (): void => {
      if (this.finished || this.abortedBy) return;
      this.abortedBy = { reason: signal.reason };
      this.killedByUs = true;
      this.commands.kill(this.pid).catch(() => {
        // the connection is gone: the close handler fails the handle
      });
    };
    if (signal.aborted) return onAbort();
    signal.addEventListener('abort', onAbort, { once: true });
    this.dropAbort = () => signal.removeEventListener('abort', onAbort);
  }

  private cleanup(): void {
    this.finished = true;
    if (this.streams) {
      // a handle that stops early (disconnect, abort) stops reading: the daemon ends the streams
      const { dc, ids } = this.streams;
      for (const sid of [ids.stdout, ids.stderr, ids.pty]) if (sid !== undefined) dc.cancel(sid, 'the client stopped reading');
      for (const sid of [ids.stdin, ids.pty]) if (sid !== undefined) dc.forget(sid);
    }
    this.dropAbort();
    this.link.conn.unsubscribe(this.link.sandboxId, this.pid);
    this.dropCloseHandler();
    this.commands._forget(this);
    if (this.holding) {
      this.holding = false;
      this.link.conn.release();
    }
  }

  /** @internal the sandbox went away under this command */
  _sandboxGone(why: string): void {
    this.fail(gone(this.link.sandboxId, why));
  }

  private fail(e: Error): void {
    if (this.finished) return;
    this.flush();
    this.cleanup();
    this.settle.reject(e);
  }

  private push(stream: 'stdout' | 'stderr', text: string): Promise<void> | undefined {
    if (text === '') return undefined;
    const cb = stream === 'stdout' ? this.onStdout : this.onStderr;
    (stream === 'stdout' ? this.out : this.err).add(text);
    if (!cb) return undefined;
    try {
      return Promise.resolve(cb(text)).catch(() => {});
    } catch {
      return undefined; // a callback that throws loses its chunk
    }
  }

  private flush(): void {
    this.push('stdout', this.decoders.stdout.end());
    this.push('stderr', this.decoders.stderr.end());
  }

  /** @internal output the daemon kept from before this handle (commands.connect) */
  _replay(chunks: Array<Record<string, unknown>>): void {
    for (const c of chunks) this.onNotification('process.output', c);
  }

  private onNotification(method: string, p: Record<string, unknown>): void {
    if (this.finished) return;
    if (method === 'process.output') {
      const stream = outputStream(p);
      // a chunk that is not valid UTF-8 comes as base64 even when utf8 was
      // asked for; the decoder joins characters split across chunks
      const bytes = decodeData(p.data, p.encoding);
      if (this.onData) {
        const u8 = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
        try {
          void Promise.resolve(this.onData(u8)).catch(() => {});
        } catch {
          // a callback that throws loses its chunk
        }
        return;
      }
      this.push(stream, this.decoders[stream].write(bytes));
    } else if (method === 'process.exit') {
      if (this.streamsDone) {
        // the exit may come before the last bytes: it is reported once they are in
        void this.streamsDone.then(() => {
          if (this.finished) return;
          this.flush();
          void this.onExit(p);
        });
        return;
      }
      this.flush();
      void this.onExit(p);
    }
  }

  private async onExit(p: Record<string, unknown>): Promise<void> {
    const { exitCode, signal, error } = exitStatus(p);
    const result: CommandResult = { exitCode, stdout: this.stdout, stderr: this.stderr };
    if (error !== undefined) result.error = error;
    if (this.capped) {
      result.truncated = this.truncated;
      result.stdoutDroppedBytes = this.out.dropped;
      result.stderrDroppedBytes = this.err.dropped;
    }
    this.result = result;
    this.finished = true;
    let failure: Error | undefined;
    if (this.abortedBy) {
      failure = new AbortError(`command ${this.pid} was aborted`, this.abortedBy.reason, result);
    } else if (p.timed_out === true) {
      failure = new TimeoutError(`[deadline_exceeded] command ${this.pid} was killed: it ran past its timeoutMs: ${DEADLINE_HINT}`);
    } else if (signal === 9 && !this.killedByUs) {
      // processes of a killed sandbox report signal 9: is the sandbox still there?
      failure = (await sandboxGone(this.link)) ?? new CommandExitError(result);
    } else if (exitCode !== 0 || signal) {
      failure = new CommandExitError(result);
    }
    this.cleanup();
    if (failure) this.settle.reject(failure);
    else this.settle.resolve(result);
  }
}

