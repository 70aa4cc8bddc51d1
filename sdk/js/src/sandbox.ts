/**
 * Sandbox: E2B's Sandbox class over tupper's socket API.  Each Sandbox object
 * has its own connection to the daemon (the daemon sends a process's output
 * to the connection that started it); static methods open one for the call.
 */
import { Commands, type SandboxLink } from './commands';
import { Connection, type ConnectionOpts } from './connection';
import { InvalidArgumentError, NotFoundError } from './errors';
import { Filesystem } from './filesystem';
import { policyParam, type PolicyOpt } from './policy';
import { recipeParam, type RecipeOpt } from './recipe';
import { Pty } from './pty';

/** Default lifetime of a sandbox, as E2B: 5 minutes. */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 300_000;

/** Options every call that talks to the daemon takes. */
export interface SandboxConnectionOpts extends ConnectionOpts {
  /** Accepted and ignored (E2B compatibility): the daemon's socket is guarded by its file mode. */
  apiKey?: string;
  /** Accepted and ignored (E2B compatibility). */
  accessToken?: string;
  /** Accepted and ignored (E2B compatibility). */
  domain?: string;
  /** Accepted and ignored (E2B compatibility). */
  debug?: boolean;
}

/** Resource limits (docs/protocol.md, sandbox.create). */
export interface SandboxLimits {
  /** Bytes, or a string like "256M", "1.5G". */
  memory?: number | string;
  /** CPU quota in cores, e.g. 0.5. */
  cpus?: number;
  /** Most processes and threads at once. */
  pids?: number;
  /** Most the box may write: bytes or a string like "1G". */
  disk?: number | string;
}

/**
 * What a sandbox may reach (docs/network.md): `"none"` (the default), `"all"`
 * (trusted use), or rules such as `"pypi.org"`, `"*.pythonhosted.org:443"`,
 * `"10.1.2.0/24:5432"`; deny wins.
 */
export type NetworkRules = 'none' | 'all' | { allow?: string[]; deny?: string[] };

/** One decision of the sandbox's network log. */
export interface NetworkLogEntry {
  time: string;
  action: 'allow' | 'deny' | 'fail';
  via: string;
  host?: string;
  port?: number;
  reason?: string;
  addr?: string;
}

export interface SandboxOpts extends SandboxConnectionOpts {
  /** The image (E2B's template). Only "default", the embedded busybox image, for now. */
  image?: string;
  /**
   * Where it runs: 'linux' (the default: namespaces on the host's kernel) or
   * 'microvm' (a QEMU microVM with its own kernel; same API, see docs/microvm.md).
   */
  backend?: 'linux' | 'microvm';
  /** Environment of every command. */
  envs?: Record<string, string>;
  /** Free-form strings, returned by getInfo and list. */
  metadata?: Record<string, string>;
  /** Lifetime: the daemon kills the sandbox this long after create (0: until killed). Default 300000. */
  timeoutMs?: number;
  limits?: SandboxLimits;
  /** Default working directory of commands (default `/`). */
  cwd?: string;
  /**
   * The policy file that binds the sandbox (docs/policy.md): a path, its
   * text as `{source, name}`, or `false` for none.  Default: the nearest
   * `tupper.lua` from `process.cwd()` upward, as the CLI does.
   */
  policy?: PolicyOpt;
  /**
   * The recipe the sandbox is made from (docs/recipes.md): a recipe file's
   * path (its `.lock` beside it is honoured), a shipped recipe's name, or
   * `{source, name, lock}`.  Its image, env, workdir, user, limits and files
   * apply and its setup's layer is used; `envs`, `cwd`, `limits` and
   * `timeoutMs` given here override the recipe's.
   */
  recipe?: RecipeOpt;
  /** Egress rules; the daemon's HTTP proxy, SOCKS5 and DNS carry what they allow. */
  network?: NetworkRules;
}

/** How long a create from a recipe waits by default: its setup (and a Debian image build) may take minutes. */
export const RECIPE_CREATE_TIMEOUT_MS = 2 * 3600 * 1000;

export type SandboxState = 'running' | 'paused';

/** What getInfo and list say about a sandbox (E2B's SandboxInfo, and tupper's extras). */
export interface SandboxInfo {
  sandboxId: string;
  /** The image it was made from (E2B's template id). */
  templateId: string;
  name?: string;
  metadata: Record<string, string>;
  state: SandboxState;
  startedAt: Date;
  /** When the daemon will kill it; absent without a lifetime. */
  endAt?: Date;
  /** CPU quota in cores, when limited. */
  cpuCount?: number;
  /** Memory limit in MiB, when limited. */
  memoryMB?: number;
  /** The limits set (memory and disk in bytes). */
  limits: { memory?: number; cpus?: number; pids?: number; disk?: number };
  /** Its lifetime (0: none). */
  timeoutMs: number;
  /** Live processes started through the API. */
  processes?: number;
  /** For a sandbox made from a recipe: its name, the key of its setup layer, and whether that layer was cached. */
  recipe?: { name: string; layer?: string; cached?: boolean };
  /**
   * The account commands and files act as unless told otherwise, as E2B:
   * `user` on an image with a `user` account (E2B's base image has one),
   * the image's or recipe's User when it names one, else `root`.
   */
  defaultUser?: string;
  /** That account's home: where relative paths and commands start (`/` for the root fallback). */
  home?: string;
  /** The working directory the sandbox was given (create's cwd, a recipe's workdir, the image's WorkingDir). */
  workdir?: string;
}

