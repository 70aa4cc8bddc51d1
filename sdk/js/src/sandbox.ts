/**
 * Sandbox: E2B's Sandbox class over tupper's socket API.  Each Sandbox object
 * has its own connection to the daemon (the daemon sends a process's output
 * to the connection that started it); static methods open one for the call.
 */
import * as os from 'node:os';
import * as nodePath from 'node:path';
import { Worker } from 'node:worker_threads';
import { Commands } from './commands';
import { Connection, connectionOpts, withConnection, type ConnectionOpts } from './connection';
import { networkParam, checkNetwork, type SandboxNetworkUpdate } from './e2b-network';
import { checkTimeoutMs, fromRpcError, InvalidArgumentError, NotFoundError, SandboxError } from './errors';
import { HEADER_BYTES, STATE_ANSWERED, STATE_NEW, type ExposeJob } from './expose-shared';
import { Filesystem } from './filesystem';
import type { SandboxLink } from './link';
import { SandboxPaginator, type SandboxListOpts } from './paginator';
import { checkKeys as checkOptionKeys } from './options';
import { policyParam } from './policy';
import { Pty } from './pty';
import { recipeParam, templateParams } from './recipe';
import { type SandboxInfo, type SandboxMetrics, type SandboxMetricsOpts, toInfo, toMetrics } from './sandbox-info';
import type { NetworkLogEntry, NetworkRules, SandboxConnectionOpts, SandboxOpts } from './sandbox-opts';
import {
  type CreateSnapshotOpts, type SandboxForkOpts, type SnapshotInfo, SnapshotPaginator, checkForkCount,
  deleteSnapshotOn, snapshotOn,
} from './snapshot';

/** E2B's connect options: tupper's connection options, a lifetime, and how a paused box comes back. */
export type SandboxConnectOpts = SandboxConnectionOpts & {
  /** Extend the lifetime to this long from now (never shortened, as E2B). */
  timeoutMs?: number;
  /** E2B's: 'restore' (the default) is what tupper's resume does (the frozen processes run on); 'reboot' is refused. */
  onResume?: 'restore' | 'reboot';
};

function checkOnResume(v: unknown, what: string): void {
  if (v === undefined || v === 'restore') return;
  if (v === 'reboot') throw new InvalidArgumentError(`${what}: onResume 'reboot' is not supported: tupper resumes a paused sandbox as it was`);
  throw new InvalidArgumentError(`${what}: onResume must be 'restore' or 'reboot', not ${JSON.stringify(v)}`);
}

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
 * E2B's connection options tupper accepts and has no use for (there is no
 * API server, key or proxy: the daemon's socket is guarded by its mode).
 */
const E2B_CONNECTION_KEYS = [
  'apiKey', 'accessToken', 'domain', 'debug', 'validateApiKey', 'apiUrl', 'sandboxUrl', 'retries', 'logger',
  'headers', 'proxy', 'apiHeaders', 'signal',
];
const CONNECTION_KEYS = ['socket', 'requestTimeoutMs', ...E2B_CONNECTION_KEYS];
const CREATE_KEYS = new Set([
  ...CONNECTION_KEYS, 'template', 'image', 'backend', 'accel', 'envs', 'metadata', 'timeoutMs', 'limits', 'cwd', 'policy',
  'recipe', 'network', 'allowInternetAccess', 'secure', 'lifecycle', 'volumeMounts', 'snapshot',
]);
/** E2B options with no local counterpart at all: refused with a reason rather than dropped. */
const E2B_UNSUPPORTED: Record<string, string> = {
  mcp: "tupper has no MCP gateway template; run tupper's own MCP server (tupper-mcp) instead",
  iam: 'tupper has no workload identity tokens',
};
const CONNECT_KEYS = new Set([...CONNECTION_KEYS, 'timeoutMs', 'onResume']);

/** InvalidArgumentError for every key of opts not in known (an option tupper does not know is never dropped). */
function checkKeys(opts: object | undefined, known: Set<string>, what: string): void {
  checkOptionKeys(opts, known, what, E2B_UNSUPPORTED);
}

