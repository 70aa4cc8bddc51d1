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
import { asAccount } from './account';
import { asBuffer, CHUNK, inChunks } from './chunks';
import { basename, type EntryInfo, FileType, ownerNames, toEntry, type WriteInfo } from './entry';
import { checkTimeoutMs, ErrorCode, InvalidArgumentError, SandboxError } from './errors';
import type { SandboxLink } from './link';
import { checkKeys, checkRequestOpts, checkSignal, REQUEST_KEYS } from './options';
import { dataConn, type DataConn } from './stream';
import { DEFAULT_WATCH_TIMEOUT_MS, type FilesystemEvent, FilesystemEventType, WatchHandle, type WatchOpts } from './watch';
import { decodeData } from './wire';

/** A stream of bytes to write: a web ReadableStream or any async iterable of chunks (a Node Readable). */
export type ByteStream = ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>;

export interface WriteEntry {
  path: string;
  data: string | ArrayBuffer | Uint8Array | Blob | ByteStream;
}

export type ReadFormat = 'text' | 'bytes' | 'blob' | 'stream';

/** Most directories one files.list with a depth reads. */
export const LIST_DIRS_MAX = 10_000;

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
  /** E2B's gzip content encoding: accepted; the daemon's socket is local, so nothing is compressed. */
  gzip?: boolean;
  /** E2B's request signal: one already aborted is not sent (AbortError). */
  signal?: AbortSignal;
}

/** Options of files.read (E2B's FilesystemReadOpts). */
export interface FilesystemReadOpts extends FilesystemRequestOpts {
  /**
   * E2B's idle limit of a read stream: accepted (a timeout value); tupper's
   * read stream has no idle limit (the next bytes come when the reader asks).
   */
  streamIdleTimeoutMs?: number;
}

/** Options of files.list (E2B's FilesystemListOpts). */
export interface FilesystemListOpts extends FilesystemRequestOpts {
  /** How many levels down (default 1). */
  depth?: number;
}

/** Options of files.write. */
export interface FilesystemWriteOpts extends FilesystemRequestOpts {
  /**
   * Permission bits of the file written, e.g. `0o600` (0 to 0o7777).  The
   * data goes to a new file beside it with that mode, renamed over `path`
   * once whole: the file has exactly that mode (whatever the old one had)
   * and readers never see it half written.
   */
  mode?: number;
  /** E2B's raw upload: accepted; bytes always go as they are, in 1 MiB pieces. */
  useOctetStream?: boolean;
}

/** Options of files.copy. */
export interface FilesystemCopyOpts extends FilesystemRequestOpts {
  /** Replace what is at the destination (default true); false: InvalidArgumentError when something is there. */
  overwrite?: boolean;
}

function checkMode(mode: unknown, what: string): number | undefined {
  if (mode === undefined) return undefined;
  if (typeof mode !== 'number' || !Number.isInteger(mode) || mode < 0 || mode > 0o7777) {
    throw new InvalidArgumentError(`${what}: bad mode ${String(mode)} (permission bits 0 to 0o7777)`);
  }
  return mode;
}

function dirname(p: string): string {
  const i = p.replace(/\/+$/, '').lastIndexOf('/');
  if (i < 0) return '';
  return i === 0 ? '/' : p.slice(0, i);
}

