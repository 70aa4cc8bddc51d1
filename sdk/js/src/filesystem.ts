/**
 * sbx.files: the sandbox's filesystem, as E2B's Filesystem module.  Bytes
 * travel base64-encoded in chunks of at most 1 MiB (fs.read / fs.write with
 * offsets).  Every call acts as an account of the box, as E2B: `opts.user`,
 * else the sandbox's default account (`user` on an image with that account,
 * else the image's User, else root); the kernel checks that account's
 * permissions, and what it creates is its own.  Relative paths are taken
 * from that account's home (`/home/user`; `/` for the root fallback).
 */
import { ReadableStream } from 'node:stream/web';
import { actingAs, fromHome, type SandboxLink } from './commands';
import { InvalidArgumentError, SandboxError, TimeoutError } from './errors';

/** Most raw bytes in one fs.read or fs.write. */
export const CHUNK = 1 << 20;

/** Kinds of entries, as E2B's FileType (plus what a Linux box also has). */
export const FileType = {
  FILE: 'file',
  DIR: 'dir',
  SYMLINK: 'symlink',
  OTHER: 'other',
} as const;
export type FileType = (typeof FileType)[keyof typeof FileType];

/** What `write` returns for each file written. */
export interface WriteInfo {
  name: string;
  type?: FileType;
  path: string;
}

/** A file or directory, as `list` and `getInfo` describe it. */
export interface EntryInfo extends WriteInfo {
  type: FileType;
  size: number;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  /** `ls -l` style, e.g. "-rw-r--r--". */
  permissions: string;
  modifiedTime: Date;
  /** Target of a symlink. */
  symlinkTarget?: string;
  /** Owner and group as seen inside the box (getInfo only). */
  uid?: number;
  gid?: number;
}

/** A stream of bytes to write: a web ReadableStream or any async iterable of chunks (a Node Readable). */
export type ByteStream = ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>;

export interface WriteEntry {
  path: string;
  data: string | ArrayBuffer | Uint8Array | Blob | ByteStream;
}

export type ReadFormat = 'text' | 'bytes' | 'blob' | 'stream';

/** What watchDir reports, as E2B's FilesystemEventType (plus tupper's OVERFLOW). */
export const FilesystemEventType = {
  CHMOD: 'chmod',
  CREATE: 'create',
  REMOVE: 'remove',
  RENAME: 'rename',
  WRITE: 'write',
  /** Events were lost, or a new directory could not be watched (tupper's own). */
  OVERFLOW: 'overflow',
} as const;
export type FilesystemEventType = (typeof FilesystemEventType)[keyof typeof FilesystemEventType];

export interface FilesystemEvent {
  /** The path relative to the watched directory. */
  name: string;
  type: FilesystemEventType;
  /** Why, for an OVERFLOW. */
  message?: string;
}

export interface WatchOpts {
  /** Also every subdirectory, and each new one as it appears. Default false. */
  recursive?: boolean;
  /** Stop watching after this long (onExit gets a TimeoutError); 0 = never. Default 60000, as E2B. */
  timeoutMs?: number;
  /** Called once when the watch ends: no argument after stop(), an error otherwise. */
  onExit?: (err?: Error) => void | Promise<void>;
  /** The account it watches as (default: the sandbox's default account); see FilesystemRequestOpts. */
  user?: string;
  requestTimeoutMs?: number;
}

/** Default duration of a watch, as E2B: 60 s. */
export const DEFAULT_WATCH_TIMEOUT_MS = 60_000;

/** A directory being watched (files.watchDir). */
export class WatchHandle {
  private readonly link: SandboxLink;
  /** The daemon's id of this watch. */
  readonly watchId: number;
  private readonly onExit?: (err?: Error) => void | Promise<void>;
  private readonly forget: (h: WatchHandle) => void;
  private ended = false;
  private timer?: NodeJS.Timeout;
  private dropClose: () => void = () => {};

