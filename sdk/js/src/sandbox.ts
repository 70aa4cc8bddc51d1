/**
 * Sandbox: E2B's Sandbox class over tupper's socket API.  Each Sandbox object
 * has its own connection to the daemon (the daemon sends a process's output
 * to the connection that started it); static methods open one for the call.
 */
import { Commands } from './commands';
import { Connection, withConnection } from './connection';
import { checkTimeoutMs, InvalidArgumentError, NotFoundError } from './errors';
import { Filesystem } from './filesystem';
import type { SandboxLink } from './link';
import { SandboxPaginator, type SandboxListOpts } from './paginator';
import { policyParam } from './policy';
import { Pty } from './pty';
import { recipeParam } from './recipe';
import { type SandboxInfo, type SandboxMetrics, toInfo, toMetrics } from './sandbox-info';
import type { NetworkLogEntry, NetworkRules, SandboxConnectionOpts, SandboxOpts } from './sandbox-opts';

/** Default lifetime of a sandbox, as E2B: 5 minutes. */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 300_000;

/** How long a create from a recipe waits by default: its setup (and a Debian image build) may take minutes. */
export const RECIPE_CREATE_TIMEOUT_MS = 2 * 3600 * 1000;
/** How long a create naming an image may take (the MCP and HTTP servers): a first use pulls it. */
export const IMAGE_CREATE_TIMEOUT_MS = 30 * 60_000;

function seconds(ms: number, what: string): number {
  return checkTimeoutMs(ms, what) / 1000;
}

/**
 * @internal the connection a Sandbox object holds, for the servers built
 * on it (a Sandbox has no public "disconnect").
 */
function connectionOf(s: Sandbox): Connection | undefined {
  return (s as unknown as { conn?: Connection }).conn;
}

/** @internal lets go of a Sandbox object's connection: the sandbox lives on. */
export function dropConnection(s: Sandbox): void {
  connectionOf(s)?.close();
}

/** @internal true once a Sandbox object's connection closed (the daemon may drop one that falls far behind). */
export function connectionClosed(s: Sandbox): boolean {
  return connectionOf(s)?.closed === true;
}

export class Sandbox {
  /** The sandbox's id. */
  readonly sandboxId: string;
  /** Commands in the sandbox. */
  readonly commands: Commands;
  /** The sandbox's filesystem. */
  readonly files: Filesystem;
  /** Programs on a terminal. */
  readonly pty: Pty;
  private readonly conn: Connection;
  private readonly state: { killed: boolean };

  /**
   * The account commands and files act as unless their `user` says
   * otherwise (E2B's default): `user` on an image with that account, the
   * image's or recipe's User, else `root`.
   */
  readonly defaultUser?: string;
  /** The default account's home: relative paths and commands start there. */
  readonly home: string;
  /** The working directory the sandbox was given, if any (tupper's): commands of the default account start there. */
  readonly workdir?: string;

  /** Use Sandbox.create or Sandbox.connect. */
  protected constructor(conn: Connection, r: Record<string, unknown>) {
    this.conn = conn;
    const sandboxId = String(r.id);
    this.sandboxId = sandboxId;
    this.state = { killed: false };
    const state = this.state;
    const info = toInfo(r);
    // an older daemon says nothing of accounts: root in /, as it was
    this.defaultUser = info.defaultUser;
    this.home = info.home ?? '/';
    this.workdir = info.workdir;
    const link: SandboxLink = {
      sandboxId,
      conn,
      get killed() {
        return state.killed;
      },
      defaultUser: this.defaultUser,
      home: this.home,
      workdir: info.workdir,
    };
    this.commands = new Commands(link);
    this.files = new Filesystem(link);
    this.pty = new Pty(link, this.commands);
  }

  /**
   * Creates a sandbox.  `Sandbox.create()`, `Sandbox.create(opts)` or, as in
   * E2B, `Sandbox.create(template, opts)` with the image as the template.
   */
  static async create(opts?: SandboxOpts): Promise<Sandbox>;
  static async create(template: string, opts?: SandboxOpts): Promise<Sandbox>;
  static async create(templateOrOpts?: string | SandboxOpts, maybeOpts?: SandboxOpts): Promise<Sandbox> {
    const opts: SandboxOpts =
      typeof templateOrOpts === 'string' ? { ...maybeOpts, image: templateOrOpts } : { ...templateOrOpts };
    const limits: Record<string, unknown> = { ...opts.limits };
    // a recipe may set the lifetime; only an explicit timeoutMs overrides it
    if (opts.timeoutMs !== undefined || opts.recipe === undefined) {
      limits.timeout = seconds(opts.timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS, 'Sandbox.create');
    }
    const params: Record<string, unknown> = {};
    if (Object.keys(limits).length > 0) params.limits = limits;
    if (opts.recipe !== undefined) params.recipe = await recipeParam(opts.recipe);
    if (opts.image !== undefined) params.image = opts.image;
    if (opts.backend !== undefined) params.backend = opts.backend;
    if (opts.accel !== undefined) params.accel = opts.accel;
    if (opts.envs !== undefined) params.env = opts.envs;
    if (opts.metadata !== undefined) params.metadata = opts.metadata;
    if (opts.cwd !== undefined) params.cwd = opts.cwd;
    if (opts.network !== undefined) params.network = opts.network;
    const policy = await policyParam(opts.policy);
    if (policy !== undefined) params.policy = policy;
    const conn = await Connection.open(opts);
    try {
      // a recipe's first create runs its setup (and may build its image):
      // minutes, not the usual request bound, unless the caller set one
      const callOpts = opts.recipe !== undefined && opts.requestTimeoutMs === undefined ? { timeoutMs: RECIPE_CREATE_TIMEOUT_MS } : {};
      const r = await conn.call<Record<string, unknown>>('sandbox.create', params, callOpts);
      return new Sandbox(conn, r);
    } catch (e) {
      conn.close();
      throw e;
    }
  }

