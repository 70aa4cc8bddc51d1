/**
 * sbx.pty: programs on a terminal, as E2B's Pty module.  The daemon starts
 * the program (a login shell by default) on a new pseudo-terminal of the
 * box, as its controlling terminal; what the terminal shows arrives as raw
 * bytes in `onData`, keystrokes go with `sendInput`, and `resize` changes
 * its size (the program gets SIGWINCH).
 */
import type { CommandHandle } from './command-handle';
import type { Commands } from './commands';
import type { SandboxLink } from './link';
import { checkTimeoutMs, InvalidArgumentError } from './errors';
import { checkKeys, checkRequestOpts, type RequestOpts } from './options';

/** Default lifetime of a terminal's program, as E2B: 60 s (0 = none). */
export const DEFAULT_PTY_TIMEOUT_MS = 60_000;
/** Most columns or rows (the agent's TP_PTY_DIM_MAX). */
export const PTY_DIM_MAX = 4096;

export interface PtySize {
  cols: number;
  rows: number;
}

export interface PtyCreateOpts extends PtySize {
  /** What the terminal shows, as raw bytes (a UTF-8 character may be split across calls). */
  onData: (data: Uint8Array) => void | Promise<void>;
  /** Environment added to the sandbox's. */
  envs?: Record<string, string>;
  /** Working directory (default: as for commands.run: the account's home, or the sandbox's working directory). */
  cwd?: string;
  /** The account it runs as (default: the sandbox's default account, as commands.run). */
  user?: string;
  /** Kill it (its whole tree) after this long; 0 = never. Default 60000, as E2B. */
  timeoutMs?: number;
  /** The program and its arguments (default: `/bin/sh -i -l`). */
  cmd?: string[];
  /** Accepted for E2B compatibility; requests are bounded by the sandbox's requestTimeoutMs. */
  requestTimeoutMs?: number;
  /** E2B's request signal: one already aborted starts nothing (AbortError). */
  signal?: AbortSignal;
}

/** What pty.connect takes (E2B's PtyConnectOpts). */
export interface PtyConnectOpts extends RequestOpts {
  /** What the terminal shows from now on, after the recent output the daemon kept (its last 64 KiB). */
  onData?: (data: Uint8Array) => void | Promise<void>;
  /** Accepted (E2B): the program's own timeout, set at create, stands. */
  timeoutMs?: number;
  /** Accepted for E2B compatibility; requests are bounded by the sandbox's requestTimeoutMs. */
  requestTimeoutMs?: number;
}

function checkSize(what: string, size: PtySize | undefined): void {
  for (const k of ['cols', 'rows'] as const) {
    const v = size?.[k];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > PTY_DIM_MAX) {
      throw new InvalidArgumentError(`${what}: ${k} must be an integer in 1..${PTY_DIM_MAX}, not ${String(v)}`);
    }
  }
}

/** sbx.pty */
export class Pty {
  private readonly link: SandboxLink;
  private readonly commands: Commands;

  /** @internal */
  constructor(link: SandboxLink, commands: Commands) {
    this.link = link;
    this.commands = commands;
  }

  /**
   * Starts a program on a new terminal of cols x rows.  Resolves with a
   * CommandHandle (pid, wait(), kill(), disconnect()); its output goes to
   * onData, not to stdout.
   */
  async create(opts: PtyCreateOpts): Promise<CommandHandle> {
    if (opts === undefined || opts === null) throw new InvalidArgumentError('pty.create: options { cols, rows, onData } are required');
    checkRequestOpts(opts, ['cols', 'rows', 'onData', 'envs', 'cwd', 'user', 'timeoutMs', 'cmd'], 'pty.create');
    checkSize('pty.create', opts);
    if (typeof opts.onData !== 'function') throw new InvalidArgumentError('pty.create: onData must be a function');
    const params: Record<string, unknown> = { sandbox: this.link.sandboxId, cols: opts.cols, rows: opts.rows };
    if (opts.cmd !== undefined) params.argv = opts.cmd;
    return this.commands._start('pty.create', params, opts, { onData: opts.onData }, DEFAULT_PTY_TIMEOUT_MS);
  }

  /**
   * Attaches to a terminal's running program (started by this client or
   * another, e.g. before a reconnect), as E2B's: `onData` gets what it
   * shows.  NotFoundError when no such program runs.
   */
  async connect(pid: number, opts: PtyConnectOpts = {}): Promise<CommandHandle> {
    checkRequestOpts(opts, ['onData', 'timeoutMs'], 'pty.connect');
    if (opts.onData !== undefined && typeof opts.onData !== 'function') throw new InvalidArgumentError('pty.connect: onData must be a function');
    if (opts.timeoutMs !== undefined) checkTimeoutMs(opts.timeoutMs, 'pty.connect');
    // a handle that hands the terminal's bytes to onData, not to stdout
    return this.commands._connect(pid, { onData: opts.onData ?? (() => {}) });
  }

  /** Types into the terminal (keystrokes: "\x03" is Ctrl-C, "\r" is Enter). */
  async sendInput(pid: number, data: string | Uint8Array, opts?: RequestOpts): Promise<void> {
    checkRequestOpts(opts, [], 'pty.sendInput');
    return this.commands.sendStdin(pid, data, opts);
  }

  /** Resizes the terminal; its programs get SIGWINCH. */
  async resize(pid: number, size: PtySize, opts?: RequestOpts): Promise<void> {
    checkKeys(size, ['cols', 'rows'], 'pty.resize');
    checkRequestOpts(opts, [], 'pty.resize');
    checkSize('pty.resize', size);
    await this.link.conn.call('pty.resize', { sandbox: this.link.sandboxId, pid, cols: size.cols, rows: size.rows });
  }

  /** Kills the terminal's program and its whole tree; false when it no longer ran. */
  async kill(pid: number, opts?: RequestOpts): Promise<boolean> {
    checkRequestOpts(opts, [], 'pty.kill');
    return this.commands.kill(pid, opts);
  }
}
