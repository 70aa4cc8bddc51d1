/**
 * Volumes, with E2B's names: named persistent filesystems kept by the
 * daemon (docs/volumes.md), mounted at create with
 * `Sandbox.create({ volumeMounts: { '/mnt/data': vol } })`.
 *
 * The file methods work without a sandbox of the caller's: they run in a
 * short-lived box that mounts the volume at /volume (killed after), or,
 * while a sandbox mounts the volume, in that sandbox under its mount point.
 * The daemon never walks a volume's content on the host.
 */

import { withConnection, type ConnectionOpts } from './connection';
import { InvalidArgumentError, NotFoundError, RateLimitError, SandboxError } from './errors';
import type { EntryInfo } from './entry';
import { Sandbox } from './sandbox';
import type { SandboxConnectionOpts } from './sandbox-opts';

/** Kinds of entries of a volume, as E2B's VolumeFileType. */
export enum VolumeFileType {
  UNKNOWN = 'unknown',
  FILE = 'file',
  DIRECTORY = 'directory',
  SYMLINK = 'symlink',
}

/** A volume, as `Volume.list` describes it (E2B's VolumeInfo). */
export interface VolumeInfo {
  volumeId: string;
  name: string;
  /** Its capacity in bytes (tupper's). */
  size: number;
  /** When it was made (tupper's). */
  createdAt: Date;
  /** The sandboxes that mount it now, and where (tupper's). */
  mountedBy: { sandboxId: string; path: string }[];
}

/** E2B's VolumeAndToken: a local daemon needs no token, so it is ''. */
export interface VolumeAndToken extends VolumeInfo {
  token: string;
  domain?: string;
}

/** An entry of a volume, as E2B's VolumeEntryStat. */
export interface VolumeEntryStat {
  name: string;
  /** Its path in the volume, from its root ('/dir/file'). */
  path: string;
  type: VolumeFileType;
  size: number;
  mode: number;
  uid: number;
  gid: number;
  atime: Date;
  mtime: Date;
  ctime: Date;
  target?: string;
}

/** uid, gid and mode of an entry (E2B's VolumeMetadataOpts). */
export interface VolumeMetadataOpts {
  uid?: number;
  gid?: number;
  mode?: number;
}

/** E2B's VolumeWriteOpts: metadata, and for makeDir, whether to make parents (force). */
export interface VolumeWriteOpts extends VolumeMetadataOpts {
  force?: boolean;
}

/** Options of Volume.create: the connection's, and the size (tupper's: bytes or '256M'; default 1 GiB). */
export interface VolumeCreateOpts extends SandboxConnectionOpts {
  size?: number | string;
}

type Wire = { name: string; id: string; size: number; created_at: string; mounted_by?: { sandbox: string; path: string }[] };

const HELPER_MOUNT = '/volume';
const HELPER_TIMEOUT_MS = 5 * 60_000;

function conn(opts?: SandboxConnectionOpts): ConnectionOpts {
  const c: ConnectionOpts = {};
  if (opts?.socket !== undefined) c.socket = opts.socket;
  if (opts?.requestTimeoutMs !== undefined) c.requestTimeoutMs = opts.requestTimeoutMs;
  return c;
}

function toInfo(r: Wire): VolumeInfo {
  return {
    volumeId: r.id,
    name: r.name,
    size: r.size,
    createdAt: new Date(r.created_at),
    mountedBy: (Array.isArray(r.mounted_by) ? r.mounted_by : []).map((m) => ({ sandboxId: m.sandbox, path: m.path })),
  };
}

/** A path of the volume, from its root: '..' may not leave it. */
function volumePath(path: string, what: string): string {
  if (typeof path !== 'string') throw new InvalidArgumentError(`${what}: path must be a string`);
  if (path.includes('\0')) throw new InvalidArgumentError(`${what}: path contains a NUL byte`);
  const parts: string[] = [];
  for (const p of path.split('/')) {
    if (p === '' || p === '.') continue;
    if (p === '..') throw new InvalidArgumentError(`${what}: path '${path}' has a '..' component (a volume's paths stay inside it)`);
    parts.push(p);
  }
  return '/' + parts.join('/');
}

function join(root: string, rel: string): string {
  return rel === '/' ? root : root + rel;
}

