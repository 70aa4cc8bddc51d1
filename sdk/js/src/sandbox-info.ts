/**
 * What the daemon says about a sandbox (sandbox.get, sandbox.list,
 * sandbox.metrics), in the SDK's (E2B's) words.
 */

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
  /** E2B's: the volumes it mounts, `{name, path}` (docs/volumes.md). */
  volumeMounts?: Array<{ name: string; path: string }>;
  /** E2B's: true when it may reach every public address (`network: "all"`), false with no network, else absent. */
  allowInternetAccess?: boolean;
  /** E2B's shape of its rules: allow rules as `allowOut`, and `denyOut` `[ALL_TRAFFIC, ...deny rules]` (tupper allows nothing else). */
  network?: { allowOut: string[]; denyOut: string[] };
  /** E2B's: tupper kills a sandbox when its lifetime ends. */
  lifecycle: { onTimeout: 'kill'; autoResume: false };
}

/** getMetrics' window (E2B's): tupper keeps no series, so only a window holding now has a sample. */
export interface SandboxMetricsOpts {
  start?: Date;
  end?: Date;
  requestTimeoutMs?: number;
}

/** One sample of the sandbox's counters, from its cgroup: E2B's fields, then tupper's. */
export interface SandboxMetrics {
  timestamp: Date;
  /** CPU used since the previous sample, percent of the cores it may use. */
  cpuUsedPct: number;
  /** Cores it may use: its CPU limit rounded up, else the host's count. */
  cpuCount: number;
  /** Memory in use, bytes. */
  memUsed: number;
  /** Its memory limit in bytes, else the host's memory. */
  memTotal: number;
  /** Page cache in bytes: tupper does not split it out of memUsed (0). */
  memCache: number;
  /** Bytes used on the box's `/`. */
  diskUsed: number;
  /** Its disk limit in bytes, else the size of the filesystem under the box's `/`. */
  diskTotal: number;
  /** Total CPU time used, microseconds. */
  cpuUsageUsec: number;
  memoryPeak?: number;
  pids: number;
  nrThrottled?: number;
  throttledUsec?: number;
  oomKills?: number;
}

/** A sandbox.get or sandbox.list entry as a SandboxInfo. */
export function toInfo(r: Record<string, unknown>): SandboxInfo {
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
    lifecycle: { onTimeout: 'kill', autoResume: false },
  };
  const n = r.network;
  if (n === 'all') {
    info.allowInternetAccess = true;
    info.network = { allowOut: ['0.0.0.0/0'], denyOut: [] };
  } else if (n === 'none') {
    info.allowInternetAccess = false;
    info.network = { allowOut: [], denyOut: ['0.0.0.0/0'] };
  } else if (n !== null && typeof n === 'object') {
    const list = (v: unknown) => (Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : []);
    const rules = n as { allow?: unknown; deny?: unknown };
    info.network = { allowOut: list(rules.allow), denyOut: ['0.0.0.0/0', ...list(rules.deny)] };
  }
  if (typeof r.expires_at === 'string') info.endAt = new Date(r.expires_at);
  if (typeof limits.cpus === 'number') info.cpuCount = limits.cpus;
  if (typeof limits.memory === 'number') info.memoryMB = limits.memory / (1 << 20);
  if (typeof r.processes === 'number') info.processes = r.processes;
  if (r.recipe && typeof r.recipe === 'object') info.recipe = r.recipe as SandboxInfo['recipe'];
  if (typeof r.default_user === 'string') info.defaultUser = r.default_user;
  if (typeof r.home === 'string') info.home = r.home;
  if (typeof r.workdir === 'string') info.workdir = r.workdir;
  if (r.volumes && typeof r.volumes === 'object' && !Array.isArray(r.volumes)) {
    info.volumeMounts = Object.entries(r.volumes as Record<string, unknown>)
      .filter(([, name]) => typeof name === 'string')
      .map(([path, name]) => ({ name: name as string, path }))
      .sort((a, b) => a.path.localeCompare(b.path));
  }
  return info;
}

/** A sandbox.metrics reply (and the limits of its SandboxInfo) as a SandboxMetrics sample taken now. */
export function toMetrics(m: Record<string, number | undefined>, info: SandboxInfo): SandboxMetrics {
  const s: SandboxMetrics = {
    timestamp: new Date(),
    cpuUsedPct: 0,
    cpuCount: info.limits.cpus ?? 0,
    memTotal: info.limits.memory ?? 0,
    memCache: 0,
    diskUsed: 0,
    diskTotal: info.limits.disk ?? 0,
    memUsed: m.memory_bytes ?? 0,
    cpuUsageUsec: m.cpu_usage_usec ?? 0,
    pids: m.pids ?? 0,
  };
  if (m.memory_peak !== undefined) s.memoryPeak = m.memory_peak;
  if (m.nr_throttled !== undefined) s.nrThrottled = m.nr_throttled;
  if (m.throttled_usec !== undefined) s.throttledUsec = m.throttled_usec;
  if (m.oom_kills !== undefined) s.oomKills = m.oom_kills;
  return s;
}
