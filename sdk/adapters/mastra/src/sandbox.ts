/**
 * TupperSandbox: a tupper sandbox as a Mastra WorkspaceSandbox, by way of
 * Mastra's MastraSandbox base (its lifecycle wrappers, status and start
 * hooks).  Commands run through @tupper/sdk: argv without a shell when
 * Mastra passes args, its env overlay and working directory, timeouts,
 * streaming callbacks, AbortSignal and the retained-output cap; processes
 * are tupper's (spawn, list, get, kill, stdin); ports are forwarded to the
 * host's loopback.
 */
import {
  MastraSandbox,
  ProcessHandle,
  SandboxAbortError,
  SandboxExecutionError,
  SandboxProcessManager,
  SandboxTimeoutError,
} from '@mastra/core/workspace';
import type {
  CommandResult,
  ExecuteCommandOptions,
  ProcessInfo as MastraProcessInfo,
  ProviderStatus,
  SandboxFileInput,
  SandboxCloneOptions,
  SandboxInfo,
  SandboxNetworking,
  SandboxStartResult,
  SpawnProcessOptions,
  WriteFilesOptions,
} from '@mastra/core/workspace';
import {
  AbortError,
  type CommandHandle,
  CommandExitError,
  InvalidArgumentError,
  NotFoundError,
  Sandbox,
  SandboxError,
  TimeoutError,
  type SandboxConnectionOpts,
  type SandboxOpts,
} from '@tupper/sdk';

/** Default limit of a command when Mastra gives none: 5 minutes (0 = never). */
export const DEFAULT_COMMAND_TIMEOUT_MS = 300_000;

export interface TupperSandboxOptions extends SandboxOpts {
  /** Mastra's logical id of this sandbox (default: a new one). */
  id?: string;
  /** Connect to this running tupper sandbox instead of making one. */
  sandboxId?: string;
  /** Default working directory of commands (Mastra's workingDirectory); default: the account's home. */
  workingDirectory?: string;
  /** Mastra's runtime environment overlay, added to every command's (see setEnv). */
  env?: Record<string, string | undefined>;
  /** The box's account commands run as (default: the sandbox's, `user` on the default image). */
  user?: string;
  /** Limit of a command Mastra starts without a timeout (default 300000; 0 = never). */
  defaultTimeoutMs?: number;
  /** Kill the tupper sandbox on destroy() (default: true when this one made it). */
  killOnDestroy?: boolean;
  /** Mastra's lifecycle hooks, passed to MastraSandbox. */
  onStart?: ConstructorParameters<typeof MastraSandbox>[0]['onStart'];
  onStop?: ConstructorParameters<typeof MastraSandbox>[0]['onStop'];
  onDestroy?: ConstructorParameters<typeof MastraSandbox>[0]['onDestroy'];
}

const SHELL_SAFE = /^[A-Za-z0-9_@%+=:,./-]+$/;