  /** @internal */
  constructor(
    link: SandboxLink,
    watchId: number,
    onEvent: (e: FilesystemEvent) => void | Promise<void>,
    opts: WatchOpts,
    forget: (h: WatchHandle) => void,
  ) {
    this.link = link;
    this.watchId = watchId;
    this.forget = forget;
    this.onExit = opts.onExit;
    link.conn.hold();
    link.conn.subscribeWatch(link.sandboxId, watchId, (_method, p) => {
      if (this.ended) return;
      const type = String(p.type);
      if (type === 'end') {
        this.finish(new SandboxError(`watch ${watchId}: ${typeof p.message === 'string' ? p.message : 'ended'}`));
        return;
      }
      const e: FilesystemEvent = { name: String(p.name ?? ''), type: type as FilesystemEventType };
      if (typeof p.message === 'string') e.message = p.message;
      void Promise.resolve(onEvent(e)).catch(() => {});
    });
    this.dropClose = link.conn.onClose((e) => this.finish(new SandboxError(`watch ${watchId}: ${e.message}`, { cause: e })));
    const timeoutMs = opts.timeoutMs ?? DEFAULT_WATCH_TIMEOUT_MS;
    if (timeoutMs > 0) {
      this.timer = setTimeout(() => {
        void this.stopWith(new TimeoutError(`watch ${watchId} ran for its timeoutMs (${timeoutMs} ms)`));
      }, timeoutMs);
    }
  }

  /** @internal the sandbox was killed */
  _sandboxGone(why: string): void {
    this.finish(new SandboxError(`watch ${this.watchId}: the sandbox is gone (${why})`));
  }

  /** Stops watching; no event comes after it resolves. */
  async stop(): Promise<void> {
    await this.stopWith(undefined);
  }

  private async stopWith(err: Error | undefined): Promise<void> {
    if (this.ended) return;
    this.finish(err);
    try {
      await this.link.conn.call('fs.unwatch', { sandbox: this.link.sandboxId, watch: this.watchId });
    } catch {
      // the watch or the sandbox ended meanwhile: nothing left to stop
    }
  }

  private finish(err: Error | undefined): void {
    if (this.ended) return;
    this.ended = true;
    this.forget(this);
    if (this.timer) clearTimeout(this.timer);
    this.link.conn.unsubscribeWatch(this.link.sandboxId, this.watchId);
    this.dropClose();
    this.link.conn.release();
    if (this.onExit) void Promise.resolve(this.onExit(err)).catch(() => {});
  }
}

export interface FilesystemRequestOpts {
  /**
   * The account of the box's /etc/passwd the operation acts as, as E2B's
   * `user` (e.g. `'root'`).  Default: the sandbox's default account
   * (`sbx.defaultUser`).  Relative paths are taken from its home.  An
   * unknown account rejects with NotFoundError; what the box's permissions
   * refuse that account rejects with PermissionError (EACCES, EPERM).
   */
  user?: string;
  /** Accepted for E2B compatibility; requests are bounded by the sandbox's requestTimeoutMs. */
  requestTimeoutMs?: number;
}

function permissions(type: string, mode: number): string {
  const kind = type === 'dir' ? 'd' : type === 'symlink' ? 'l' : type === 'file' ? '-' : '?';
  const rwx = ['r', 'w', 'x'];
  let s = kind;
  for (let i = 8; i >= 0; i--) s += mode & (1 << i) ? rwx[(8 - i) % 3] : '-';
  return s;
}

function basename(p: string): string {
  const parts = p.split('/').filter((x) => x !== '');
  return parts.length ? parts[parts.length - 1] : '/';
}

function toEntry(r: Record<string, unknown>): EntryInfo {
  const type = (typeof r.type === 'string' ? r.type : 'other') as FileType;
  const mode = typeof r.mode === 'number' ? r.mode & 0o7777 : 0;
  const e: EntryInfo = {
    name: String(r.name ?? basename(String(r.path ?? ''))),
    type,
    path: String(r.path ?? ''),
    size: typeof r.size === 'number' ? r.size : 0,
    mode,
    permissions: permissions(type, mode),
    modifiedTime: new Date((typeof r.mtime === 'number' ? r.mtime : 0) * 1000),
  };
  if (typeof r.link === 'string') e.symlinkTarget = r.link;
  if (typeof r.uid === 'number') e.uid = r.uid;
  if (typeof r.gid === 'number') e.gid = r.gid;
  return e;
}

