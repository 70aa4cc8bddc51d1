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
import { basename, type EntryInfo, FileType, toEntry, type WriteInfo } from './entry';
import { checkTimeoutMs, InvalidArgumentError } from './errors';
import type { SandboxLink } from './link';
import { dataConn, type DataConn } from './stream';
import { DEFAULT_WATCH_TIMEOUT_MS, type FilesystemEvent, WatchHandle, type WatchOpts } from './watch';
import { decodeData } from './wire';

/** A stream of bytes to write: a web ReadableStream or any async iterable of chunks (a Node Readable). */
export type ByteStream = ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>;

export interface WriteEntry {
  path: string;
  data: string | ArrayBuffer | Uint8Array | Blob | ByteStream;
}

export type ReadFormat = 'text' | 'bytes' | 'blob' | 'stream';

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
    const { chunks } = await dc.readFile(this.link.conn, asAccount(this.link, user, { sandbox: this.link.sandboxId, path }));
    if (format === 'stream') {
      const it = chunks[Symbol.asyncIterator]();
      return new ReadableStream<Uint8Array>(
        {
          pull: async (ctrl) => {
            const r = await it.next();
            if (r.done) ctrl.close();
            else ctrl.enqueue(new Uint8Array(r.value.buffer, r.value.byteOffset, r.value.byteLength));
          },
          cancel: async () => {
            await it.return?.(undefined);
          },
        },
        { highWaterMark: 1 },
      );
    }
    const parts: Buffer[] = [];
    for await (const c of chunks) parts.push(c);
    const all = Buffer.concat(parts);
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
    const dc = await dataConn(this.link.conn);
    if (dc) {
      await dc.writeFile(this.link.conn, asAccount(this.link, user, { sandbox: this.link.sandboxId, path }), chunksOf(data));
      return { name: basename(path), type: FileType.FILE, path };
    }
    let offset = 0;
    // whole 1 MiB pieces, each sent once the previous one was written; an empty file is one empty write
    for await (const piece of inChunks(chunksOf(data))) {
      const b = asBuffer(piece);
      await this.call('fs.write', { path, offset, data: b.toString('base64'), encoding: 'base64' }, user);
      offset += b.length;
    }
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
    const r = await this.call<{ created: boolean }>('fs.mkdir', { path, parents: true }, opts?.user);
    return r.created === true;
  }
}