/** E2B's volumeMounts ({ '/mnt/data': vol | 'name' }) as sandbox.create's volumes (path -> name or id). */
function volumeMountsParam(m: unknown): Record<string, string> {
  if (m === null || typeof m !== 'object' || Array.isArray(m)) {
    throw new InvalidArgumentError("Sandbox.create: volumeMounts must map mount points to volumes, e.g. { '/mnt/data': vol }");
  }
  const out: Record<string, string> = {};
  for (const [path, v] of Object.entries(m as Record<string, unknown>)) {
    const ref = typeof v === 'string' ? v : v !== null && typeof v === 'object' ? (v as { volumeId?: unknown }).volumeId : undefined;
    if (typeof ref !== 'string' || ref === '') {
      throw new InvalidArgumentError(`Sandbox.create: volumeMounts['${path}'] must be a Volume or a volume's name`);
    }
    out[path] = ref;
  }
  return out;
}

/** E2B's pause options: keepMemory writes the pause to disk (see Sandbox.pause). */
export type SandboxPauseOpts = { keepMemory?: boolean };

function pauseKeepMemory(opts: SandboxPauseOpts | undefined, what: string): { keep_memory?: boolean } {
  const v = opts?.keepMemory;
  if (v === undefined) return {};
  if (typeof v !== 'boolean') throw new InvalidArgumentError(`${what}: keepMemory must be a boolean`);
  return { keep_memory: v };
}

/** E2B's lifecycle: kill at timeout is what tupper does; pause at timeout it cannot. */
function checkLifecycle(l: unknown, what: string): void {
  if (l === undefined) return;
  if (l === null || typeof l !== 'object') throw new InvalidArgumentError(`${what}: lifecycle must be { onTimeout, autoResume? }`);
  const { onTimeout, autoResume, ...rest } = l as Record<string, unknown>;
  for (const k of Object.keys(rest)) throw new InvalidArgumentError(`${what}: unknown lifecycle option '${k}'`);
  const action = typeof onTimeout === 'object' && onTimeout !== null ? (onTimeout as { action?: unknown }).action : onTimeout;
  if (action !== 'kill' && action !== 'pause') {
    throw new InvalidArgumentError(`${what}: lifecycle.onTimeout must be 'kill' or 'pause', not ${JSON.stringify(action)}`);
  }
  if (action === 'pause') {
    throw new InvalidArgumentError(`${what}: lifecycle.onTimeout 'pause' is not supported: tupper kills a sandbox when its timeout is reached`);
  }
  if (autoResume !== undefined && autoResume !== false) {
    throw new InvalidArgumentError(`${what}: lifecycle.autoResume can be true only when onTimeout is 'pause'`);
  }
}

/** A connect's timeoutMs: the new lifetime from now, only if it ends later than the current one (E2B: never shortened). */
async function extendTimeout(c: Connection, r: Record<string, unknown>, timeoutMs: number, what: string): Promise<void> {
  const timeout = seconds(timeoutMs, what);
  // no lifetime (0: until killed) is the longest there is
  if (typeof r.expires_at !== 'string') return;
  const current = Date.parse(r.expires_at);
  if (timeout > 0 && Date.now() + timeoutMs <= current) return;
  await c.call('sandbox.set_timeout', { id: r.id, timeout });
}

/** Bytes of JSON the getHost worker may answer with. */
const EXPOSE_ANSWER_MAX = 16_384;
/** How long getHost waits for its worker thread to start running. */
const EXPOSE_START_MS = 5000;

/**
 * The host:port of a sandbox port, asked for synchronously (E2B's getHost
 * returns a string): a worker thread of this process makes the one request
 * (expose-worker.cts) while this thread waits for its answer: bounded by
 * EXPOSE_START_MS for the thread to run (one that fails to load cannot
 * say so while this thread waits), then by the request timeout and 5 s
 * more.  docs/network.md
 * ("Inbound ports") says why the address is asked for, not computed.
 */
