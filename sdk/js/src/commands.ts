/**
 * sbx.commands: processes in a sandbox, as E2B's Commands module.  A command
 * is `/bin/sh -c cmd`; its output arrives as process.output notifications
 * and its end as process.exit, on the connection that started it.
 */
import { StringDecoder } from 'node:string_decoder';
import type { Connection } from './connection';
import {
  CommandExitError,
  type CommandResult,
  InvalidArgumentError,
  NotFoundError,
  SandboxError,
  TimeoutError,
} from './errors';

/** Default timeout of a command, as E2B: 60 s. 0 = none. */
export const DEFAULT_COMMAND_TIMEOUT_MS = 60_000;
/** Most raw bytes in one process.stdin call. */
const STDIN_CHUNK = 1 << 20;

export interface CommandStartOpts {
  /**
   * Working directory; a relative one is taken from the account's home.
   * Default: the sandbox's working directory when it was given one (create's
   * `cwd`, a recipe's `workdir`, the image's WorkingDir), else the account's
   * home (`/home/user` on an image with a `user` account).
   */
  cwd?: string;
  /** Environment added to the sandbox's. */
  envs?: Record<string, string>;
  /** Kill the command (SIGKILL, its whole tree) after this long; 0 = never. Default 60000. */
  timeoutMs?: number;
  /** Each chunk of stdout, decoded as UTF-8. */
  onStdout?: (data: string) => void | Promise<void>;
  /** Each chunk of stderr, decoded as UTF-8. */
  onStderr?: (data: string) => void | Promise<void>;
  /** Keep stdin open for sendStdin (otherwise the command reads /dev/null). */
  stdin?: boolean;
  /** Accepted for E2B compatibility; requests are bounded by the sandbox's requestTimeoutMs. */
  requestTimeoutMs?: number;
  /**
   * The account of the box's /etc/passwd the command runs as: its uid, gid,
   * groups, HOME and (unless cwd is given) its home as working directory.
   * Default, as E2B: the sandbox's default account (`sbx.defaultUser`):
   * `user` on an image with a `user` account, else the image's or recipe's
   * User, else root (in `/`).  `user: 'root'` runs as root.  An unknown
   * name rejects with NotFoundError.
   */
  user?: string;
}

/** @internal what a handle is made with */
interface HandleOpts {
  onStdout?: (data: string) => void | Promise<void>;
  onStderr?: (data: string) => void | Promise<void>;
  /** A terminal's raw bytes (pty.create): output goes here, not to stdout. */
  onData?: (data: Uint8Array) => void | Promise<void>;
}

/** Options of commands.connect. */
export interface CommandConnectOpts {
  /** Each chunk of stdout from now on (after the recent output replayed first). */
  onStdout?: (data: string) => void | Promise<void>;
  onStderr?: (data: string) => void | Promise<void>;
}

export interface CommandRunOpts extends CommandStartOpts {
  /** Return a CommandHandle at once instead of waiting for the end. */
  background?: boolean;
}

/** A running command, as `commands.list()` reports it. */
export interface ProcessInfo {
  pid: number;
  /** The program (argv[0]). */
  cmd: string;
  /** Its arguments (argv[1..]). */
  args: string[];
  cwd?: string;
  startedAt?: Date;
  /** The account it runs as. */
  user?: string;
  /** True for a terminal's program (pty.create). */
  pty?: boolean;
  /** E2B's field; environment is not reported. */
  envs: Record<string, string>;
}

/** What the sandbox object lends its commands module. */
export interface SandboxLink {
  readonly sandboxId: string;
  readonly conn: Connection;
  /** True once this SDK killed the sandbox. */
  readonly killed: boolean;
  /** The account commands and files act as unless told (E2B's default), if the sandbox names one. */
  readonly defaultUser?: string;
  /** Where that account's relative paths and commands start: its home (`/` for the root fallback). */
  readonly home: string;
  /** The sandbox's own working directory, when it was given one. */
  readonly workdir?: string;
}