/** One sample of the sandbox's counters, from its cgroup. */
export interface SandboxMetrics {
  timestamp: Date;
  /** CPU quota in cores, when limited. */
  cpuCount?: number;
  /** Memory in use, bytes. */
  memUsed: number;
  /** Memory limit in bytes, when limited. */
  memTotal?: number;
  /** Total CPU time used, microseconds. */
  cpuUsageUsec: number;
  memoryPeak?: number;
  pids: number;
  nrThrottled?: number;
  throttledUsec?: number;
  oomKills?: number;
}

export interface SandboxListOpts extends SandboxConnectionOpts {
  /**
   * Filter on the client side: every metadata pair must match; state among
   * these; started at or after `startedAfter` and before `startedBefore`.
   */
  query?: { metadata?: Record<string, string>; state?: SandboxState[]; startedAfter?: Date; startedBefore?: Date };
  /** Page size (default 100). */
  limit?: number;
  /** Where to start: a token from an earlier page. */
  nextToken?: string;
}

function toInfo(r: Record<string, unknown>): SandboxInfo {
  const limits = (r.limits ?? {}) as SandboxInfo['limits'];
  const info: SandboxInfo = {
    sandboxId: String(r.id),
    templateId: String(r.image ?? 'default'),
    name: String(r.image ?? 'default'),
    metadata: (r.metadata ?? {}) as Record<string, string>,
    state: r.state as SandboxState,
    startedAt: new Date(String(r.created_at)),
    limits,
    timeoutMs: Math.round((typeof r.timeout === 'number' ? r.timeout : 0) * 1000),
  };
  if (typeof r.expires_at === 'string') info.endAt = new Date(r.expires_at);
  if (typeof limits.cpus === 'number') info.cpuCount = limits.cpus;
  if (typeof limits.memory === 'number') info.memoryMB = limits.memory / (1 << 20);
  if (typeof r.processes === 'number') info.processes = r.processes;
  if (r.recipe && typeof r.recipe === 'object') info.recipe = r.recipe as SandboxInfo['recipe'];
  if (typeof r.default_user === 'string') info.defaultUser = r.default_user;
  if (typeof r.home === 'string') info.home = r.home;
  if (typeof r.workdir === 'string') info.workdir = r.workdir;
  return info;
}

function seconds(ms: number, what: string): number {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) throw new InvalidArgumentError(`${what}: bad timeoutMs ${String(ms)}`);
  return ms / 1000;
}

async function withConnection<T>(opts: SandboxConnectionOpts | undefined, fn: (c: Connection) => Promise<T>): Promise<T> {
  const conn = await Connection.open(opts);
  try {
    return await fn(conn);
  } finally {
    conn.close();
  }
}

/**
 * Pages over Sandbox.list(), as E2B's SandboxPaginator: `hasNext` is true
 * until the last page was returned by `nextItems()`.
 */
export class SandboxPaginator {
  private readonly opts: SandboxListOpts;
  private readonly limit: number;
  private offset: number;
  private more = true;

  /** @internal */
  constructor(opts: SandboxListOpts = {}) {
    this.opts = opts;
    this.limit = opts.limit ?? 100;
    if (!Number.isInteger(this.limit) || this.limit < 1) throw new InvalidArgumentError(`Sandbox.list: bad limit ${opts.limit}`);
    this.offset = opts.nextToken ? Number.parseInt(opts.nextToken, 10) : 0;
    if (!Number.isInteger(this.offset) || this.offset < 0) throw new InvalidArgumentError(`Sandbox.list: bad nextToken ${opts.nextToken}`);
  }

  get hasNext(): boolean {
    return this.more;
  }

  /** The token of the next page, while there is one. */
  get nextToken(): string | undefined {
    return this.more ? String(this.offset) : undefined;
  }

  /** The next page of sandboxes, oldest first. */
  async nextItems(): Promise<SandboxInfo[]> {
    if (!this.more) throw new InvalidArgumentError('Sandbox.list: no more items to fetch');
    const r = await withConnection(this.opts, (c) => c.call<{ sandboxes: Array<Record<string, unknown>> }>('sandbox.list', {}));
    const q = this.opts.query ?? {};
    const all = r.sandboxes.map(toInfo).filter((s) => {
      if (q.state && !q.state.includes(s.state)) return false;
      if (q.startedAfter && s.startedAt.getTime() < q.startedAfter.getTime()) return false;
      if (q.startedBefore && s.startedAt.getTime() >= q.startedBefore.getTime()) return false;
      for (const [k, v] of Object.entries(q.metadata ?? {})) if (s.metadata[k] !== v) return false;
      return true;
    });
    const page = all.slice(this.offset, this.offset + this.limit);
    this.offset += page.length;
    this.more = this.offset < all.length;
    return page;
  }
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
    const s: SandboxMetrics = {
      timestamp: new Date(),
      memUsed: m.memory_bytes ?? 0,
      cpuUsageUsec: m.cpu_usage_usec ?? 0,
      pids: m.pids ?? 0,
    };
    if (info.limits.cpus !== undefined) s.cpuCount = info.limits.cpus;
    if (info.limits.memory !== undefined) s.memTotal = info.limits.memory;
    if (m.memory_peak !== undefined) s.memoryPeak = m.memory_peak;
    if (m.nr_throttled !== undefined) s.nrThrottled = m.nr_throttled;
    if (m.throttled_usec !== undefined) s.throttledUsec = m.throttled_usec;
    if (m.oom_kills !== undefined) s.oomKills = m.oom_kills;
    return [s];
  }
}