  /**
   * Connects to an existing sandbox (NotFoundError when there is none); a
   * paused one is resumed, as in E2B.  `timeoutMs` sets a new lifetime.
   */
  static async connect(sandboxId: string, opts: SandboxConnectionOpts & { timeoutMs?: number } = {}): Promise<Sandbox> {
    const conn = await Connection.open(opts);
    try {
      const r = await conn.call<Record<string, unknown>>('sandbox.get', { id: sandboxId });
      if (r.state === 'paused') await conn.call('sandbox.resume', { id: sandboxId });
      if (opts.timeoutMs !== undefined) {
        await conn.call('sandbox.set_timeout', { id: sandboxId, timeout: seconds(opts.timeoutMs, 'Sandbox.connect') });
      }
      return new Sandbox(conn, r);
    } catch (e) {
      conn.close();
      throw e;
    }
  }

  /** The sandboxes, page by page (E2B's paginator): `await Sandbox.list().nextItems()`. */
  static list(opts?: SandboxListOpts): SandboxPaginator {
    return new SandboxPaginator(opts);
  }

  /** Kills a sandbox by id: true when it was killed, false when there was no such sandbox. */
  static async kill(sandboxId: string, opts?: SandboxConnectionOpts): Promise<boolean> {
    return withConnection(opts, async (c) => {
      const r = await c.call<{ killed: boolean }>('sandbox.kill', { id: sandboxId });
      return r.killed === true;
    });
  }

  /** Describes a sandbox by id (NotFoundError when there is none). */
  static async getInfo(sandboxId: string, opts?: SandboxConnectionOpts): Promise<SandboxInfo> {
    return withConnection(opts, async (c) => toInfo(await c.call('sandbox.get', { id: sandboxId })));
  }

  /** Sets a sandbox's lifetime from now (0: until killed). */
  static async setTimeout(sandboxId: string, timeoutMs: number, opts?: SandboxConnectionOpts): Promise<void> {
    const timeout = seconds(timeoutMs, 'Sandbox.setTimeout');
    await withConnection(opts, (c) => c.call('sandbox.set_timeout', { id: sandboxId, timeout }));
  }

  /**
   * Kills the sandbox: every process, mount and file of it is gone.  Commands
   * still waited on reject with TimeoutError.  False when it was already gone.
   */
  async kill(): Promise<boolean> {
    try {
      const r = await this.conn.call<{ killed: boolean }>('sandbox.kill', { id: this.sandboxId });
      return r.killed === true;
    } finally {
      this.state.killed = true;
      this.commands._sandboxGone('killed');
      this.files._sandboxGone('killed');
      this.conn.close();
    }
  }

  /** The sandbox now lives timeoutMs from now (0: until killed). */
  async setTimeout(timeoutMs: number): Promise<void> {
    await this.conn.call('sandbox.set_timeout', { id: this.sandboxId, timeout: seconds(timeoutMs, 'setTimeout') });
  }

  async getInfo(): Promise<SandboxInfo> {
    return toInfo(await this.conn.call('sandbox.get', { id: this.sandboxId }));
  }

  /** Replaces the network rules; the next connection and DNS query follow them. */
  async updateNetwork(network: NetworkRules): Promise<void> {
    await this.conn.call('sandbox.update_network', { id: this.sandboxId, network });
  }

  /** The sandbox's recent network decisions, oldest first. */
  async getNetworkLog(): Promise<NetworkLogEntry[]> {
    const r = await this.conn.call<{ entries: NetworkLogEntry[] }>('sandbox.network_log', { id: this.sandboxId });
    return r.entries;
  }

  /**
   * "127.0.0.1:PORT": a port on the host's loopback forwarded to `port`
   * inside the sandbox (as E2B's getHost, which gives a public host name).
   */
  async getHost(port: number): Promise<string> {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new InvalidArgumentError(`getHost: bad port ${String(port)}`);
    const r = await this.conn.call<{ host: string; port: number }>('sandbox.expose', { id: this.sandboxId, port });
    return `${r.host}:${r.port}`;
  }

  /** True while the sandbox exists and is not paused. */
  async isRunning(): Promise<boolean> {
    try {
      return (await this.getInfo()).state === 'running';
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /**
   * Freezes every process of the sandbox (cgroup freezer); its lifetime
   * stands still.  Commands and files are refused until resume().  True once
   * it is paused.
   */
  async pause(): Promise<boolean> {
    const r = await this.conn.call<{ state: string }>('sandbox.pause', { id: this.sandboxId });
    return r.state === 'paused';
  }

  /** E2B's name for pause(). */
  async betaPause(): Promise<boolean> {
    return this.pause();
  }

  /** Thaws a paused sandbox; its lifetime runs on.  True once it is running. */
  async resume(): Promise<boolean> {
    const r = await this.conn.call<{ state: string }>('sandbox.resume', { id: this.sandboxId });
    return r.state === 'running';
  }

  /** The sandbox's counters now, as a one-sample list (E2B returns samples over time). */
  async getMetrics(): Promise<SandboxMetrics[]> {
    const [m, info] = await Promise.all([
      this.conn.call<Record<string, number | undefined>>('sandbox.metrics', { id: this.sandboxId }),
      this.getInfo(),
    ]);
    return [toMetrics(m, info)];
  }
}