function exposeSync(conn: ConnectionOpts, id: string, port: number): string {
  const shared = new SharedArrayBuffer(HEADER_BYTES + EXPOSE_ANSWER_MAX);
  const head = new Int32Array(shared, 0, 2);
  const job: ExposeJob = { conn, id, port, shared };
  let worker: Worker;
  try {
    worker = new Worker(nodePath.join(__dirname, 'expose-worker.cjs'), { workerData: job });
  } catch (e) {
    throw new SandboxError(`getHost: cannot start its worker thread: ${(e as Error).message}`, { cause: e });
  }
  // told through the buffer or by the bound below; the thread must not
  // keep the process alive, nor its failure crash it
  worker.unref();
  worker.on('error', () => {});
  const timeout = conn.requestTimeoutMs ?? 60_000;
  let state: number;
  try {
    Atomics.wait(head, 0, STATE_NEW, EXPOSE_START_MS);
    state = Atomics.load(head, 0);
    if (state !== STATE_NEW && state !== STATE_ANSWERED) {
      Atomics.wait(head, 0, state, timeout > 0 ? timeout + 5000 : Infinity);
      state = Atomics.load(head, 0);
    }
  } finally {
    void worker.terminate();
  }
  if (state === STATE_NEW) throw new SandboxError(`getHost: its worker thread did not start within ${EXPOSE_START_MS} ms`);
  if (state !== STATE_ANSWERED) throw new SandboxError(`getHost: no answer from the daemon within ${timeout + 5000} ms`);
  const len = Math.min(Math.max(head[1], 0), EXPOSE_ANSWER_MAX);
  let out: { ok?: { host: string; port: number }; err?: { code?: number; data?: unknown; message: string } };
  try {
    out = JSON.parse(Buffer.from(new Uint8Array(shared, HEADER_BYTES, len)).toString('utf8')) as typeof out;
  } catch {
    throw new SandboxError('getHost: the request to the daemon failed');
  }
  if (out.ok) return `${out.ok.host}:${out.ok.port}`;
  const e = out.err ?? { message: 'no answer' };
  if (e.code === undefined) throw new SandboxError(`getHost: ${e.message}`);
  throw fromRpcError({ code: e.code, data: e.data, message: e.message.replace(/^sandbox\.expose: /, '') }, 'sandbox.expose');
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

/** @internal what a Sandbox object lends its modules (the code interpreter's driver runs on it). */
export function linkOf(s: Sandbox): SandboxLink {
  return (s as unknown as { link: SandboxLink }).link;
}

/** @internal true once a Sandbox object's connection closed (the daemon may drop one that falls far behind). */
export function connectionClosed(s: Sandbox): boolean {
  return connectionOf(s)?.closed === true;
}

/** The constructor a static create/connect calls: `this`, so a subclass makes its own kind. */
type SandboxClass = new (conn: Connection, r: Record<string, unknown>) => Sandbox;

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
  private readonly link: SandboxLink;
  /** How to open another connection to the same daemon (after kill, for getHost). */
  private readonly connOpts: ConnectionOpts;
  private readonly hosts = new Map<number, string>();
  private lastCpu?: { at: number; usec: number };

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
    this.connOpts = { socket: conn.socketPath, requestTimeoutMs: conn.requestTimeoutMs };
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
    this.link = link;
    this.commands = new Commands(link);
    this.files = new Filesystem(link);
    this.pty = new Pty(link, this.commands);
  }

  /**
   * Creates a sandbox.  `Sandbox.create()`, `Sandbox.create(opts)` or, as in
   * E2B, `Sandbox.create(template, opts)`: a recipe (a file, one registered
   * with the daemon, a shipped one: 'base' is the Python one), else an image.
   */
  static async create(opts?: SandboxOpts): Promise<Sandbox>;
  static async create(template: string, opts?: SandboxOpts): Promise<Sandbox>;
  static async create(templateOrOpts?: string | SandboxOpts, maybeOpts?: SandboxOpts): Promise<Sandbox> {
    if (typeof templateOrOpts !== 'string' && maybeOpts !== undefined) {
      throw new InvalidArgumentError('Sandbox.create: options come first, or after a template name (a string)');
    }
    checkKeys(typeof templateOrOpts === 'string' ? maybeOpts : templateOrOpts, CREATE_KEYS, 'Sandbox.create');
    const given: SandboxOpts & { template?: string } =
      typeof templateOrOpts === 'string' ? { ...maybeOpts, template: templateOrOpts } : { ...templateOrOpts };
    // E2B's template (the string form or opts.template): a recipe (a file,
    // registered, shipped), else an image (recipe.ts); an explicit image wins
    const { template, ...opts } = given;
    const tpl = template !== undefined && opts.image === undefined ? templateParams(template) : {};
    if (tpl.recipe !== undefined) opts.recipe = tpl.recipe;
    checkLifecycle(opts.lifecycle, 'Sandbox.create');
    const network = networkParam(opts.network, opts.allowInternetAccess, 'Sandbox.create');
    const limits: Record<string, unknown> = { ...opts.limits };
    // a recipe may set the lifetime; only an explicit timeoutMs overrides it
    if (opts.timeoutMs !== undefined || (opts.recipe === undefined && tpl.template === undefined)) {
      limits.timeout = seconds(opts.timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS, 'Sandbox.create');
    }
    const params: Record<string, unknown> = {};
    if (Object.keys(limits).length > 0) params.limits = limits;
    if (opts.recipe !== undefined) params.recipe = await recipeParam(opts.recipe);
    if (opts.image !== undefined) params.image = opts.image;
    if (opts.snapshot !== undefined) params.snapshot = opts.snapshot;
    if (tpl.template !== undefined) params.template = tpl.template;
    if (opts.backend !== undefined) params.backend = opts.backend;
    if (opts.accel !== undefined) params.accel = opts.accel;
    if (opts.envs !== undefined) params.env = opts.envs;
    if (opts.metadata !== undefined) params.metadata = opts.metadata;
    if (opts.cwd !== undefined) params.cwd = opts.cwd;
    if (network !== undefined) params.network = network;
    if (opts.volumeMounts !== undefined) params.volumes = volumeMountsParam(opts.volumeMounts);
    const policy = await policyParam(opts.policy);
    if (policy !== undefined) params.policy = policy;
    const conn = await Connection.open(connectionOpts(opts));
    try {
      // a recipe's first create runs its setup (and may build its image):
      // minutes, not the usual request bound, unless the caller set one
      const long = opts.recipe !== undefined || tpl.template !== undefined;
      const callOpts = long && opts.requestTimeoutMs === undefined ? { timeoutMs: RECIPE_CREATE_TIMEOUT_MS } : {};
      const r = await conn.call<Record<string, unknown>>('sandbox.create', params, callOpts);
      return new (this as unknown as SandboxClass)(conn, r);
    } catch (e) {
      conn.close();
      throw e;
    }
  }

  /**
   * Connects to an existing sandbox (SandboxNotFoundError when there is
   * none); a paused one is resumed, as in E2B.  `timeoutMs` extends its
   * lifetime to that long from now, never shortens it (as E2B).
   */
  static async connect(sandboxId: string, opts: SandboxConnectOpts = {}): Promise<Sandbox> {
    checkKeys(opts, CONNECT_KEYS, 'Sandbox.connect');
    checkOnResume(opts.onResume, 'Sandbox.connect');
    if (opts.timeoutMs !== undefined) checkTimeoutMs(opts.timeoutMs, 'Sandbox.connect');
    const conn = await Connection.open(connectionOpts(opts));
    try {
      const r = await conn.call<Record<string, unknown>>('sandbox.get', { id: sandboxId });
      if (r.state === 'paused') await conn.call('sandbox.resume', { id: sandboxId });
      if (opts.timeoutMs !== undefined) await extendTimeout(conn, r, opts.timeoutMs, 'Sandbox.connect');
      return new (this as unknown as SandboxClass)(conn, r);
    } catch (e) {
      conn.close();
      throw e;
    }
  }

  /** The sandboxes, page by page (E2B's paginator): `await Sandbox.list().nextItems()`. */
  static list(opts?: SandboxListOpts): SandboxPaginator {
    return new SandboxPaginator(opts);
  }

  /** Snapshots a sandbox by id (docs/snapshots.md): its files now, read-only; the sandbox runs on. */
  static async createSnapshot(sandboxId: string, opts: CreateSnapshotOpts = {}): Promise<SnapshotInfo> {
    checkKeys(opts, new Set([...CONNECTION_KEYS, 'name']), 'createSnapshot');
    return withConnection(opts, (c) => snapshotOn(c, sandboxId, opts.name));
  }

  /** The daemon's snapshots (E2B's paginator): `await Sandbox.listSnapshots().nextItems()`. */
  static listSnapshots(opts?: SandboxConnectionOpts): SnapshotPaginator {
    checkKeys(opts, new Set(CONNECTION_KEYS), 'listSnapshots');
    return new SnapshotPaginator(opts);
  }

  /** Deletes a snapshot by id or name: true, or false when there was none; refused while a sandbox uses it. */
  static async deleteSnapshot(snapshotId: string, opts?: SandboxConnectionOpts): Promise<boolean> {
    checkKeys(opts, new Set(CONNECTION_KEYS), 'deleteSnapshot');
    return deleteSnapshotOn(snapshotId, opts);
  }

  /**
   * Forks a running sandbox (by id, or the object): one snapshot, then
   * `count` sandboxes from it, each with its files at that instant, its env,
   * limits, network rules and policy (docs/snapshots.md).  All or nothing:
   * tupper makes every fork or none, so the array holds sandboxes only.
   */
  static async fork(sandbox: string | Sandbox, opts: SandboxForkOpts = {}): Promise<Sandbox[]> {
    checkKeys(opts, new Set([...CONNECTION_KEYS, 'count', 'timeoutMs']), 'Sandbox.fork');
    const count = checkForkCount(opts.count, 'Sandbox.fork');
    if (opts.timeoutMs !== undefined) checkTimeoutMs(opts.timeoutMs, 'Sandbox.fork');
    const id = typeof sandbox === 'string' ? sandbox : sandbox.sandboxId;
    const connOpts = typeof sandbox === 'string' ? opts : { ...sandbox.connOpts, ...opts };
    const r = await withConnection(connOpts, (c) =>
      c.call<{ snapshot: string; sandboxes: Record<string, unknown>[] }>('sandbox.fork', { id, count }));
    const out: Sandbox[] = [];
    try {
      for (const info of r.sandboxes) {
        const conn = await Connection.open(connectionOpts(connOpts));
        const s = new (this as unknown as SandboxClass)(conn, info);
        out.push(s);
        if (opts.timeoutMs !== undefined) await s.setTimeout(opts.timeoutMs);
      }
    } catch (e) {
      for (const s of out) await s.kill().catch(() => undefined);
      throw e;
    }
    return out;
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

  /** E2B's getFullInfo: getInfo (tupper's info is whole already). */
  static async getFullInfo(sandboxId: string, opts?: SandboxConnectionOpts): Promise<SandboxInfo> {
    return Sandbox.getInfo(sandboxId, opts);
  }

  /** getMetrics of a sandbox by id (a paused one stays paused). */
  static async getMetrics(sandboxId: string, opts: SandboxConnectionOpts & SandboxMetricsOpts = {}): Promise<SandboxMetrics[]> {
    const { start, end, ...conn } = opts;
    return Sandbox.attached(sandboxId, conn, (s) => s.getMetrics({ start, end }));
  }

  /** updateNetwork of a sandbox by id. */
  static async updateNetwork(sandboxId: string, network: NetworkRules | SandboxNetworkUpdate, opts?: SandboxConnectionOpts): Promise<void> {
    const rules = checkNetwork(network, 'Sandbox.updateNetwork');
    await withConnection(opts, (c) => c.call('sandbox.update_network', { id: sandboxId, network: rules }));
  }

  /**
   * Pauses a sandbox by id; true once it is paused.  `keepMemory` (E2B's
   * pause option) writes the pause to disk, so that the sandbox survives
   * daemon restarts and host reboots: true keeps the frozen box while the
   * host runs, false keeps its files only (see pause()).
   */
  static async pause(sandboxId: string, opts?: SandboxConnectionOpts & SandboxPauseOpts): Promise<boolean> {
    const keep = pauseKeepMemory(opts, 'Sandbox.pause');
    const { keepMemory: _k, ...conn } = opts ?? {};
    return withConnection(conn, async (c) => (await c.call<{ state: string }>('sandbox.pause', { id: sandboxId, ...keep })).state === 'paused');
  }

  /** E2B's name for Sandbox.pause. */
  static async betaPause(sandboxId: string, opts?: SandboxConnectionOpts & SandboxPauseOpts): Promise<boolean> {
    return Sandbox.pause(sandboxId, opts);
  }

  /** fn on a Sandbox object for sandboxId that does not resume it, its connection closed after. */
  private static async attached<T>(sandboxId: string, opts: SandboxConnectionOpts, fn: (s: Sandbox) => Promise<T>): Promise<T> {
    const conn = await Connection.open(connectionOpts(opts));
    try {
      const r = await conn.call<Record<string, unknown>>('sandbox.get', { id: sandboxId });
      return await fn(new Sandbox(conn, r));
    } finally {
      conn.close();
    }
  }

  /** Sets a sandbox's lifetime from now (0: until killed). */
  static async setTimeout(sandboxId: string, timeoutMs: number, opts?: SandboxConnectionOpts): Promise<void> {
    const timeout = seconds(timeoutMs, 'Sandbox.setTimeout');
    await withConnection(opts, (c) => c.call('sandbox.set_timeout', { id: sandboxId, timeout }));
  }

  /**
   * Connects this object again (E2B's instance connect): resumes the
   * sandbox if paused, extends its lifetime to `timeoutMs` from now if that
   * is later.  SandboxNotFoundError once it is gone.
   */
  async connect(opts: SandboxConnectOpts = {}): Promise<this> {
    checkKeys(opts, CONNECT_KEYS, 'connect');
    checkOnResume(opts.onResume, 'connect');
    if (opts.timeoutMs !== undefined) checkTimeoutMs(opts.timeoutMs, 'connect');
    const r = await this.rpc<Record<string, unknown>>('sandbox.get', { id: this.sandboxId });
    if (r.state === 'paused') await this.rpc('sandbox.resume', { id: this.sandboxId });
    if (opts.timeoutMs !== undefined) {
      await this.withRpc((c) => extendTimeout(c, r, opts.timeoutMs as number, 'connect'));
    }
    return this;
  }

  /** A request on this object's connection, or (once it is closed: after kill) on one of its own. */
  private rpc<T = Record<string, unknown>>(method: string, params: Record<string, unknown>): Promise<T> {
    return this.withRpc((c) => c.call<T>(method, params));
  }

  private withRpc<T>(fn: (c: Connection) => Promise<T>): Promise<T> {
    if (!this.conn.closed) return fn(this.conn);
    return withConnection(this.connOpts, fn);
  }

  /**
   * Kills the sandbox: every process, mount and file of it is gone.  Commands
   * still waited on reject with TimeoutError.  False when it was already gone
   * (also on a second kill of this object, as E2B).
   */
  async kill(): Promise<boolean> {
    if (this.state.killed) return this.rpc<{ killed: boolean }>('sandbox.kill', { id: this.sandboxId }).then((r) => r.killed === true);
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

  /** @internal Closes this object's connection, leaving the sandbox as it is (Volume's file methods). */
  _close(): void {
    this.conn.close();
  }

  /** The sandbox now lives timeoutMs from now (0: until killed). */
  async setTimeout(timeoutMs: number): Promise<void> {
    await this.rpc('sandbox.set_timeout', { id: this.sandboxId, timeout: seconds(timeoutMs, 'setTimeout') });
  }

  async getInfo(): Promise<SandboxInfo> {
    return toInfo(await this.rpc('sandbox.get', { id: this.sandboxId }));
  }

  /**
   * Replaces the network rules as a whole; the next connection and DNS
   * query follow them.  tupper's rules or E2B's `{ allowOut, denyOut }`
   * (an update naming neither list leaves no network, tupper's default).
   */
  async updateNetwork(network: NetworkRules | SandboxNetworkUpdate): Promise<void> {
    const rules = checkNetwork(network, 'updateNetwork');
    await this.rpc('sandbox.update_network', { id: this.sandboxId, network: rules });
  }

  /** The sandbox's recent network decisions, oldest first. */
  async getNetworkLog(): Promise<NetworkLogEntry[]> {
    const r = await this.rpc<{ entries: NetworkLogEntry[] }>('sandbox.network_log', { id: this.sandboxId });
    return r.entries;
  }

  /**
   * "127.0.0.1:PORT": a port on the host's loopback forwarded to `port`
   * inside the sandbox (E2B's getHost gives a public host name).  A string,
   * as E2B's: `` `http://${sbx.getHost(3000)}` ``.  The first call for a
   * port asks the daemon synchronously (a worker thread of this process
   * makes the request while this one waits); later ones return the same
   * host:port.
   */
  getHost(port: number): string {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new InvalidArgumentError(`getHost: bad port ${String(port)}`);
    const known = this.hosts.get(port);
    if (known !== undefined && !this.state.killed) return known;
    const host = exposeSync(this.connOpts, this.sandboxId, port);
    this.hosts.set(port, host);
    return host;
  }

  /**
   * tupper's asynchronous getHost: the same "127.0.0.1:PORT", asked for on
   * this object's own connection instead of a worker thread, so a
   * server (the MCP and HTTP ones, an adapter) never blocks its event loop.
   */
  async getHostAsync(port: number): Promise<string> {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new InvalidArgumentError(`getHost: bad port ${String(port)}`);
    const known = this.hosts.get(port);
    if (known !== undefined && !this.state.killed) return known;
    const r = await this.rpc<{ host: string; port: number }>('sandbox.expose', { id: this.sandboxId, port });
    const host = `${r.host}:${r.port}`;
    this.hosts.set(port, host);
    return host;
  }

  /** True while the sandbox exists and is not paused; false once it is gone (killed here or elsewhere). */
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
   * it is paused.  Without options nothing is written: a reboot loses the
   * paused box.  `keepMemory` (E2B's option) also writes the pause to disk
   * (a snapshot of its files), so that the sandbox survives daemon restarts
   * and host reboots, listed as paused: true keeps the frozen box while the
   * host runs (resume() thaws its processes), false removes it now.  Once
   * the box is gone, resume() and Sandbox.connect() start a new box of the
   * same id with its files, without its processes (docs/snapshots.md).
   */
  async pause(opts?: SandboxPauseOpts): Promise<boolean> {
    const keep = pauseKeepMemory(opts, 'pause');
    const r = await this.rpc<{ state: string }>('sandbox.pause', { id: this.sandboxId, ...keep });
    return r.state === 'paused';
  }

  /** Snapshots this sandbox (E2B's): its files now, read-only; it runs on. */
  async createSnapshot(opts: CreateSnapshotOpts = {}): Promise<SnapshotInfo> {
    checkKeys(opts, new Set([...CONNECTION_KEYS, 'name']), 'createSnapshot');
    return snapshotOn(this.conn, this.sandboxId, opts.name);
  }

  /** Forks this sandbox (E2B's): `count` copies of it as it is now; see Sandbox.fork. */
  async fork(opts: SandboxForkOpts = {}): Promise<Sandbox[]> {
    return (this.constructor as typeof Sandbox).fork(this, opts);
  }

  /** E2B's name for pause(). */
  async betaPause(opts?: SandboxPauseOpts): Promise<boolean> {
    return this.pause(opts);
  }

  /** Thaws a paused sandbox; its lifetime runs on.  True once it is running. */
  async resume(): Promise<boolean> {
    const r = await this.rpc<{ state: string }>('sandbox.resume', { id: this.sandboxId });
    return r.state === 'running';
  }

  /**
   * The sandbox's counters over time, with E2B's fields, oldest first: the
   * daemon's samples (one every 5 s while it runs, the last hour) within
   * `{start, end}` (default: all it kept), then one taken now when the
   * window holds now.  cpuUsedPct is over the time since the sample before
   * (the first call on a sandbox without samples measures 100 ms);
   * cpuCount and memTotal are the limits, else the host's; diskUsed and
   * diskTotal come from `df` of the box's `/` now, the same in every sample
   * (tupper does not sample the disk).
   */
  async getMetrics(opts: SandboxMetricsOpts = {}): Promise<SandboxMetrics[]> {
    checkKeys(opts, new Set([...CONNECTION_KEYS, 'start', 'end']), 'getMetrics');
    if (opts.start !== undefined && !(opts.start instanceof Date)) throw new InvalidArgumentError('getMetrics: start must be a Date');
    if (opts.end !== undefined && !(opts.end instanceof Date)) throw new InvalidArgumentError('getMetrics: end must be a Date');
    const from = opts.start?.getTime() ?? -Infinity;
    const to = opts.end?.getTime() ?? Infinity;
    type Raw = Record<string, number | undefined> & { samples?: Array<Record<string, number>> };
    const sample = () => this.rpc<Raw>('sandbox.metrics', { id: this.sandboxId, series: true });
    const info = await this.getInfo();
    let m = await sample();
    let at = Date.now();
    const series = (m.samples ?? []).map((x) => ({ at: Math.round(x.time * 1000), usec: x.cpu_usage_usec ?? 0, raw: x }));
    // a sample of now only where now is in the window: an `end` in the past
    // (even by a millisecond) is answered from the daemon's series alone
    const withNow = at >= from && at <= to;
    // the later of the daemon's last sample and this object's last call
    const last = series.length > 0 ? series[series.length - 1] : undefined;
    let prev = last && (!this.lastCpu || last.at > this.lastCpu.at) ? last : this.lastCpu;
    if (withNow && prev === undefined) {
      this.lastCpu = { at, usec: m.cpu_usage_usec ?? 0 };
      await new Promise((r) => setTimeout(r, 100));
      prev = this.lastCpu;
      m = await sample();
      at = Date.now();
    }
    const cpuCount = info.limits.cpus !== undefined ? Math.max(1, Math.ceil(info.limits.cpus)) : os.cpus().length;
    const cores = info.limits.cpus ?? cpuCount;
    const pct = (a: { at: number; usec: number } | undefined, b: { at: number; usec: number }) => {
      if (a === undefined || b.at <= a.at) return 0;
      const used = Math.max(0, b.usec - a.usec) / ((b.at - a.at) * 1000) / cores;
      return Math.min(100, Math.round(used * 10000) / 100);
    };
    const disk = info.state === 'running' ? await this.diskUsage() : undefined;
    const fill = (s: SandboxMetrics, cpuUsedPct: number): SandboxMetrics => {
      s.cpuUsedPct = cpuUsedPct;
      s.cpuCount = cpuCount;
      s.memTotal = info.limits.memory ?? os.totalmem();
      s.diskUsed = disk?.used ?? 0;
      s.diskTotal = info.limits.disk ?? disk?.total ?? 0;
      return s;
    };
    const out: SandboxMetrics[] = [];
    series.forEach((x, i) => {
      if (x.at < from || x.at > to) return;
      const s = toMetrics({ memory_bytes: x.raw.memory_bytes, cpu_usage_usec: x.raw.cpu_usage_usec, pids: x.raw.pids }, info);
      s.timestamp = new Date(x.at);
      out.push(fill(s, pct(series[i - 1], x)));
    });
    if (withNow) {
      const cur = { at, usec: m.cpu_usage_usec ?? 0 };
      out.push(fill(toMetrics(m, info), pct(prev, cur)));
      this.lastCpu = cur;
    }
    return out;
  }

  /** Bytes used and total of the box's `/`, from `df -Pk /` run in it as root. */
  private async diskUsage(): Promise<{ used: number; total: number } | undefined> {
    try {
      const r = await this.commands.run('df -Pk /', { user: 'root', cwd: '/', timeoutMs: 10_000 });
      const line = r.stdout.trim().split('\n').pop() ?? '';
      const f = line.split(/\s+/);
      const total = Number(f[1]) * 1024;
      const used = Number(f[2]) * 1024;
      if (!Number.isFinite(total) || !Number.isFinite(used)) return undefined;
      return { used, total };
    } catch {
      return undefined;
    }
  }
}