/** path, absolute: a relative one is taken from base. */
export function fromHome(path: string, base: string): string {
  // an empty path stays empty: the daemon refuses it, as before
  if (path === '' || path.startsWith('/')) return path;
  return (base.endsWith('/') ? base : base + '/') + path;
}

/**
 * The user and cwd params of a process start: an explicit user as it is
 * (the daemon starts it in that account's home unless cwd says otherwise);
 * without one, the default account, in cwd taken from its home, else in
 * the sandbox's own working directory, else in its home.
 */
export function startAs(
  link: { readonly defaultUser?: string; readonly home: string; readonly workdir?: string },
  user: string | undefined,
  cwd: string | undefined,
): { user?: string; cwd?: string } {
  const as = actingAs(link, user);
  const out: { user?: string; cwd?: string } = {};
  if (as.user !== undefined) out.user = as.user;
  if (cwd !== undefined) out.cwd = as.base !== undefined ? fromHome(cwd, as.base) : cwd;
  // (no default account named: the daemon's own default, the sandbox's cwd)
  else if (user === undefined && link.defaultUser !== undefined) out.cwd = link.workdir ?? as.base;
  return out;
}

/**
 * The account and path a call acts with: an explicit `user` goes to the
 * daemon as it is (which takes relative paths from that account's home);
 * without one, the sandbox's default account, relative paths taken from
 * its home here.  Returns the params to add.
 */
export function actingAs(
  link: { readonly defaultUser?: string; readonly home: string },
  user: string | undefined,
): { user?: string; base?: string } {
  if (user !== undefined) return { user };
  if (link.defaultUser === undefined) return { base: '/' };
  return { user: link.defaultUser, base: link.home };
}

function gone(sandboxId: string, why: string): TimeoutError {
  return new TimeoutError(
    `sandbox ${sandboxId} is gone (${why}): it was killed or its lifetime ran out. ` +
      "Give it a longer life with 'timeoutMs' at create or with sbx.setTimeout()",
  );
}

/** A TimeoutError when the sandbox is gone, else undefined (it still runs). */
async function sandboxGone(link: SandboxLink): Promise<TimeoutError | undefined> {
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
  private out = '';
  private err = '';
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

  /** @internal made by Commands */
  constructor(link: SandboxLink, commands: Commands, pid: number, opts: HandleOpts) {
    this.link = link;
    this.commands = commands;
    this.pid = pid;
    this.onStdout = opts.onStdout;
    this.onStderr = opts.onStderr;
    this.onData = opts.onData;
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
  }

  /** Everything the command wrote to stdout so far. */
  get stdout(): string {
    return this.out;
  }
  /** Everything the command wrote to stderr so far. */
  get stderr(): string {
    return this.err;
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
    if (this.finished) return false;
    this.killedByUs = true;
    return this.commands.kill(this.pid);
  }

  /** Writes to its stdin (started with `stdin: true`). */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    return this.commands.sendStdin(this.pid, data);
  }

  /** Closes its stdin once what was written is delivered. */
  async closeStdin(): Promise<void> {
    return this.commands.closeStdin(this.pid);
  }

  /**
   * Stops receiving its output and its end; the command keeps running (kill
   * it with commands.kill(pid)).  A wait() still pending rejects.
   */
  async disconnect(): Promise<void> {
    if (this.finished) return;
    this.fail(new SandboxError(`command ${this.pid}: disconnected; it keeps running in the sandbox`));
  }

  private hold(): void {
    if (this.holding || this.finished) return;
    this.holding = true;
    this.link.conn.hold();
  }

  private cleanup(): void {
    this.finished = true;
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

  private push(stream: 'stdout' | 'stderr', text: string): void {
    if (text === '') return;
    if (stream === 'stdout') {
      this.out += text;
      if (this.onStdout) void Promise.resolve(this.onStdout(text)).catch(() => {});
    } else {
      this.err += text;
      if (this.onStderr) void Promise.resolve(this.onStderr(text)).catch(() => {});
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
      const stream = p.stream === 'stderr' ? 'stderr' : 'stdout';
      const data = typeof p.data === 'string' ? p.data : '';
      // a chunk that is not valid UTF-8 comes as base64 even when utf8 was
      // asked for; the decoder joins characters split across chunks
      const bytes = p.encoding === 'utf8' ? Buffer.from(data, 'utf8') : Buffer.from(data, 'base64');
      if (this.onData) {
        const u8 = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
        void Promise.resolve(this.onData(u8)).catch(() => {});
        return;
      }
      this.push(stream, this.decoders[stream].write(bytes));
    } else if (method === 'process.exit') {
      this.flush();
      void this.onExit(p);
    }
  }

  private async onExit(p: Record<string, unknown>): Promise<void> {
    const exitCode = typeof p.exit_code === 'number' ? p.exit_code : -1;
    const signal = typeof p.signal === 'number' ? p.signal : 0;
    const result: CommandResult = { exitCode, stdout: this.out, stderr: this.err };
    if (signal) result.error = signal === 9 ? 'signal: killed' : `signal: ${signal}`;
    else if (exitCode !== 0) result.error = `exit status ${exitCode}`;
    this.result = result;
    this.finished = true;
    let failure: Error | undefined;
    if (p.timed_out === true) {
      failure = new TimeoutError(`command ${this.pid} was killed: it ran past its timeoutMs`);
    } else if (signal === 9 && !this.killedByUs) {
      // processes of a killed sandbox report signal 9: is the sandbox still there?
      failure = (await this.sandboxGone()) ?? new CommandExitError(result);
    } else if (exitCode !== 0 || signal) {
      failure = new CommandExitError(result);
    }
    this.cleanup();
    if (failure) this.settle.reject(failure);
    else this.settle.resolve(result);
  }

  private async sandboxGone(): Promise<TimeoutError | undefined> {
    return sandboxGone(this.link);
  }
}