function joinPath(dir: string, name: string): string {
  return dir.endsWith('/') ? dir + name : `${dir}/${name}`;
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

/** gather() allocates at most this up front; a larger file's rest is joined at the end. */
const PREALLOC_MAX = 1024 * 1024 * 1024;

/**
 * The chunks of a read as one Buffer of the size the daemon saw at the open
 * (a file that grew meanwhile gets the rest joined at the end; one that
 * shrank, the part that came).  The data connection reads into that buffer
 * itself where it can (`into`): a piece that is a view of it at the offset
 * it belongs is there already; any other is copied once.  @internal
 * (exported for its test)
 */
export async function gather(chunks: AsyncIterable<Buffer[]>, size: number, into?: (b: Buffer) => void): Promise<Buffer> {
  const out = Buffer.allocUnsafe(Number.isSafeInteger(size) && size > 0 ? Math.min(size, PREALLOC_MAX) : 0);
  if (out.length > 0) into?.(out);
  const more: Buffer[] = [];
  let n = 0;
  for await (const frame of chunks) {
    for (const c of frame) {
      if (c.buffer === out.buffer && c.byteOffset === out.byteOffset + n && c.length <= out.length - n) {
        n += c.length; // read into place
        continue;
      }
      const k = Math.min(c.length, out.length - n);
      c.copy(out, n, 0, k);
      n += k;
      if (k < c.length) more.push(c.subarray(k));
    }
  }
  if (more.length === 0) return out.subarray(0, n);
  return Buffer.concat([out.subarray(0, n), ...more]);
}

/** E2B file options with no local counterpart: refused with a reason rather than dropped. */
const FS_UNSUPPORTED: Record<string, string> = {
  metadata: "tupper does not keep E2B's per-file metadata (user.e2b.* extended attributes)",
};
const FS_KEYS = ['user', 'gzip', ...REQUEST_KEYS];

function checkFsOpts(opts: unknown, extra: readonly string[], what: string): void {
  checkKeys(opts, [...FS_KEYS, ...extra], what, FS_UNSUPPORTED);
  checkSignal((opts as FilesystemRequestOpts | undefined)?.signal, what);
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
    return this.link.conn.call<T>(method, asAccount(this.link, user, { sandbox: this.link.sandboxId, ...params }, paths));
  }

  private async readChunk(path: string, offset: number, user: string | undefined): Promise<{ bytes: Buffer; eof: boolean }> {
    const r = await this.call<{ data: string; encoding: string; eof: boolean }>('fs.read', {
      path,
      offset,
      length: CHUNK,
      encoding: 'base64',
    }, user);
    const bytes = decodeData(r.data, r.encoding);
    return { bytes, eof: r.eof || bytes.length === 0 };
  }

  /**
   * Reads a file: as text (UTF-8, the default), bytes, a Blob, or a
   * ReadableStream that fetches 1 MiB at a time as it is read (nothing
   * buffers the whole file).  A missing file rejects with NotFoundError,
   * for a stream too (the first chunk is read before it resolves).
   */
  read(path: string, opts?: FilesystemReadOpts & { format?: 'text' }): Promise<string>;
  read(path: string, opts: FilesystemReadOpts & { format: 'bytes' }): Promise<Uint8Array>;
  read(path: string, opts: FilesystemReadOpts & { format: 'blob' }): Promise<Blob>;
  read(path: string, opts: FilesystemReadOpts & { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  async read(
    path: string,
    opts: FilesystemReadOpts & { format?: ReadFormat } = {},
  ): Promise<string | Uint8Array | Blob | ReadableStream<Uint8Array>> {
    checkFsOpts(opts, ['format', 'streamIdleTimeoutMs'], 'files.read');
    if (opts.streamIdleTimeoutMs !== undefined) checkTimeoutMs(opts.streamIdleTimeoutMs, 'files.read');
    const format = opts.format ?? 'text';
    if (format !== 'text' && format !== 'bytes' && format !== 'blob' && format !== 'stream') {
      throw new InvalidArgumentError(`files.read: format ${String(format)} is not supported (text, bytes, blob, stream)`);
    }
    const dc = await dataConn(this.link.conn);
    if (dc) return this.readFramed(dc, path, format, opts.user);
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

  /** read() on the data plane (stream.ts): binary frames, no base64. */
  private async readFramed(dc: DataConn, path: string, format: ReadFormat, user: string | undefined): Promise<string | Uint8Array | Blob | ReadableStream<Uint8Array>> {
    const { size, chunks, into } = await dc.readFile(this.link.conn, asAccount(this.link, user, { sandbox: this.link.sandboxId, path }));
    if (format === 'stream') {
      const it = chunks[Symbol.asyncIterator]();
      return new ReadableStream<Uint8Array>(
        {
          pull: async (ctrl) => {
            const r = await it.next();
            if (r.done) ctrl.close();
            else {
              const v = r.value.length === 1 ? r.value[0] : Buffer.concat(r.value);
              ctrl.enqueue(new Uint8Array(v.buffer, v.byteOffset, v.byteLength));
            }
          },
          cancel: async () => {
            await it.return?.(undefined);
          },
        },
        { highWaterMark: 1 },
      );
    }
    const all = await gather(chunks, size, into);
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
  write(path: string, data: WriteEntry['data'], opts?: FilesystemWriteOpts): Promise<WriteInfo>;
  write(files: WriteEntry[], opts?: FilesystemWriteOpts): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    dataOrOpts?: WriteEntry['data'] | FilesystemWriteOpts,
    maybeOpts?: FilesystemWriteOpts,
  ): Promise<WriteInfo | WriteInfo[]> {
    checkFsOpts(Array.isArray(pathOrFiles) ? dataOrOpts : maybeOpts, ['mode', 'useOctetStream'], 'files.write');
    if (Array.isArray(pathOrFiles)) {
      const o = (dataOrOpts ?? {}) as FilesystemWriteOpts;
      const mode = checkMode(o.mode, 'files.write');
      const out: WriteInfo[] = [];
      for (const f of pathOrFiles) out.push(await this.writeOne(f.path, f.data, o.user, mode));
      return out;
    }
    if (dataOrOpts === undefined || dataOrOpts === null) throw new InvalidArgumentError('files.write: no data');
    const mode = checkMode(maybeOpts?.mode, 'files.write');
    return this.writeOne(pathOrFiles, dataOrOpts as WriteEntry['data'], maybeOpts?.user, mode);
  }

  /** E2B's writeFiles: write(files) under its own name (each file's parents made; in order). */
  async writeFiles(files: WriteEntry[], opts?: FilesystemWriteOpts): Promise<WriteInfo[]> {
    checkFsOpts(opts, ['mode', 'useOctetStream'], 'files.writeFiles');
    if (!Array.isArray(files)) throw new InvalidArgumentError('files.writeFiles: files must be a list of {path, data}');
    return this.write(files, opts);
  }

  private async writeOne(path: string, data: WriteEntry['data'], user: string | undefined, mode?: number): Promise<WriteInfo> {
    if (typeof path !== 'string' || path === '') throw new InvalidArgumentError('files.write: path must be a non-empty string');
    if (mode === undefined) {
      await this.send(path, data, user, false);
      return { name: basename(path), type: FileType.FILE, path: this.absolute(path, user) };
    }
    // a new file gets the mode: write one beside path, then rename it over
    const dir = dirname(path);
    const tmp = (dir === '' ? '' : joinPath(dir, '')) + `.${basename(path)}.tupper-${process.pid}-${Math.random().toString(36).slice(2, 10)}`;
    try {
      await this.send(tmp, data, user, false, mode);
      await this.call('fs.rename', { from: tmp, to: path }, user, ['from', 'to']);
    } catch (e) {
      await this.call('fs.remove', { path: tmp }, user).catch(() => {});
      throw e;
    }
    return { name: basename(path), type: FileType.FILE, path: this.absolute(path, user) };
  }

  /** E2B's paths are absolute: a relative one as the account it acts as takes it. */
  private absolute(path: string, user: string | undefined): string {
    return String(asAccount(this.link, user === this.link.defaultUser ? undefined : user, { path }).path);
  }

  /** Sends data to path in 1 MiB pieces: from offset 0 (truncating), or appended. */
  private async send(path: string, data: WriteEntry['data'], user: string | undefined, append: boolean, mode?: number): Promise<void> {
    // a whole file (no append, no mode) goes over the data connection's binary frames when the daemon has them
    if (!append && mode === undefined) {
      const dc = await dataConn(this.link.conn);
      if (dc) {
        await dc.writeFile(this.link.conn, asAccount(this.link, user, { sandbox: this.link.sandboxId, path }), chunksOf(data));
        return;
      }
    }
    let offset = 0;
    // whole 1 MiB pieces, each sent once the previous one was written; an empty file is one empty write
    for await (const piece of inChunks(chunksOf(data))) {
      const b = asBuffer(piece);
      const p: Record<string, unknown> = { path, data: b.toString('base64'), encoding: 'base64' };
      if (append) p.append = true;
      else p.offset = offset;
      if (mode !== undefined) p.mode = mode;
      await this.call('fs.write', p, user);
      offset += b.length;
    }
  }

  /**
   * Appends data to a file (made, with its missing parent directories,
   * when it does not exist), in 1 MiB pieces.
   */
  async append(path: string, data: WriteEntry['data'], opts?: FilesystemRequestOpts): Promise<WriteInfo> {
    checkFsOpts(opts, [], 'files.append');
    if (typeof path !== 'string' || path === '') throw new InvalidArgumentError('files.append: path must be a non-empty string');
    if (data === undefined || data === null) throw new InvalidArgumentError('files.append: no data');
    await this.send(path, data, opts?.user, true);
    return { name: basename(path), type: FileType.FILE, path: this.absolute(path, opts?.user) };
  }

  /**
   * Copies a file, or a directory with everything in it, inside the
   * sandbox; returns what is now at dst.  A file keeps its permission bits;
   * its bytes stream through this client 1 MiB at a time.  A symlink (at src
   * or inside a directory) is refused with InvalidArgumentError, as is a
   * directory copied into itself.
   */
  async copy(src: string, dst: string, opts: FilesystemCopyOpts = {}): Promise<EntryInfo> {
    checkFsOpts(opts, ['overwrite'], 'files.copy');
    if (typeof src !== 'string' || src === '' || typeof dst !== 'string' || dst === '') {
      throw new InvalidArgumentError('files.copy: src and dst must be non-empty strings');
    }
    const from = toEntry(await this.call('fs.stat', { path: src }, opts.user));
    if (opts.overwrite === false && (await this.exists(dst, opts))) {
      throw new InvalidArgumentError(`files.copy: ${dst} exists (overwrite: false)`);
    }
    if (from.type === FileType.DIR) {
      // where dst really is (the daemon's own clean, absolute path) once it exists
      const made = await this.call<{ created: boolean }>('fs.mkdir', { path: dst, parents: true, mode: from.mode }, opts.user);
      const to = String((await this.call<{ path?: string }>('fs.stat', { path: dst }, opts.user)).path ?? '');
      const a = from.path.replace(/\/+$/, '');
      if (to === a || to.startsWith(a + '/')) {
        if (made.created) await this.call('fs.remove', { path: dst, recursive: true }, opts.user).catch(() => {});
        throw new InvalidArgumentError(`files.copy: cannot copy ${src} into itself`);
      }
    }
    await this.copyEntry(from, dst, opts.user);
    return this.getInfo(dst, opts);
  }

  private async copyEntry(from: EntryInfo, dst: string, user: string | undefined): Promise<void> {
    if (from.type === FileType.FILE) {
      await this.writeOne(dst, await this.readStream(from.path, user), user, from.mode);
    } else if (from.type === FileType.DIR) {
      await this.call('fs.mkdir', { path: dst, parents: true, mode: from.mode }, user);
      const r = await this.call<{ entries: Array<Record<string, unknown>>; truncated?: boolean }>('fs.list', { path: from.path }, user);
      if (r.truncated) throw new InvalidArgumentError(`files.copy: ${from.path} has more entries than one listing holds`);
      for (const e of r.entries.map((raw) => toEntry(raw))) await this.copyEntry(e, joinPath(dst, e.name), user);
    } else {
      throw new InvalidArgumentError(`files.copy: ${from.path} is a ${from.type}: only files and directories are copied`);
    }
  }

  /**
   * The entries of a directory, sorted by name (at most 4000 a directory:
   * the daemon's reply limit).  `depth` (E2B's, default 1) goes that many
   * levels down: each directory's entries follow it (symlinks are not
   * followed), at most LIST_DIRS_MAX directories in all.
   */
  async list(path: string, opts?: FilesystemListOpts): Promise<EntryInfo[]> {
    checkFsOpts(opts, ['depth'], 'files.list');
    const depth = opts?.depth ?? 1;
    if (typeof depth !== 'number' || !Number.isInteger(depth) || depth < 1) {
      throw new InvalidArgumentError('depth should be at least one');
    }
    const names = ownerNames(this.link);
    const out: EntryInfo[] = [];
    let dirs = 0;
    const walk = async (dir: string, left: number): Promise<void> => {
      if (++dirs > LIST_DIRS_MAX) throw new InvalidArgumentError(`files.list: more than ${LIST_DIRS_MAX} directories under ${path}: ask for less depth`);
      const r = await this.call<{ entries: Array<Record<string, unknown>> }>('fs.list', { path: dir }, opts?.user);
      const n = await names;
      for (const raw of r.entries) {
        const e = toEntry(raw, n);
        out.push(e);
        if (left > 1 && e.type === FileType.DIR) await walk(e.path, left - 1);
      }
    };
    await walk(path, depth);
    return out;
  }

  /** True when something exists at path (a dangling symlink counts). Never rejects for what is there or not; an unknown option does (InvalidArgumentError). */
  async exists(path: string, opts?: FilesystemRequestOpts): Promise<boolean> {
    checkFsOpts(opts, [], 'files.exists');
    try {
      await this.call('fs.stat', { path }, opts?.user);
      return true;
    } catch {
      return false;
    }
  }

  /** Describes a file or directory; NotFoundError when there is nothing there. */
  async getInfo(path: string, opts?: FilesystemRequestOpts): Promise<EntryInfo> {
    checkFsOpts(opts, [], 'files.getInfo');
    const [r, names] = await Promise.all([this.call('fs.stat', { path }, opts?.user), ownerNames(this.link)]);
    return toEntry(r, names);
  }

  /** Removes a file, or a directory with everything in it. */
  async remove(path: string, opts?: FilesystemRequestOpts): Promise<void> {
    checkFsOpts(opts, [], 'files.remove');
    try {
      await this.call('fs.remove', { path, recursive: true }, opts?.user);
    } catch (e) {
      // nothing there is nothing to remove, as E2B's (its envd's RemoveAll)
      if (e instanceof SandboxError && e.code === ErrorCode.File && e.errnoCode === 'ENOENT') return;
      throw e;
    }
  }

  /** Renames (moves) a file or directory; returns what is now at newPath. */
  async rename(oldPath: string, newPath: string, opts?: FilesystemRequestOpts): Promise<EntryInfo> {
    checkFsOpts(opts, [], 'files.rename');
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
    checkFsOpts(opts, ['recursive', 'timeoutMs', 'onExit', 'includeEntry', 'allowNetworkMounts'], 'files.watchDir');
    if (opts.includeEntry === true && typeof onEvent === 'function') onEvent = withEntries(this, path, opts.user, onEvent);
    if (typeof onEvent !== 'function') throw new InvalidArgumentError('files.watchDir: onEvent must be a function');
    checkTimeoutMs(opts.timeoutMs ?? DEFAULT_WATCH_TIMEOUT_MS, 'files.watchDir');
    let handle: WatchHandle | undefined;
    const params = asAccount(this.link, opts.user, { sandbox: this.link.sandboxId, path, recursive: opts.recursive === true });
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
    checkFsOpts(opts, [], 'files.makeDir');
    const r = await this.call<{ created: boolean }>('fs.mkdir', { path, parents: true }, opts?.user);
    return r.created === true;
  }
}

/**
 * E2B's includeEntry: each event but a removal gets what is at its path
 * now (files.getInfo; none when it is gone again), delivered in order.
 */
function withEntries(
  files: Filesystem,
  dir: string,
  user: string | undefined,
  onEvent: (e: FilesystemEvent) => void | Promise<void>,
): (e: FilesystemEvent) => Promise<void> {
  let chain: Promise<void> = Promise.resolve();
  return (e) => {
    chain = chain.then(async () => {
      if (e.type !== FilesystemEventType.REMOVE && e.type !== FilesystemEventType.OVERFLOW && e.name !== '') {
        try {
          e.entry = await files.getInfo(joinPath(dir, e.name), user === undefined ? undefined : { user });
        } catch {
          // gone again (or renamed away) before it could be described
        }
      }
      await onEvent(e);
    }).catch(() => {});
    return chain;
  };
}
