/**
 * @tupper/deepagents: a tupper sandbox as a deepagents sandbox backend
 * (SandboxBackendProtocolV2, by way of deepagents' BaseSandbox).  The agent's
 * `execute` tool runs its commands in the box; its file tools (ls,
 * read_file, write_file, edit_file, glob, grep) act on the box's files:
 * BaseSandbox builds ls, read, glob and grep from `execute`, and write and
 * edit from `uploadFiles` / `downloadFiles`, which go through tupper's file
 * API (no shell, any bytes).
 */
import { BaseSandbox, type ExecuteResponse, type FileDownloadResponse, type FileOperationError, type FileUploadResponse } from 'deepagents';
import {
  AbortError,
  CommandExitError,
  NotFoundError,
  PermissionError,
  Sandbox,
  SandboxError,
  TimeoutError,
  type SandboxConnectionOpts,
  type SandboxOpts,
} from '@tupper/sdk';

/** Default limit of one `execute`: 5 minutes. */
export const DEFAULT_EXECUTE_TIMEOUT_MS = 300_000;
/** Default most bytes of an `execute`'s output handed to the model (its newest ones). */
export const DEFAULT_MAX_OUTPUT_BYTES = 100_000;

/** How the backend runs commands (given at create, connect or fromSandbox). */
export interface TupperBackendOpts {
  /** Kill a command after this long (SIGKILL, its whole tree); 0 = never. Default 300000. */
  executeTimeoutMs?: number;
  /**
   * Most bytes of a command's output (stdout and stderr together, in the
   * order they came) returned to the agent: past that the oldest are
   * dropped, and `truncated` says so.  Default 100000.
   */
  maxOutputBytes?: number;
  /** The box's account commands and file operations act as (default: the sandbox's, `user` on the default image). */
  user?: string;
  /** Working directory of commands (default: that account's home). */
  cwd?: string;
  /** Environment added to every command's. */
  envs?: Record<string, string>;
  /** Kill the sandbox on close() (default: true when this backend created it). */
  killOnClose?: boolean;
}

/**
 * What createTupperBackend takes: tupper's sandbox options (image or
 * recipe, limits, network, policy, lifetime, backend, socket...) and the
 * backend's own.  With `sandboxId`, it connects to that running sandbox
 * instead of making one.
 */
export interface TupperBackendCreateOpts extends SandboxOpts, TupperBackendOpts {
  sandboxId?: string;
}

/** A sandbox error as deepagents' file operation errors name it, or null for one they do not have. */
export function fileError(e: unknown): FileOperationError | null {
  if (e instanceof NotFoundError) return 'file_not_found';
  if (e instanceof PermissionError) return 'permission_denied';
  const errno = e instanceof SandboxError ? e.errnoCode : undefined;
  switch (errno) {
    case 'ENOENT':
      return 'file_not_found';
    case 'EACCES':
    case 'EPERM':
    case 'EROFS':
      return 'permission_denied';
    case 'EISDIR':
      return 'is_directory';
    case 'ENOTDIR':
    case 'EEXIST': // a parent of the path is a file
    case 'ENAMETOOLONG':
    case 'ELOOP':
    case 'EINVAL':
      return 'invalid_path';
    default:
      return null;
  }
}

function checkPath(path: unknown): FileOperationError | null {
  if (typeof path !== 'string' || !path.startsWith('/') || path.includes('\0')) return 'invalid_path';
  return null;
}

/** The combined output of a command as it arrives, keeping the newest `max` bytes. */
class Output {
  private parts: Buffer[] = [];
  private bytes = 0;
  truncated = false;

  constructor(private readonly max: number) {}

  add(text: string): void {
    const b = Buffer.from(text, 'utf8');
    this.parts.push(b);
    this.bytes += b.length;
    while (this.bytes > this.max && this.parts.length > 0) {
      this.truncated = true;
      const excess = this.bytes - this.max;
      const first = this.parts[0];
      if (first.length <= excess) {
        this.parts.shift();
        this.bytes -= first.length;
      } else {
        let cut = excess;
        while (cut < first.length && (first[cut] & 0xc0) === 0x80) cut++;
        this.parts[0] = first.subarray(cut);
        this.bytes -= cut;
      }
    }
  }

  toString(): string {
    return Buffer.concat(this.parts).toString('utf8');
  }
}

/**
 * A tupper sandbox as deepagents' sandbox backend.  Make one with
 * `TupperSandbox.create(opts)`, `TupperSandbox.connect(id, opts)` or
 * `TupperSandbox.fromSandbox(sbx)`; hand it to `createDeepAgent({ backend })`;
 * `close()` it when done (it kills a sandbox it created).
 */
export class TupperSandbox extends BaseSandbox {
  /** The sandbox id. */
  readonly id: string;
  /** The @tupper/sdk Sandbox underneath, for anything the protocol does not cover. */
  readonly sandbox: Sandbox;
  private readonly opts: TupperBackendOpts;
  private readonly killOnClose: boolean;

  private constructor(sandbox: Sandbox, opts: TupperBackendOpts, created: boolean) {
    super();
    this.sandbox = sandbox;
    this.id = sandbox.sandboxId;
    this.opts = opts;
    this.killOnClose = opts.killOnClose ?? created;
  }