/** sbx.commands */
export class Commands {
  private readonly link: SandboxLink;
  private readonly live = new Set<CommandHandle>();

  /** @internal */
  constructor(link: SandboxLink) {
    this.link = link;
  }

  /**
   * Runs `cmd` with /bin/sh -c.  Waits for its end and resolves with stdout,
   * stderr and exitCode; a non-zero exit rejects with CommandExitError.  With
   * `background: true`, resolves at once with a CommandHandle.
   */
  run(cmd: string, opts: CommandStartOpts & { background: true }): Promise<CommandHandle>;
  run(cmd: string, opts?: CommandStartOpts & { background?: false }): Promise<CommandResult>;
  run(cmd: string, opts?: CommandRunOpts): Promise<CommandHandle | CommandResult>;
  async run(cmd: string, opts: CommandRunOpts = {}): Promise<CommandHandle | CommandResult> {
    const handle = await this.start(cmd, opts);
    if (opts.background) return handle;
    return handle.wait();
  }

  private async start(cmd: string, opts: CommandStartOpts): Promise<CommandHandle> {
    if (typeof cmd !== 'string' || cmd === '') throw new InvalidArgumentError('commands.run: cmd must be a non-empty string');
    const params: Record<string, unknown> = { sandbox: this.link.sandboxId, cmd, encoding: 'utf8' };
    if (opts.stdin) params.stdin = true;
    return this._start('process.start', params, opts, opts);
  }

  /** @internal starts a process (process.start, pty.create) and subscribes to it */
  async _start(
    method: string,
    params: Record<string, unknown>,
    opts: { cwd?: string; envs?: Record<string, string>; user?: string; timeoutMs?: number },
    handleOpts: HandleOpts,
    defaultTimeoutMs = DEFAULT_COMMAND_TIMEOUT_MS,
  ): Promise<CommandHandle> {
    const timeoutMs = opts.timeoutMs ?? defaultTimeoutMs;
    if (typeof timeoutMs !== 'number' || !Number.isFinite(timeoutMs) || timeoutMs < 0) {
      throw new InvalidArgumentError(`${method}: bad timeoutMs ${String(timeoutMs)}`);
    }
    Object.assign(params, startAs(this.link, opts.user, opts.cwd));
    if (opts.envs !== undefined) params.env = opts.envs;
    if (timeoutMs > 0) params.timeout = timeoutMs / 1000;
    let handle: CommandHandle | undefined;
    try {
      await this.link.conn.call<{ pid: number }>(method, params, {
        // subscribe before reading the next line: output may follow the reply at once
        onResult: (r) => {
          handle = new CommandHandle(this.link, this, r.pid, handleOpts);
          this.live.add(handle);
        },
      });
    } catch (e) {
      // a start cut short because the sandbox was killed meanwhile is the
      // sandbox going away, as for a command already running
      if (e instanceof SandboxError && !(e instanceof NotFoundError) && !(e instanceof InvalidArgumentError)) {
        const g = await sandboxGone(this.link);
        if (g) throw g;
      }
      throw e;
    }
    return handle!;
  }

