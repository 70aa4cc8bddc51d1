/**
 * sbx.commands: processes in a sandbox, as E2B's Commands module.  A command
 * is `/bin/sh -c cmd`; its output arrives as binary frames on the data
 * connection (process streams, docs/protocol.md), or, from a daemon without
 * them, as process.output notifications; its end as process.exit, on the
 * connection that started it.
 */
import { startParams } from './account';
import { AbortError, CommandHandle, type HandleOpts, type HandleStreams, checkMaxOutputBytes, sandboxGone } from './command-handle';
import { type CommandResult, InvalidArgumentError, NotFoundError, SandboxError, checkTimeoutMs } from './errors';
import type { SandboxLink } from './link';
import { checkKeys, checkRequestOpts, type RequestOpts } from './options';
import { dataConn, type DataConn, PROCESS_STREAMS, type ProcessStreamIds } from './stream';

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
  /**
   * Aborting it kills the command (SIGKILL, its whole tree): `run` and
   * `wait()` then reject with AbortError.  Already aborted: nothing starts
   * and the call rejects with AbortError.
   */
  signal?: AbortSignal;
  /**
   * Most bytes of each stream (stdout, stderr) the result and the handle
   * keep: past that the oldest output is dropped and the newest kept, and
   * the result says `truncated: true` with the bytes dropped per stream.
   * onStdout/onStderr still get every chunk.  Default: everything is kept.
   */
  maxOutputBytes?: number;
  /** Return a CommandHandle at once instead of waiting for the end (commands.run). */
  background?: boolean;
}

/** E2B's CommandRequestOpts: what commands.list, kill, sendStdin and closeStdin take. */
export type CommandRequestOpts = RequestOpts;

/** Options of commands.connect. */
export interface CommandConnectOpts extends CommandRequestOpts {
  /** Each chunk of stdout from now on (after the recent output replayed first). */
  onStdout?: (data: string) => void | Promise<void>;
  onStderr?: (data: string) => void | Promise<void>;
  /**
   * Accepted (E2B's: how long the connection stays): the command's own
   * timeoutMs, set when it started, stands.
   */
  timeoutMs?: number;
}

const START_KEYS = [
  'cwd', 'envs', 'timeoutMs', 'onStdout', 'onStderr', 'stdin', 'requestTimeoutMs', 'user', 'signal', 'maxOutputBytes', 'background',
];

export type CommandRunOpts = CommandStartOpts;

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
  /** E2B's tag of a process started with one: tupper does not tag processes, so it is never set. */
  tag?: string;
}

/** sbx.commands */
export class Commands {
  private readonly link: SandboxLink;
  private readonly live = new Set<CommandHandle>();

  /** @internal */
  constructor(link: SandboxLink) {
    this.link = link;
  }

  /** The data connection process streams go on, or null (the JSON path). */
  private async streamConn(): Promise<DataConn | null> {
    if (this.link.conn.processStreams !== PROCESS_STREAMS) return null;
    try {
      return await dataConn(this.link.conn);
    } catch {
      return null;
    }
  }

  /** The live handle of pid with a stdin stream, if any. */
  private inputOf(pid: number): CommandHandle | undefined {
    for (const h of this.live) if (h.pid === pid && h._input) return h;
    return undefined;
  }

  /**
   * Runs `cmd` with /bin/sh -c, or, given an array, that argv itself with no
   * shell in between (`run(['ls', '-l', dir])`: each argument reaches the
   * program as it is; `argv[0]` is looked up in PATH when it has no `/`).
   * Waits for its end and resolves with stdout, stderr and exitCode; a
   * non-zero exit rejects with CommandExitError.  With `background: true`,
   * resolves at once with a CommandHandle.
   */
  run(cmd: string | readonly string[], opts: CommandStartOpts & { background: true }): Promise<CommandHandle>;
  run(cmd: string | readonly string[], opts?: CommandStartOpts & { background?: false }): Promise<CommandResult>;
  run(cmd: string | readonly string[], opts?: CommandRunOpts): Promise<CommandHandle | CommandResult>;
  async run(cmd: string | readonly string[], opts: CommandRunOpts = {}): Promise<CommandHandle | CommandResult> {
    checkKeys(opts, START_KEYS, 'commands.run');
    const handle = await this.start(cmd, opts);
    if (opts.background) return handle;
    return handle.wait();
  }