function shellQuote(s: string): string {
  return SHELL_SAFE.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

/** Mastra's env (values may be undefined) as tupper's. */
function cleanEnv(...envs: Array<Record<string, string | undefined> | NodeJS.ProcessEnv | undefined>): Record<string, string> | undefined {
  const out: Record<string, string> = {};
  let any = false;
  for (const e of envs) {
    if (!e) continue;
    for (const [k, v] of Object.entries(e)) {
      if (v === undefined) delete out[k];
      else out[k] = v;
      any = true;
    }
  }
  return any ? out : undefined;
}

/** What Mastra's (command, args) become: argv when command is one program, else a shell line. */
export function toInvocation(command: string, args?: string[]): string | string[] {
  if (typeof command !== 'string' || command === '') throw new InvalidArgumentError('executeCommand: command must be a non-empty string');
  if (args !== undefined && args !== null && !Array.isArray(args)) throw new InvalidArgumentError('executeCommand: args must be an array of strings (options come third)');
  if (!args || args.length === 0) return command;
  if (SHELL_SAFE.test(command)) return [command, ...args];
  return `${command} ${args.map(shellQuote).join(' ')}`;
}

/** A tupper process as Mastra's ProcessHandle: output through emitStdout/emitStderr. */
export class TupperProcessHandle extends ProcessHandle {
  pid = '';
  private handle: CommandHandle | undefined;
  private code: number | undefined;
  private readonly startedAt = Date.now();
  private timedOut = false;
  private killed = false;
  private final: Promise<CommandResult> | undefined;

  /** @internal made by TupperProcessManager */
  constructor(options: Pick<SpawnProcessOptions, 'maxRetainedBytes' | 'onStdout' | 'onStderr'>) {
    super(options);
  }

  /** @internal */
  _attach(handle: CommandHandle): void {
    this.handle = handle;
    this.pid = String(handle.pid);
  }

  get exitCode(): number | undefined {
    return this.code;
  }

  async kill(): Promise<boolean> {
    if (!this.handle || this.code !== undefined) return false;
    const k = await this.handle.kill();
    if (k) this.killed = true;
    return k;
  }

  async sendStdin(data: string): Promise<void> {
    if (!this.handle) throw new Error('process not started');
    await this.handle.sendStdin(data);
  }

  override async closeStdin(): Promise<void> {
    if (!this.handle) throw new Error('process not started');
    await this.handle.closeStdin();
  }

  override wait(): Promise<CommandResult> {
    if (!this.handle) return Promise.reject(new Error('process not started'));
    this.final ??= this.settle(this.handle);
    return this.final;
  }

  private async settle(h: CommandHandle): Promise<CommandResult> {
    let exitCode = 0;
    try {
      exitCode = (await h.wait()).exitCode;
    } catch (e) {
      if (e instanceof CommandExitError) exitCode = e.exitCode;
      else if (e instanceof AbortError) {
        this.killed = true;
        exitCode = 137;
      } else if (e instanceof TimeoutError && /timeoutMs/.test(e.message)) {
        this.timedOut = true;
        this.killed = true;
        exitCode = 137;
      } else throw e;
    }
    this.code = exitCode;
    return {
      success: exitCode === 0 && !this.killed,
      exitCode,
      stdout: this.stdout,
      stderr: this.stderr,
      executionTimeMs: Date.now() - this.startedAt,
      ...(this.timedOut ? { timedOut: true } : {}),
      ...(this.killed ? { killed: true } : {}),
      stdoutTruncated: this.stdoutTruncated,
      stderrTruncated: this.stderrTruncated,
      stdoutDroppedBytes: this.stdoutDroppedBytes,
      stderrDroppedBytes: this.stderrDroppedBytes,
      ...(this.command !== undefined ? { command: this.command } : {}),
    };
  }
}

/** Mastra's process manager over tupper's processes. */
export class TupperProcessManager extends SandboxProcessManager<TupperSandbox> {
  override async spawn(command: string, options: SpawnProcessOptions = {}): Promise<ProcessHandle> {
    const sbx = this.sandbox.instance;
    const mh = new TupperProcessHandle({
      ...(options.maxRetainedBytes !== undefined ? { maxRetainedBytes: options.maxRetainedBytes } : {}),
      ...(options.onStdout ? { onStdout: options.onStdout } : {}),
      ...(options.onStderr ? { onStderr: options.onStderr } : {}),
    });
    const inv = options.originalInvocation ? toInvocation(options.originalInvocation.command, options.originalInvocation.args) : command;
    const envs = cleanEnv(this.env, this.sandbox._envOverlay(), options.env);
    const cwd = options.cwd ?? this.sandbox._defaultCwd();
    const user = this.sandbox.user;
    let handle: CommandHandle;
    try {
      handle = await sbx.commands.run(inv, {
        background: true,
        stdin: options.stdinMode !== 'ignore',
        timeoutMs: options.timeout ?? this.sandbox.defaultTimeoutMs,
        // the Mastra handle keeps the output (maxRetainedBytes); tupper's keeps none
        maxOutputBytes: 0,
        onStdout: (d) => mh.emitStdout(d),
        onStderr: (d) => mh.emitStderr(d),
        ...(options.abortSignal ? { signal: options.abortSignal } : {}),
        ...(envs ? { envs } : {}),
        ...(cwd !== undefined ? { cwd } : {}),
        ...(user !== undefined ? { user } : {}),
      });
    } catch (e) {
      if (e instanceof AbortError) throw new SandboxAbortError('spawn', options.abortSignal?.reason);
      if (e instanceof SandboxError && !(e instanceof InvalidArgumentError)) {
        throw new SandboxExecutionError(`cannot start ${command}: ${e.message}`, 127, '', '');
      }
      throw e;
    }
    mh._attach(handle);
    mh.command = command;
    this._tracked.set(mh.pid, mh);
    return mh;
  }

  /** The processes this manager started, and any other process of the box started through tupper's API. */
  override async list(): Promise<MastraProcessInfo[]> {
    const out = new Map<string, MastraProcessInfo>();
    for (const [pid, h] of this._tracked) {
      out.set(pid, { pid, running: h.exitCode === undefined, ...(h.command ? { command: h.command } : {}), ...(h.exitCode !== undefined ? { exitCode: h.exitCode } : {}) });
    }
    for (const p of await this.sandbox.instance.commands.list()) {
      const pid = String(p.pid);
      if (!out.has(pid) && !this._dismissed.has(pid)) out.set(pid, { pid, running: true, command: [p.cmd, ...p.args].join(' ') });
    }
    return [...out.values()];
  }

  /**
   * A handle by pid: one this manager started, or a process of the box
   * started elsewhere (another client, before a reconnect), attached to
   * with its recent output (tupper keeps the last 64 KiB).
   */
  override async get(pid: string): Promise<ProcessHandle | undefined> {
    const known = this._tracked.get(pid);
    if (known) return known;
    const n = Number(pid);
    if (!Number.isInteger(n) || n <= 0 || this._dismissed.has(pid)) return undefined;
    const mh = new TupperProcessHandle({});
    try {
      const h = await this.sandbox.instance.commands.connect(n, { onStdout: (d) => mh.emitStdout(d), onStderr: (d) => mh.emitStderr(d) });
      mh._attach(h);
    } catch (e) {
      if (e instanceof NotFoundError) return undefined;
      throw e;
    }
    this._tracked.set(pid, mh);
    return mh;
  }
}

/**
 * A tupper sandbox as a Mastra workspace sandbox.  `new TupperSandbox(opts)`
 * makes nothing yet: Mastra's start() (or the first command, through
 * ensureRunning) makes the box, or connects to `opts.sandboxId`.
 */
export class TupperSandbox extends MastraSandbox {
  readonly id: string;
  readonly name = 'TupperSandbox';
  readonly provider = 'tupper';
  status: ProviderStatus = 'pending';
  declare readonly processes: TupperProcessManager;
  /** @internal */
  readonly user: string | undefined;
  /** @internal */
  readonly defaultTimeoutMs: number;
  private sbx: Sandbox | undefined;
  private made = false;
  private readonly opts: TupperSandboxOptions;
  private readonly createdAt = new Date();

  constructor(opts: TupperSandboxOptions = {}) {
    super({
      name: 'TupperSandbox',
      processes: new TupperProcessManager(),
      ...(opts.env ? { env: opts.env } : {}),
      ...(opts.workingDirectory ? { workingDirectory: opts.workingDirectory } : {}),
      ...(opts.onStart ? { onStart: opts.onStart } : {}),
      ...(opts.onStop ? { onStop: opts.onStop } : {}),
      ...(opts.onDestroy ? { onDestroy: opts.onDestroy } : {}),
    });
    this.opts = opts;
    this.id = opts.id ?? `tupper-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
    this.user = opts.user;
    this.defaultTimeoutMs = opts.defaultTimeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
  }

  /** @internal Mastra's env overlay (setEnv; Mastra before 1.5x has none: the constructor's env) */
  _envOverlay(): Record<string, string | undefined> | undefined {
    const self = this as unknown as { getEnv?: () => Record<string, string | undefined> };
    return typeof self.getEnv === 'function' ? self.getEnv() : this.opts.env;
  }

  /** @internal the default working directory of commands, if one was given */
  _defaultCwd(): string | undefined {
    return (this as { workingDirectory?: string }).workingDirectory ?? this.opts.workingDirectory;
  }

  /** The @tupper/sdk Sandbox underneath (after start). */
  get instance(): Sandbox {
    if (!this.sbx) throw new SandboxError(`${this.id}: not started`);
    return this.sbx;
  }

  /** The tupper sandbox id, once started. */
  get sandboxId(): string | undefined {
    return this.sbx?.sandboxId;
  }

  /** Makes the box (or connects to opts.sandboxId; a paused one is resumed). */
  override async start(): Promise<SandboxStartResult> {
    if (this.sbx) {
      if ((await this.sbx.getInfo()).state === 'paused') await this.sbx.resume();
      return { outcome: 'connected' };
    }
    const { id: _id, sandboxId, workingDirectory: _wd, env: _env, user: _u, defaultTimeoutMs: _t, killOnDestroy: _k, onStart: _a, onStop: _b, onDestroy: _c, ...sbxOpts } = this.opts;
    if (sandboxId !== undefined) {
      const conn: SandboxConnectionOpts = {};
      if (sbxOpts.socket !== undefined) conn.socket = sbxOpts.socket;
      if (sbxOpts.requestTimeoutMs !== undefined) conn.requestTimeoutMs = sbxOpts.requestTimeoutMs;
      this.sbx = await Sandbox.connect(sandboxId, conn);
      if ((await this.sbx.getInfo()).state === 'paused') await this.sbx.resume();
      return { outcome: 'connected' };
    }
    this.sbx = await Sandbox.create(sbxOpts);
    this.made = true;
    return { outcome: 'created' };
  }

  /** Pauses the box (its processes frozen, its lifetime standing still); start() resumes it. */
  override async stop(): Promise<void> {
    if (this.sbx && (await this.sbx.isRunning())) await this.sbx.pause();
  }

  /** Kills the box when this one made it (or killOnDestroy), else lets go of it. */
  override async destroy(): Promise<void> {
    if (!this.sbx) return;
    if (this.opts.killOnDestroy ?? this.made) await this.sbx.kill();
    this.sbx = undefined;
  }

  /**
   * Runs a command and waits for its end.  With args and a plain program
   * name, [command, ...args] runs as argv, no shell in between; otherwise
   * the line runs with /bin/sh -c.  A non-zero exit resolves with
   * success: false; a timeout rejects with SandboxTimeoutError, an abort
   * with SandboxAbortError, a program that cannot start with
   * SandboxExecutionError.
   */
  override async executeCommand(command: string, args?: string[], options: ExecuteCommandOptions = {}): Promise<CommandResult> {
    await this.ensureRunning();
    const inv = toInvocation(command, args);
    const envs = cleanEnv(this._envOverlay(), options.env);
    const cwd = options.cwd ?? this._defaultCwd();
    const timeoutMs = options.timeout ?? this.defaultTimeoutMs;
    const max = options.maxRetainedBytes;
    const startedAt = Date.now();
    const base = { command: typeof inv === 'string' ? inv : command, ...(args && args.length ? { args: [...args] } : {}) };
    const toResult = (r: { exitCode: number; stdout: string; stderr: string; stdoutDroppedBytes?: number; stderrDroppedBytes?: number }): CommandResult => ({
      success: r.exitCode === 0,
      exitCode: r.exitCode,
      stdout: r.stdout,
      stderr: r.stderr,
      executionTimeMs: Date.now() - startedAt,
      ...(max !== undefined && max !== Infinity
        ? {
            stdoutTruncated: (r.stdoutDroppedBytes ?? 0) > 0,
            stderrTruncated: (r.stderrDroppedBytes ?? 0) > 0,
            stdoutDroppedBytes: r.stdoutDroppedBytes ?? 0,
            stderrDroppedBytes: r.stderrDroppedBytes ?? 0,
          }
        : {}),
      ...base,
    });
    try {
      const r = await this.instance.commands.run(inv, {
        timeoutMs,
        ...(max !== undefined && max !== Infinity ? { maxOutputBytes: max } : {}),
        ...(options.onStdout ? { onStdout: options.onStdout } : {}),
        ...(options.onStderr ? { onStderr: options.onStderr } : {}),
        ...(options.abortSignal ? { signal: options.abortSignal } : {}),
        ...(envs ? { envs } : {}),
        ...(cwd !== undefined ? { cwd } : {}),
        ...(this.user !== undefined ? { user: this.user } : {}),
      });
      return toResult(r);
    } catch (e) {
      if (e instanceof CommandExitError) return toResult(e.result);
      if (e instanceof AbortError) throw new SandboxAbortError('executeCommand', options.abortSignal?.reason);
      if (e instanceof TimeoutError && /timeoutMs/.test(e.message)) throw new SandboxTimeoutError(timeoutMs, 'command');
      if (e instanceof SandboxError && !(e instanceof InvalidArgumentError) && !(e instanceof TimeoutError)) {
        throw new SandboxExecutionError(`cannot start ${command}: ${e.message}`, 127, '', '');
      }
      throw e;
    }
  }

  /** Writes files into the box, each with its mode when given (0o001-0o777). */
  override async writeFiles(files: SandboxFileInput[], options: WriteFilesOptions = {}): Promise<void> {
    for (const f of files) {
      if (f.mode !== undefined && (!Number.isInteger(f.mode) || f.mode < 1 || f.mode > 0o777)) {
        throw new SandboxError(`writeFiles: bad mode ${String(f.mode)} for ${f.path} (0o001-0o777)`);
      }
    }
    if (options.abortSignal?.aborted) throw new SandboxAbortError('writeFiles', options.abortSignal.reason);
    await this.ensureRunning();
    for (const f of files) {
      if (options.abortSignal?.aborted) throw new SandboxAbortError('writeFiles', options.abortSignal.reason);
      await this.instance.files.write(f.path, f.content, {
        ...(f.mode !== undefined ? { mode: f.mode } : {}),
        ...(this.user !== undefined ? { user: this.user } : {}),
      });
    }
  }

  /** Ports of the box, forwarded to the host's loopback: `http://127.0.0.1:PORT`. */
  override readonly networking: SandboxNetworking = {
    getPortUrl: async (port: number): Promise<string | null> => {
      if (!this.sbx || this.status !== 'running') return null;
      return `http://${await this.sbx.getHostAsync(port)}`;
    },
  };

  /** Mastra's SandboxInfo, with tupper's limits and what the box uses now. */
  override async getInfo(): Promise<SandboxInfo> {
    const info: SandboxInfo = { id: this.id, name: this.name, provider: this.provider, status: this.status, createdAt: this.createdAt };
    if (!this.sbx) return info;
    const [t, metrics] = await Promise.all([this.sbx.getInfo(), this.sbx.getMetrics().catch(() => [])]);
    info.createdAt = t.startedAt;
    if (t.endAt) info.timeoutAt = t.endAt;
    const resources: NonNullable<SandboxInfo['resources']> = {};
    if (t.limits.memory !== undefined) resources.memoryMB = t.limits.memory / (1 << 20);
    if (t.limits.cpus !== undefined) resources.cpuCores = t.limits.cpus;
    if (t.limits.disk !== undefined) resources.diskMB = t.limits.disk / (1 << 20);
    const m = metrics[0];
    if (m) resources.memoryUsedMB = m.memUsed / (1 << 20);
    info.resources = resources;
    info.metadata = { sandboxId: t.sandboxId, state: t.state, ...(t.metadata ?? {}) };
    return info;
  }

  /**
   * tupper has no sandbox snapshots yet: as Mastra's contract for a
   * provider without checkpoints, snapshot() does nothing and
   * supportsCheckpoints is false.
   */
  override async snapshot(): Promise<void> {}

  override readonly supportsCheckpoints = false;

  /**
   * A sibling sandbox with this one's options (socket, image or recipe,
   * limits, network, policy, ...) and the overrides given; no I/O: it makes
   * its own box on start(), or attaches to `sandboxId`.  Checkpoint names
   * are ignored (tupper has no snapshots yet).
   */
  clone(options: SandboxCloneOptions = {}): TupperSandbox {
    const { id: _id, sandboxId: _sid, ...rest } = this.opts;
    return new TupperSandbox({
      ...rest,
      ...(options.id !== undefined ? { id: options.id } : {}),
      ...(options.sandboxId !== undefined ? { sandboxId: options.sandboxId } : {}),
      ...(options.env !== undefined ? { env: { ...(rest.env ?? {}), ...options.env } } : {}),
      ...(options.workingDirectory !== undefined ? { workingDirectory: options.workingDirectory } : {}),
    });
  }

  override getInstructions(): string {
    return 'Commands run in a tupper sandbox: an isolated Linux box (its own filesystem, processes and network rules). ' +
      `Commands run as ${this.user ?? 'the box\'s default account'}${this._defaultCwd() ? ` in ${this._defaultCwd()}` : ''}.`;
  }
}