  /**
   * Attaches to a running command (started by this client or any other, e.g.
   * before a reconnect): the handle first receives the recent output the
   * daemon kept (its last 64 KiB), then the rest as it comes, and its end.
   * NotFoundError when no such command runs.
   */
  async connect(pid: number, opts: CommandConnectOpts = {}): Promise<CommandHandle> {
    let handle: CommandHandle | undefined;
    await this.link.conn.call<{ pid: number; output: Array<Record<string, unknown>> }>(
      'process.connect',
      { sandbox: this.link.sandboxId, pid, encoding: 'utf8' },
      {
        onResult: (r) => {
          handle = new CommandHandle(this.link, this, r.pid, opts);
          this.live.add(handle);
          handle._replay(Array.isArray(r.output) ? r.output : []);
        },
      },
    );
    return handle!;
  }

  /** The running commands started through the API. */
  async list(): Promise<ProcessInfo[]> {
    const r = await this.link.conn.call<{ processes: Array<Record<string, unknown>> }>('process.list', {
      sandbox: this.link.sandboxId,
    });
    return r.processes.map((p) => {
      const argv = Array.isArray(p.argv) ? (p.argv as string[]) : [];
      const info: ProcessInfo = { pid: p.pid as number, cmd: argv[0] ?? '', args: argv.slice(1), envs: {} };
      if (typeof p.cwd === 'string') info.cwd = p.cwd;
      if (typeof p.user === 'string') info.user = p.user;
      if (p.pty === true) info.pty = true;
      if (typeof p.started_at === 'string') info.startedAt = new Date(p.started_at);
      return info;
    });
  }

  /** Kills a command and its whole tree (SIGKILL); false when there is no such process. */
  async kill(pid: number): Promise<boolean> {
    try {
      await this.link.conn.call('process.signal', { sandbox: this.link.sandboxId, pid, signal: 'KILL' });
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /**
   * Writes to a command's stdin.  Large data goes in 1 MiB chunks; when the
   * sandbox's stdin queue is full (EAGAIN) it waits and retries.
   */
  async sendStdin(pid: number, data: string | Uint8Array): Promise<void> {
    const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    let off = 0;
    do {
      const chunk = bytes.subarray(off, off + STDIN_CHUNK);
      for (let delay = 5; ; delay = Math.min(delay * 2, 200)) {
        try {
          await this.link.conn.call('process.stdin', {
            sandbox: this.link.sandboxId,
            pid,
            data: chunk.toString('base64'),
            encoding: 'base64',
          });
          break;
        } catch (e) {
          if (e instanceof SandboxError && e.errnoCode === 'EAGAIN') {
            await new Promise((r) => setTimeout(r, delay));
            continue;
          }
          throw e;
        }
      }
      off += chunk.length;
    } while (off < bytes.length);
  }

  /** Closes a command's stdin once what was written is delivered. */
  async closeStdin(pid: number): Promise<void> {
    await this.link.conn.call('process.close_stdin', { sandbox: this.link.sandboxId, pid });
  }

  /** @internal */
  _forget(h: CommandHandle): void {
    this.live.delete(h);
  }

  /** @internal the sandbox was killed: every command waited on fails. */
  _sandboxGone(why: string): void {
    for (const h of [...this.live]) h._sandboxGone(why);
  }
}