  /** Makes a sandbox (or connects to `opts.sandboxId`) and returns it as a backend. */
  static async create(opts: TupperBackendCreateOpts = {}): Promise<TupperSandbox> {
    const { sandboxId, executeTimeoutMs, maxOutputBytes, user, cwd, envs, killOnClose, ...sbxOpts } = opts;
    const own: TupperBackendOpts = { executeTimeoutMs, maxOutputBytes, user, cwd, envs, killOnClose };
    if (sandboxId !== undefined) return TupperSandbox.connect(sandboxId, { ...sbxOpts, ...own });
    // the sandbox's envs and cwd apply to every command already
    const sbx = await Sandbox.create({ ...sbxOpts, ...(envs ? { envs } : {}), ...(cwd ? { cwd } : {}) });
    return new TupperSandbox(sbx, { executeTimeoutMs, maxOutputBytes, user, killOnClose }, true);
  }

  /** Connects to a running sandbox; close() leaves it running unless `killOnClose`. */
  static async connect(sandboxId: string, opts: SandboxConnectionOpts & TupperBackendOpts = {}): Promise<TupperSandbox> {
    const { executeTimeoutMs, maxOutputBytes, user, cwd, envs, killOnClose, ...conn } = opts;
    const sbx = await Sandbox.connect(sandboxId, conn);
    return new TupperSandbox(sbx, { executeTimeoutMs, maxOutputBytes, user, cwd, envs, killOnClose }, false);
  }

  /** A backend over a Sandbox you already hold; close() leaves it running unless `killOnClose`. */
  static fromSandbox(sandbox: Sandbox, opts: TupperBackendOpts = {}): TupperSandbox {
    return new TupperSandbox(sandbox, opts, false);
  }

  /**
   * Runs a shell command (`/bin/sh -c`) and returns its output (stdout and
   * stderr interleaved as they came), its exit code, and whether the output
   * was cut to maxOutputBytes.  A command killed by its timeout has exit
   * code null and says so at the end of its output.
   */
  async execute(command: string): Promise<ExecuteResponse> {
    const out = new Output(this.opts.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES);
    const timeoutMs = this.opts.executeTimeoutMs ?? DEFAULT_EXECUTE_TIMEOUT_MS;
    const add = (d: string): void => out.add(d);
    try {
      const r = await this.sandbox.commands.run(command, {
        timeoutMs,
        onStdout: add,
        onStderr: add,
        // the output is kept here, in order; the handle keeps none
        maxOutputBytes: 0,
        ...(this.opts.user !== undefined ? { user: this.opts.user } : {}),
        ...(this.opts.cwd !== undefined ? { cwd: this.opts.cwd } : {}),
        ...(this.opts.envs !== undefined ? { envs: this.opts.envs } : {}),
      });
      return { output: out.toString(), exitCode: r.exitCode, truncated: out.truncated };
    } catch (e) {
      if (e instanceof CommandExitError) {
        // a signal's end is 128 + its number, as a shell reports it
        return { output: out.toString(), exitCode: e.exitCode, truncated: out.truncated };
      }
      if (e instanceof TimeoutError || e instanceof AbortError) {
        out.add(`\n[tupper: ${e.message}]`);
        return { output: out.toString(), exitCode: null, truncated: out.truncated };
      }
      if (e instanceof SandboxError && e.code !== undefined && !(e instanceof NotFoundError && e.errnoCode === undefined)) {
        // the command could not start (no such program, a policy's refusal): the agent reads why
        out.add(e.message);
        return { output: out.toString(), exitCode: 127, truncated: out.truncated };
      }
      throw e;
    }
  }

  /** Writes each file (parents made), each on its own: one that fails says why and the rest still go. */
  async uploadFiles(files: Array<[string, Uint8Array]>): Promise<FileUploadResponse[]> {
    const res: FileUploadResponse[] = [];
    for (const [path, content] of files) {
      const bad = checkPath(path);
      if (bad) {
        res.push({ path, error: bad });
        continue;
      }
      try {
        await this.sandbox.files.write(path, content, this.fileOpts());
        res.push({ path, error: null });
      } catch (e) {
        const kind = fileError(e);
        if (kind === null) throw e;
        res.push({ path, error: kind });
      }
    }
    return res;
  }

  /** Reads each file, each on its own: a missing one, a directory or a refused one says so. */
  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    const res: FileDownloadResponse[] = [];
    for (const path of paths) {
      const bad = checkPath(path);
      if (bad) {
        res.push({ path, content: null, error: bad });
        continue;
      }
      try {
        const content = await this.sandbox.files.read(path, { ...this.fileOpts(), format: 'bytes' });
        res.push({ path, content, error: null });
      } catch (e) {
        const kind = fileError(e);
        if (kind === null) throw e;
        res.push({ path, content: null, error: kind });
      }
    }
    return res;
  }

  /** Ends the backend: kills the sandbox when it made it (or `killOnClose`), else only lets go of it. */
  async close(): Promise<void> {
    if (this.killOnClose) await this.sandbox.kill();
  }

  private fileOpts(): { user?: string } {
    return this.opts.user !== undefined ? { user: this.opts.user } : {};
  }
}

/**
 * The factory: makes a tupper sandbox from options (image or recipe,
 * limits, network, policy, ...), or connects to `sandboxId`, and returns it
 * as a deepagents backend.
 */
export function createTupperBackend(opts: TupperBackendCreateOpts = {}): Promise<TupperSandbox> {
  return TupperSandbox.create(opts);
}
