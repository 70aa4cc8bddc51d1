/**
 * sbx.files: the sandbox's filesystem, as E2B's Filesystem module.  Bytes
 * travel base64-encoded in chunks of at most 1 MiB (fs.read / fs.write with
 * offsets).  Relative paths are taken from `/`.
 */
import type { SandboxLink } from './commands';
import { InvalidArgumentError } from './errors';

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

export interface WriteEntry {
  path: string;
  data: string | ArrayBuffer | Uint8Array | Blob;
}

export type ReadFormat = 'text' | 'bytes' | 'blob';

export interface FilesystemRequestOpts {
  /** Accepted for E2B compatibility; every file operation acts as root inside the box. */
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

async function toBytes(data: WriteEntry['data']): Promise<Buffer> {
  if (typeof data === 'string') return Buffer.from(data, 'utf8');
  if (data instanceof Uint8Array) return Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  if (data instanceof ArrayBuffer) return Buffer.from(data);
  if (typeof Blob !== 'undefined' && data instanceof Blob) return Buffer.from(await data.arrayBuffer());
  throw new InvalidArgumentError('files.write: data must be a string, Uint8Array, ArrayBuffer or Blob');
}

/** sbx.files */
export class Filesystem {
  private readonly link: SandboxLink;

  /** @internal */
  constructor(link: SandboxLink) {
    this.link = link;
  }

  private call<T = Record<string, unknown>>(method: string, params: Record<string, unknown>): Promise<T> {
    return this.link.conn.call<T>(method, { sandbox: this.link.sandboxId, ...params });
  }

  /** Reads a whole file: as text (UTF-8, the default), bytes or a Blob. */
  read(path: string, opts?: FilesystemRequestOpts & { format?: 'text' }): Promise<string>;
  read(path: string, opts: FilesystemRequestOpts & { format: 'bytes' }): Promise<Uint8Array>;
  read(path: string, opts: FilesystemRequestOpts & { format: 'blob' }): Promise<Blob>;
  async read(path: string, opts: FilesystemRequestOpts & { format?: ReadFormat } = {}): Promise<string | Uint8Array | Blob> {
    const format = opts.format ?? 'text';
    if (format !== 'text' && format !== 'bytes' && format !== 'blob') {
      throw new InvalidArgumentError(`files.read: format ${String(format)} is not supported (text, bytes, blob)`);
    }
    const chunks: Buffer[] = [];
    let offset = 0;
    for (;;) {
      const r = await this.call<{ data: string; encoding: string; eof: boolean }>('fs.read', {
        path,
        offset,
        length: CHUNK,
        encoding: 'base64',
      });
      const b = r.encoding === 'utf8' ? Buffer.from(r.data, 'utf8') : Buffer.from(r.data, 'base64');
      chunks.push(b);
      offset += b.length;
      if (r.eof || b.length === 0) break;
    }
    const all = Buffer.concat(chunks);
    if (format === 'text') return all.toString('utf8');
    if (format === 'blob') return new Blob([all]);
    return new Uint8Array(all.buffer, all.byteOffset, all.byteLength);
  }

  /**
   * Writes a file (missing parent directories are created), or several:
   * `write([{path, data}, ...])`.  Large data goes in 1 MiB chunks.
   */
  write(path: string, data: WriteEntry['data'], opts?: FilesystemRequestOpts): Promise<WriteInfo>;
  write(files: WriteEntry[], opts?: FilesystemRequestOpts): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    dataOrOpts?: WriteEntry['data'] | FilesystemRequestOpts,
  ): Promise<WriteInfo | WriteInfo[]> {
    if (Array.isArray(pathOrFiles)) {
      const out: WriteInfo[] = [];
      for (const f of pathOrFiles) out.push(await this.writeOne(f.path, f.data));
      return out;
    }
    if (dataOrOpts === undefined || dataOrOpts === null) throw new InvalidArgumentError('files.write: no data');
    return this.writeOne(pathOrFiles, dataOrOpts as WriteEntry['data']);
  }

  private async writeOne(path: string, data: WriteEntry['data']): Promise<WriteInfo> {
    if (typeof path !== 'string' || path === '') throw new InvalidArgumentError('files.write: path must be a non-empty string');
    const bytes = await toBytes(data);
    let offset = 0;
    do {
      const chunk = bytes.subarray(offset, offset + CHUNK);
      await this.call('fs.write', { path, offset, data: chunk.toString('base64'), encoding: 'base64' });
      offset += chunk.length;
    } while (offset < bytes.length);
    return { name: basename(path), type: FileType.FILE, path };
  }

  /** The entries of a directory, sorted by name (at most 4000: the daemon's reply limit). */
  async list(path: string, _opts?: FilesystemRequestOpts): Promise<EntryInfo[]> {
    const r = await this.call<{ entries: Array<Record<string, unknown>> }>('fs.list', { path });
    return r.entries.map(toEntry);
  }

  /** True when something exists at path (a dangling symlink counts). Never throws. */
  async exists(path: string, _opts?: FilesystemRequestOpts): Promise<boolean> {
    try {
      await this.call('fs.stat', { path });
      return true;
    } catch {
      return false;
    }
  }

  /** Describes a file or directory; NotFoundError when there is nothing there. */
  async getInfo(path: string, _opts?: FilesystemRequestOpts): Promise<EntryInfo> {
    return toEntry(await this.call('fs.stat', { path }));
  }

  /** Removes a file, or a directory with everything in it. */
  async remove(path: string, _opts?: FilesystemRequestOpts): Promise<void> {
    await this.call('fs.remove', { path, recursive: true });
  }

  /** Renames (moves) a file or directory; returns what is now at newPath. */
  async rename(oldPath: string, newPath: string, _opts?: FilesystemRequestOpts): Promise<EntryInfo> {
    await this.call('fs.rename', { from: oldPath, to: newPath });
    return this.getInfo(newPath);
  }

  /** Makes a directory and its parents; false when it already existed. */
  async makeDir(path: string, _opts?: FilesystemRequestOpts): Promise<boolean> {
    const r = await this.call<{ created: boolean }>('fs.mkdir', { path, parents: true });
    return r.created === true;
  }
}