function shq(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

function toStat(e: EntryInfo, root: string): VolumeEntryStat {
  const type =
    e.type === 'file' ? VolumeFileType.FILE : e.type === 'dir' ? VolumeFileType.DIRECTORY : e.type === 'symlink' ? VolumeFileType.SYMLINK : VolumeFileType.UNKNOWN;
  const rel = e.path === root ? '/' : e.path.startsWith(root + '/') ? e.path.slice(root.length) : e.path;
  const out: VolumeEntryStat = {
    name: e.name,
    path: rel,
    type,
    size: e.size,
    mode: e.mode,
    uid: e.uid ?? 0,
    gid: e.gid ?? 0,
    atime: e.modifiedTime,
    mtime: e.modifiedTime,
    ctime: e.modifiedTime,
  };
  if (e.symlinkTarget !== undefined) out.target = e.symlinkTarget;
  return out;
}

/** One file operation at a time per volume in this process (each may need the volume's only mount). */
const queues = new Map<string, Promise<unknown>>();

/** A volume of the daemon; `Volume.create` or `Volume.connect` make one. */
export class Volume {
  readonly volumeId: string;
  readonly name: string;
  /** E2B's auth token: a local daemon needs none (''). */
  readonly token: string;
  readonly domain?: string;
  readonly debug?: boolean;
  readonly proxy?: string;
  private connOpts: ConnectionOpts = {};

  /** A Volume object with no call to the daemon (E2B's constructor). */
  constructor(volumeId: string, name: string, token = '', domain?: string, debug?: boolean, proxy?: string) {
    this.volumeId = volumeId;
    this.name = name;
    this.token = token;
    if (domain !== undefined) this.domain = domain;
    if (debug !== undefined) this.debug = debug;
    if (proxy !== undefined) this.proxy = proxy;
  }

  private static from(r: Wire, opts?: SandboxConnectionOpts): Volume {
    const v = new Volume(r.id, r.name);
    v.connOpts = conn(opts);
    return v;
  }

  /** Makes a volume named name (1-63 letters, digits, '.', '_', '-'); `size` is tupper's (default 1 GiB). */
  static async create(name: string, opts: VolumeCreateOpts = {}): Promise<Volume> {
    if (typeof name !== 'string' || name === '') throw new InvalidArgumentError('Volume.create: name must be a non-empty string');
    const params: Record<string, unknown> = { name };
    if (opts.size !== undefined) params.size = opts.size;
    const r = await withConnection(conn(opts), (c) => c.call<Wire>('volume.create', params));
    return Volume.from(r, opts);
  }

  /** A Volume object for an existing volume, by id or name (NotFoundError when there is none). */
  static async connect(volumeId: string, opts?: SandboxConnectionOpts): Promise<Volume> {
    const r = await withConnection(conn(opts), (c) => c.call<Wire>('volume.get', { name: volumeId }));
    return Volume.from(r, opts);
  }

  /** Describes a volume by id or name. */
  static async getInfo(volumeId: string, opts?: SandboxConnectionOpts): Promise<VolumeAndToken> {
    const r = await withConnection(conn(opts), (c) => c.call<Wire>('volume.get', { name: volumeId }));
    return { ...toInfo(r), token: '' };
  }

  /** Every volume of the daemon, by name. */
  static async list(opts?: SandboxConnectionOpts): Promise<VolumeInfo[]> {
    const r = await withConnection(conn(opts), (c) => c.call<{ volumes: Wire[] }>('volume.list', {}));
    return r.volumes.map(toInfo);
  }

  /**
   * Removes a volume and its data: true, or false when there was none.
   * Refused (RateLimitError, naming the sandbox) while a sandbox mounts it.
   */
  static async destroy(volumeId: string, opts?: SandboxConnectionOpts): Promise<boolean> {
    try {
      await withConnection(conn(opts), (c) => c.call('volume.destroy', { name: volumeId }));
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** Runs fn in a box where the volume is mounted, at root (serialised per volume in this process). */
  private async inBox<T>(what: string, fn: (sbx: Sandbox, root: string) => Promise<T>): Promise<T> {
    const prev = queues.get(this.name) ?? Promise.resolve();
    const run = prev.catch(() => undefined).then(() => this.inBoxNow(what, fn));
    queues.set(this.name, run);
    try {
      return await run;
    } finally {
      if (queues.get(this.name) === run) queues.delete(this.name);
    }
  }

  private async inBoxNow<T>(what: string, fn: (sbx: Sandbox, root: string) => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      const info = await Volume.getInfo(this.volumeId, this.connOpts);
      const m = info.mountedBy[0];
      if (m !== undefined) {
        // a sandbox mounts it: work there, under its mount point
        let sbx: Sandbox | undefined;
        try {
          sbx = await Sandbox.connect(m.sandboxId, this.connOpts);
        } catch (e) {
          if (attempt < 20 && e instanceof NotFoundError) {
            await new Promise((r) => setTimeout(r, 100));
            continue;
          }
          throw e;
        }
        try {
          return await fn(sbx, m.path);
        } finally {
          sbx._close();
        }
      }
      let sbx: Sandbox;
      try {
        sbx = await Sandbox.create({
          ...this.connOpts,
          volumeMounts: { [HELPER_MOUNT]: this.name },
          timeoutMs: HELPER_TIMEOUT_MS,
          metadata: { 'tupper.volume': this.name },
        });
      } catch (e) {
        // another client's box took it meanwhile: look again
        if (attempt < 20 && e instanceof RateLimitError) {
          await new Promise((r) => setTimeout(r, 100));
          continue;
        }
        throw e instanceof SandboxError ? e : new SandboxError(`${what}: ${String(e)}`, { cause: e });
      }
      try {
        return await fn(sbx, HELPER_MOUNT);
      } finally {
        await sbx.kill().catch(() => undefined);
      }
    }
  }

  /** Lists a directory of the volume (depth: levels to go down, default 1). */
  async list(path: string, opts: { depth?: number } = {}): Promise<VolumeEntryStat[]> {
    const rel = volumePath(path, 'volume.list');
    return this.inBox('volume.list', async (sbx, root) => {
      const entries = await sbx.files.list(join(root, rel), { user: 'root', depth: opts.depth ?? 1 });
      return entries.map((e) => toStat(e, root));
    });
  }

  /** Makes a directory (force: its parents too); uid, gid and mode set after. */
  async makeDir(path: string, opts: VolumeWriteOpts = {}): Promise<VolumeEntryStat> {
    const rel = volumePath(path, 'volume.makeDir');
    if (rel === '/') throw new InvalidArgumentError('volume.makeDir: path is the volume\'s root');
    return this.inBox('volume.makeDir', async (sbx, root) => {
      const p = join(root, rel);
      if (!opts.force) {
        const parent = p.slice(0, p.lastIndexOf('/')) || '/';
        if (!(await sbx.files.exists(parent, { user: 'root' }))) {
          throw new NotFoundError(`volume.makeDir: no directory '${rel.slice(0, rel.lastIndexOf('/')) || '/'}' (force makes parents)`);
        }
      }
      const user = await actingAs(sbx, opts, 'volume.makeDir');
      await sbx.files.makeDir(p, { user });
      await setMode(sbx, p, opts.mode, user);
      return toStat(await sbx.files.getInfo(p, { user: 'root' }), root);
    });
  }

  /** Describes an entry (NotFoundError when there is none). */
  async getInfo(path: string): Promise<VolumeEntryStat> {
    const rel = volumePath(path, 'volume.getInfo');
    return this.inBox('volume.getInfo', async (sbx, root) => toStat(await sbx.files.getInfo(join(root, rel), { user: 'root' }), root));
  }

  /** Whether an entry exists. */
  async exists(path: string): Promise<boolean> {
    const rel = volumePath(path, 'volume.exists');
    return this.inBox('volume.exists', (sbx, root) => sbx.files.exists(join(root, rel), { user: 'root' }));
  }

  /** Sets an entry's uid, gid and/or mode. */
  async updateMetadata(path: string, metadata: VolumeMetadataOpts): Promise<VolumeEntryStat> {
    const rel = volumePath(path, 'volume.updateMetadata');
    return this.inBox('volume.updateMetadata', async (sbx, root) => {
      const p = join(root, rel);
      const cur = await sbx.files.getInfo(p, { user: 'root' }); // NotFoundError first
      if ((metadata.uid !== undefined && metadata.uid !== cur.uid) || (metadata.gid !== undefined && metadata.gid !== cur.gid)) {
        throw new InvalidArgumentError(
          `volume.updateMetadata: cannot change the owner of '${rel}': a box's root has no CAP_CHOWN in tupper; a file belongs to the account that wrote it (writeFile's uid picks that account)`,
        );
      }
      await setMode(sbx, p, metadata.mode, cur.owner);
      return toStat(await sbx.files.getInfo(p, { user: 'root' }), root);
    });
  }

  /** Reads a file: text (the default), bytes, a Blob or a stream (read whole first here). */
  readFile(path: string, opts?: { format?: 'text' }): Promise<string>;
  readFile(path: string, opts: { format: 'bytes' }): Promise<Uint8Array>;
  readFile(path: string, opts: { format: 'blob' }): Promise<Blob>;
  readFile(path: string, opts: { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  async readFile(path: string, opts: { format?: 'text' | 'bytes' | 'blob' | 'stream' } = {}): Promise<unknown> {
    const rel = volumePath(path, 'volume.readFile');
    const format = opts.format ?? 'text';
    const bytes = await this.inBox('volume.readFile', (sbx, root) => sbx.files.read(join(root, rel), { user: 'root', format: 'bytes' }));
    if (format === 'text') return Buffer.from(bytes).toString('utf8');
    if (format === 'bytes') return bytes;
    if (format === 'blob') return new Blob([bytes]);
    if (format === 'stream') {
      return new ReadableStream<Uint8Array>({
        start(ctrl) {
          if (bytes.length > 0) ctrl.enqueue(bytes);
          ctrl.close();
        },
      });
    }
    throw new InvalidArgumentError(`volume.readFile: format ${String(format)} is not supported (text, bytes, blob, stream)`);
  }

  /** Writes a file (its parents made); an existing file is overwritten. uid, gid and mode set after. */
  async writeFile(path: string, data: string | ArrayBuffer | Blob | ReadableStream<Uint8Array>, opts: VolumeWriteOpts = {}): Promise<VolumeEntryStat> {
    const rel = volumePath(path, 'volume.writeFile');
    if (rel === '/') throw new InvalidArgumentError('volume.writeFile: path is the volume\'s root');
    return this.inBox('volume.writeFile', async (sbx, root) => {
      const p = join(root, rel);
      const user = await actingAs(sbx, opts, 'volume.writeFile');
      await sbx.files.write(p, data, { user });
      await setMode(sbx, p, opts.mode, user);
      return toStat(await sbx.files.getInfo(p, { user: 'root' }), root);
    });
  }

  /** Removes a file or a directory (with what is in it). */
  async remove(path: string): Promise<void> {
    const rel = volumePath(path, 'volume.remove');
    if (rel === '/') throw new InvalidArgumentError('volume.remove: path is the volume\'s root');
    await this.inBox('volume.remove', (sbx, root) => sbx.files.remove(join(root, rel), { user: 'root' }));
  }
}

/**
 * The account a write acts as: root, or for a uid (and gid) the box's
 * account of that uid, whose file it then is (a box's root cannot chown:
 * it has no capabilities in tupper).
 */
async function actingAs(sbx: Sandbox, m: VolumeMetadataOpts, what: string): Promise<string> {
  for (const [k, v] of [['uid', m.uid], ['gid', m.gid]] as const) {
    if (v !== undefined && (!Number.isInteger(v) || v < 0 || v > 0xfffffffe)) throw new InvalidArgumentError(`${what}: ${k} must be a whole number in range`);
  }
  if (m.uid === undefined && m.gid === undefined) return 'root';
  const uid = m.uid ?? 0;
  const passwd = await sbx.files.read('/etc/passwd', { user: 'root' });
  for (const line of passwd.split('\n')) {
    const f = line.split(':');
    if (f.length >= 4 && Number(f[2]) === uid && (m.gid === undefined || Number(f[3]) === m.gid)) return f[0];
  }
  throw new InvalidArgumentError(
    `${what}: no account of the box has uid ${uid}${m.gid !== undefined ? ` and gid ${m.gid}` : ''}: a file belongs to the account that writes it (a box's root cannot chown)`,
  );
}

/** chmod of p in the box as its owner (root may not: no CAP_FOWNER), when mode is given. */
async function setMode(sbx: Sandbox, p: string, mode: number | undefined, owner: string): Promise<void> {
  if (mode === undefined) return;
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) throw new InvalidArgumentError('volume: mode must be a whole number in 0..0o7777');
  try {
    await sbx.commands.run(`chmod ${mode.toString(8)} ${shq(p)}`, { user: owner });
  } catch (e) {
    throw new SandboxError(`volume: chmod of ${p} as ${owner} failed: ${(e as { stderr?: string }).stderr?.trim() ?? String(e)}`, { cause: e });
  }
}