  private async start(cmd: string | readonly string[], opts: CommandStartOpts): Promise<CommandHandle> {
    const params: Record<string, unknown> = { sandbox: this.link.sandboxId, encoding: 'utf8' };
    if (Array.isArray(cmd)) {
      if (cmd.length === 0 || cmd[0] === '') throw new InvalidArgumentError('commands.run: argv must name a program');
      for (const a of cmd) {
        if (typeof a !== 'string') throw new InvalidArgumentError('commands.run: every argument of argv must be a string');
        if (a.includes('\0')) throw new InvalidArgumentError('commands.run: an argument of argv holds a NUL byte');
      }
      params.argv = [...cmd];
    } else {
      if (typeof cmd !== 'string' || cmd === '') throw new InvalidArgumentError('commands.run: cmd must be a non-empty string or an argv array');
      params.cmd = cmd;
    }
    if (opts.stdin) params.stdin = true;
    const maxOutputBytes = checkMaxOutputBytes(opts.maxOutputBytes, 'commands.run');
    const signal = opts.signal;
    if (signal !== undefined && (typeof signal !== 'object' || signal === null || typeof signal.aborted !== 'boolean')) {
      throw new InvalidArgumentError('commands.run: signal must be an AbortSignal');
    }
    if (signal?.aborted) throw new AbortError('commands.run: aborted before the command started', signal.reason);
    const handle = await this._start('process.start', params, opts, { ...opts, maxOutputBytes });
    // aborted while the start was under way: the handle kills it at once
    if (signal) handle._abortOn(signal);
    return handle;
  }

  /** @internal starts a process (process.start, pty.create) and subscribes to it */
  async _start(
    method: string,
    params: Record<string, unknown>,
    opts: { cwd?: string; envs?: Record<string, string>; user?: string; timeoutMs?: number },
    handleOpts: HandleOpts,
    defaultTimeoutMs = DEFAULT_COMMAND_TIMEOUT_MS,
  ): Promise<CommandHandle> {
    const timeoutMs = checkTimeoutMs(opts.timeoutMs ?? defaultTimeoutMs, method);
    Object.assign(params, startParams(this.link, opts, timeoutMs));
    let handle: CommandHandle | undefined;
    const dc = await this.streamConn();
    if (dc) params.streams = true;
    try {
      await this.link.conn.call<{ pid: number; streams?: ProcessStreamIds }>(method, params, {
        // subscribe before reading the next line: output may follow the reply at once
        onResult: (r) => {
          const streams: HandleStreams | undefined = dc && r.streams ? { dc, ids: r.streams } : undefined;
          handle = new CommandHandle(this.link, this, r.pid, handleOpts, streams);
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
    checkRequestOpts(opts, ['onStdout', 'onStderr', 'timeoutMs'], 'commands.connect');
    if (opts.timeoutMs !== undefined) checkTimeoutMs(opts.timeoutMs, 'commands.connect');
    return this._connect(pid, opts);
  }

  /** @internal commands.connect's work, for pty.connect's handle too (onData) */
  async _connect(pid: number, opts: HandleOpts): Promise<CommandHandle> {
    let handle: CommandHandle | undefined;
    const dc = await this.streamConn();
    const attach = (streams: boolean): Promise<unknown> =>
      this.link.conn.call<{ pid: number; output: Array<Record<string, unknown>>; streams?: ProcessStreamIds }>(
        'process.connect',
        { sandbox: this.link.sandboxId, pid, encoding: 'utf8', ...(streams ? { streams: true } : {}) },
        {
          onResult: (r) => {
            const s: HandleStreams | undefined = dc && r.streams ? { dc, ids: r.streams } : undefined;
            handle = new CommandHandle(this.link, this, r.pid, opts, s);
            this.live.add(handle);
            handle._replay(Array.isArray(r.output) ? r.output : []);
          },
        },
      );
    if (!dc) {
      await attach(false);
      return handle!;
    }
    try {
      await attach(true);
    } catch (e) {
      // started without streams (EOPNOTSUPP), or another client reads them
      // (EBUSY): this handle follows it as JSON notifications
      const code = e instanceof SandboxError ? e.errnoCode : undefined;
      if (code !== 'EOPNOTSUPP' && code !== 'E95' && code !== 'EBUSY') throw e;
      await attach(false);
    }
    return handle!;
  }

  /** The running commands started through the API. */
  async list(opts?: CommandRequestOpts): Promise<ProcessInfo[]> {
    checkRequestOpts(opts, [], 'commands.list');
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
  async kill(pid: number, opts?: CommandRequestOpts): Promise<boolean> {
    checkRequestOpts(opts, [], 'commands.kill');
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
  async sendStdin(pid: number, data: string | Uint8Array, opts?: CommandRequestOpts): Promise<void> {
    checkRequestOpts(opts, [], 'commands.sendStdin');
    const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    const h = this.inputOf(pid);
    if (h?._input) return h._input.write(bytes); // its stdin stream, within its credit
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
  async closeStdin(pid: number, opts?: CommandRequestOpts): Promise<void> {
    checkRequestOpts(opts, [], 'commands.closeStdin');
    const h = this.inputOf(pid);
    if (h?._input) return h._input.end();
    await this.link.conn.call('process.close_stdin', { sandbox: this.link.sandboxId, pid });
  }

  /**
   * E2B's: whether closeStdin works on this sandbox (E2B asks its envd's
   * version).  Always true: tupper's agent closes stdin everywhere.
   */
  get supportsStdinClose(): boolean {
    return true;
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