/** The chunks of data, without loading a stream or a Blob whole. */
async function* chunksOf(data: WriteEntry['data']): AsyncGenerator<Uint8Array> {
  if (typeof data === 'string') {
    yield Buffer.from(data, 'utf8');
  } else if (data instanceof Uint8Array) {
    yield data;
  } else if (data instanceof ArrayBuffer) {
    yield new Uint8Array(data);
  } else if (typeof Blob !== 'undefined' && data instanceof Blob) {
    for (let off = 0; off < data.size; off += CHUNK) yield new Uint8Array(await data.slice(off, off + CHUNK).arrayBuffer());
  } else if (data && typeof (data as ReadableStream<Uint8Array>).getReader === 'function') {
    const reader = (data as ReadableStream<Uint8Array>).getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        yield typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
      }
    } finally {
      reader.releaseLock();
    }
  } else if (data && typeof (data as AsyncIterable<Uint8Array>)[Symbol.asyncIterator] === 'function') {
    for await (const c of data as AsyncIterable<Uint8Array | string>) yield typeof c === 'string' ? Buffer.from(c, 'utf8') : c;
  } else {
    throw new InvalidArgumentError('files.write: data must be a string, Uint8Array, ArrayBuffer, Blob or a stream of bytes');
  }
}

/** sbx.files */
export class Filesystem {
  private readonly link: SandboxLink;
  private readonly watches = new Set<WatchHandle>();

  /** @internal the sandbox was killed: every watch ends. */
  _sandboxGone(why: string): void {
    for (const w of [...this.watches]) w._sandboxGone(why);
  }

  /** @internal */
  constructor(link: SandboxLink) {
    this.link = link;
  }

  /**
   * Calls method as the account user says (default: the sandbox's), with
   * the params named in `paths` taken from its home when relative.
   */
  private call<T = Record<string, unknown>>(
    method: string,
    params: Record<string, unknown>,
    user: string | undefined,
    paths: string[] = ['path'],
  ): Promise<T> {
    const as = actingAs(this.link, user);
    const p: Record<string, unknown> = { sandbox: this.link.sandboxId, ...params };
    if (as.user !== undefined) p.user = as.user;
    if (as.base !== undefined) {
      for (const k of paths) if (typeof p[k] === 'string') p[k] = fromHome(p[k] as string, as.base);
    }
    return this.link.conn.call<T>(method, p);
  }

  private async readChunk(path: string, offset: number, user: string | undefined): Promise<{ bytes: Buffer; eof: boolean }> {
    const r = await this.call<{ data: string; encoding: string; eof: boolean }>('fs.read', {
      path,
      offset,
      length: CHUNK,
      encoding: 'base64',
    }, user);
    const bytes = r.encoding === 'utf8' ? Buffer.from(r.data, 'utf8') : Buffer.from(r.data, 'base64');
    return { bytes, eof: r.eof || bytes.length === 0 };
  }

  /**
   * Reads a file: as text (UTF-8, the default), bytes, a Blob, or a
   * ReadableStream that fetches 1 MiB at a time as it is read (nothing
   * buffers the whole file).  A missing file rejects with NotFoundError,
   * for a stream too (the first chunk is read before it resolves).
   */
  read(path: string, opts?: FilesystemRequestOpts & { format?: 'text' }): Promise<string>;
  read(path: string, opts: FilesystemRequestOpts & { format: 'bytes' }): Promise<Uint8Array>;
  read(path: string, opts: FilesystemRequestOpts & { format: 'blob' }): Promise<Blob>;
  read(path: string, opts: FilesystemRequestOpts & { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  async read(
    path: string,
    opts: FilesystemRequestOpts & { format?: ReadFormat } = {},
  ): Promise<string | Uint8Array | Blob | ReadableStream<Uint8Array>> {
    const format = opts.format ?? 'text';
    if (format !== 'text' && format !== 'bytes' && format !== 'blob' && format !== 'stream') {
      throw new InvalidArgumentError(`files.read: format ${String(format)} is not supported (text, bytes, blob, stream)`);
    }
    if (format === 'stream') return this.readStream(path, opts.user);
    const chunks: Buffer[] = [];
    let offset = 0;
    for (;;) {
      const { bytes, eof } = await this.readChunk(path, offset, opts.user);
      chunks.push(bytes);
      offset += bytes.length;
      if (eof) break;
    }
    const all = Buffer.concat(chunks);
    if (format === 'text') return all.toString('utf8');
    if (format === 'blob') return new Blob([all]);
    return new Uint8Array(all.buffer, all.byteOffset, all.byteLength);
  }

  private async readStream(path: string, user: string | undefined): Promise<ReadableStream<Uint8Array>> {
    let first: { bytes: Buffer; eof: boolean } | undefined = await this.readChunk(path, 0, user);
    let offset = first.bytes.length;
    let eof = first.eof;
    // one chunk ahead at most: the next is fetched when the reader asks
    return new ReadableStream<Uint8Array>(
      {
        pull: async (ctrl) => {
          if (first) {
            const b = first.bytes;
            first = undefined;
            if (b.length > 0) ctrl.enqueue(new Uint8Array(b.buffer, b.byteOffset, b.byteLength));
            if (eof) ctrl.close();
            return;
          }
          const c = await this.readChunk(path, offset, user);
          offset += c.bytes.length;
          if (c.bytes.length > 0) ctrl.enqueue(new Uint8Array(c.bytes.buffer, c.bytes.byteOffset, c.bytes.byteLength));
          eof = c.eof;
          if (eof) ctrl.close();
        },
      },
      { highWaterMark: 1 },
    );
  }

  /**
   * Writes a file (missing parent directories are created), or several:
   * `write([{path, data}, ...])`.  Data goes in 1 MiB chunks, each sent once
   * the previous one was written: a ReadableStream (or Node stream) is read
   * only as fast as the sandbox takes it, never whole.
   */
  write(path: string, data: WriteEntry['data'], opts?: FilesystemRequestOpts): Promise<WriteInfo>;
  write(files: WriteEntry[], opts?: FilesystemRequestOpts): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    dataOrOpts?: WriteEntry['data'] | FilesystemRequestOpts,
    maybeOpts?: FilesystemRequestOpts,
  ): Promise<WriteInfo | WriteInfo[]> {
    if (Array.isArray(pathOrFiles)) {
      const o = (dataOrOpts ?? {}) as FilesystemRequestOpts;
      const out: WriteInfo[] = [];
      for (const f of pathOrFiles) out.push(await this.writeOne(f.path, f.data, o.user));
      return out;
    }
    if (dataOrOpts === undefined || dataOrOpts === null) throw new InvalidArgumentError('files.write: no data');
    return this.writeOne(pathOrFiles, dataOrOpts as WriteEntry['data'], maybeOpts?.user);
  }

  private async writeOne(path: string, data: WriteEntry['data'], user: string | undefined): Promise<WriteInfo> {
    if (typeof path !== 'string' || path === '') throw new InvalidArgumentError('files.write: path must be a non-empty string');
    let offset = 0;
    let pending: Uint8Array[] = [];
    let pendingLen = 0;
    const flush = async (bytes: Uint8Array): Promise<void> => {
      const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      await this.call('fs.write', { path, offset, data: b.toString('base64'), encoding: 'base64' }, user);
      offset += b.length;
    };
    for await (const chunk of chunksOf(data)) {
      let c = chunk;
      // whole 1 MiB pieces go as they are; smaller ones gather up to 1 MiB
      while (pendingLen + c.length >= CHUNK) {
        const take = CHUNK - pendingLen;
        pending.push(c.subarray(0, take));
        await flush(pending.length === 1 ? pending[0] : Buffer.concat(pending));
        pending = [];
        pendingLen = 0;
        c = c.subarray(take);
      }
      if (c.length > 0) {
        pending.push(c);
        pendingLen += c.length;
      }
    }
    // the rest, or an empty file
    if (pendingLen > 0 || offset === 0) await flush(pending.length === 1 ? pending[0] : Buffer.concat(pending));
    return { name: basename(path), type: FileType.FILE, path };
  }

  /** The entries of a directory, sorted by name (at most 4000: the daemon's reply limit). */
  async list(path: string, opts?: FilesystemRequestOpts): Promise<EntryInfo[]> {
    const r = await this.call<{ entries: Array<Record<string, unknown>> }>('fs.list', { path }, opts?.user);
    return r.entries.map(toEntry);
  }

  /** True when something exists at path (a dangling symlink counts). Never throws. */
  async exists(path: string, opts?: FilesystemRequestOpts): Promise<boolean> {
    try {
      await this.call('fs.stat', { path }, opts?.user);
      return true;
    } catch {
      return false;
    }
  }

  /** Describes a file or directory; NotFoundError when there is nothing there. */
  async getInfo(path: string, opts?: FilesystemRequestOpts): Promise<EntryInfo> {
    return toEntry(await this.call('fs.stat', { path }, opts?.user));
  }

  /** Removes a file, or a directory with everything in it. */
  async remove(path: string, opts?: FilesystemRequestOpts): Promise<void> {
    await this.call('fs.remove', { path, recursive: true }, opts?.user);
  }

  /** Renames (moves) a file or directory; returns what is now at newPath. */
  async rename(oldPath: string, newPath: string, opts?: FilesystemRequestOpts): Promise<EntryInfo> {
    await this.call('fs.rename', { from: oldPath, to: newPath }, opts?.user, ['from', 'to']);
    return this.getInfo(newPath, opts);
  }

  /**
   * Watches a directory: onEvent gets each change ({name, type}, name
   * relative to path).  `recursive` covers its whole tree, new directories
   * included.  The watch ends at stop(), after timeoutMs (default 60 s, 0 =
   * never), or when the directory or the sandbox goes away; onExit says
   * which.  NotFoundError when path does not exist.
   */
  async watchDir(
    path: string,
    onEvent: (e: FilesystemEvent) => void | Promise<void>,
    opts: WatchOpts = {},
  ): Promise<WatchHandle> {
    if (typeof onEvent !== 'function') throw new InvalidArgumentError('files.watchDir: onEvent must be a function');
    const t = opts.timeoutMs ?? DEFAULT_WATCH_TIMEOUT_MS;
    if (typeof t !== 'number' || !Number.isFinite(t) || t < 0) throw new InvalidArgumentError(`files.watchDir: bad timeoutMs ${String(t)}`);
    let handle: WatchHandle | undefined;
    const as = actingAs(this.link, opts.user);
    const params: Record<string, unknown> = {
      sandbox: this.link.sandboxId,
      path: as.base !== undefined ? fromHome(path, as.base) : path,
      recursive: opts.recursive === true,
    };
    if (as.user !== undefined) params.user = as.user;
    await this.link.conn.call<{ watch: number }>(
      'fs.watch',
      params,
      // subscribe before the next line: events may follow the reply at once
      {
        onResult: (r) => {
          handle = new WatchHandle(this.link, r.watch, onEvent, opts, (h) => this.watches.delete(h));
          this.watches.add(handle);
        },
      },
    );
    return handle!;
  }

  /** Makes a directory and its parents; false when it already existed. */
  async makeDir(path: string, opts?: FilesystemRequestOpts): Promise<boolean> {
    const r = await this.call<{ created: boolean }>('fs.mkdir', { path, parents: true }, opts?.user);
    return r.created === true;
  }
}
