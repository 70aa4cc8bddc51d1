/**
 * TupperFilesystem: a tupper sandbox's files as a Mastra WorkspaceFilesystem
 * (by way of MastraFilesystem), over @tupper/sdk's files.*.  Relative
 * paths are taken from `basePath` (default: the account's home); absolute
 * paths are the box's own: the box is the boundary, and what its account
 * may not touch, the kernel refuses (PermissionError).
 */
import {
  DirectoryNotEmptyError,
  DirectoryNotFoundError,
  FileExistsError,
  FileNotFoundError,
  IsDirectoryError,
  MastraFilesystem,
  NotDirectoryError,
  PermissionError,
  StaleFileError,
} from '@mastra/core/workspace';
import type {
  CopyOptions,
  FileContent,
  FileEntry,
  FileStat,
  FilesystemInfo,
  ListOptions,
  ProviderStatus,
  ReadOptions,
  RemoveOptions,
  WriteOptions,
} from '@mastra/core/workspace';
import { type EntryInfo, NotFoundError, PermissionError as TupperPermissionError, type Sandbox, SandboxError } from '@tupper/sdk';
import type { TupperSandbox } from './sandbox';

export interface TupperFilesystemOptions {
  /** The sandbox whose files these are: a Mastra TupperSandbox (started on first use) or an @tupper/sdk Sandbox. */
  sandbox: TupperSandbox | Sandbox;
  /** Where relative paths start (default: the sandbox's working directory, else the account's home: /home/user on the default image). */
  basePath?: string;
  /** The box's account the operations act as (default: the sandbox's). */
  user?: string;
  /** Refuse every change (Mastra's read-only workspace). */
  readOnly?: boolean;
  id?: string;
}

function isTupperSandbox(s: TupperSandbox | Sandbox): s is TupperSandbox {
  return (s as TupperSandbox).provider === 'tupper' && typeof (s as TupperSandbox).ensureRunning === 'function';
}

function clean(p: string): string {
  const out: string[] = [];
  for (const part of p.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') out.pop();
    else out.push(part);
  }
  return '/' + out.join('/');
}

export class TupperFilesystem extends MastraFilesystem {
  readonly id: string;
  readonly name = 'TupperFilesystem';
  readonly provider = 'tupper';
  readonly readOnly: boolean;
  status: ProviderStatus = 'pending';
  private readonly source: TupperSandbox | Sandbox;
  private readonly user: string | undefined;
  private readonly base: string | undefined;

  constructor(opts: TupperFilesystemOptions) {
    super({ name: 'TupperFilesystem' });
    this.source = opts.sandbox;
    this.user = opts.user;
    this.base = opts.basePath;
    this.readOnly = opts.readOnly === true;
    this.id = opts.id ?? `tupper-fs-${Math.random().toString(36).slice(2, 10)}`;
  }

  /** Where relative paths start. */
  get basePath(): string {
    if (this.base !== undefined) return clean(this.base);
    const s = this.source;
    if (isTupperSandbox(s)) {
      const wd = s._defaultCwd();
      if (wd) return clean(wd);
      return s.sandboxId ? (s.instance.workdir ?? s.instance.home) : '/home/user';
    }
    return s.workdir ?? s.home;
  }

  override async init(): Promise<void> {
    await this.sbx();
  }

  getInfo(): FilesystemInfo {
    return { id: this.id, name: this.name, provider: this.provider, status: this.status, readOnly: this.readOnly, metadata: { basePath: this.basePath } };
  }

  getInstructions(): string {
    return `Files of a tupper sandbox: relative paths start at ${this.basePath}; absolute paths are the sandbox's own.`;
  }

  /** The box's absolute path for a path Mastra gives. */
  resolveAbsolutePath(path: string): string {
    return clean(path.startsWith('/') ? path : `${this.basePath}/${path}`);
  }

  async readFile(path: string, options: ReadOptions = {}): Promise<string | Buffer> {
    const p = this.resolveAbsolutePath(path);
    const sbx = await this.sbx();
    const info = await this.statOf(sbx, p, path, 'read');
    if (info.type === 'dir') throw new IsDirectoryError(path);
    const bytes = await this.wrap(path, 'read', () => sbx.files.read(p, { ...this.as(), format: 'bytes' }));
    const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    return options.encoding ? b.toString(options.encoding) : b;
  }

  async writeFile(path: string, content: FileContent, options: WriteOptions = {}): Promise<void> {
    this.writable(path);
    const p = this.resolveAbsolutePath(path);
    const sbx = await this.sbx();
    const now = await this.maybeStat(sbx, p);
    if (now && now.type === 'dir') throw new IsDirectoryError(path);
    if (now && options.overwrite === false) throw new FileExistsError(path);
    if (options.expectedMtime && now && now.modifiedTime.getTime() !== options.expectedMtime.getTime()) {
      throw new StaleFileError(path, options.expectedMtime, now.modifiedTime);
    }
    if (options.recursive === false) {
      const parent = p.slice(0, p.lastIndexOf('/')) || '/';
      const pi = await this.maybeStat(sbx, parent);
      if (!pi) throw new DirectoryNotFoundError(parent);
      if (pi.type !== 'dir') throw new NotDirectoryError(parent);
    }
    await this.wrap(path, 'write', () => sbx.files.write(p, typeof content === 'string' ? content : new Uint8Array(content), this.as()));
  }

  async appendFile(path: string, content: FileContent): Promise<void> {
    this.writable(path);
    const p = this.resolveAbsolutePath(path);
    const sbx = await this.sbx();
    const now = await this.maybeStat(sbx, p);
    if (now && now.type === 'dir') throw new IsDirectoryError(path);
    await this.wrap(path, 'append', () => sbx.files.append(p, typeof content === 'string' ? content : new Uint8Array(content), this.as()));
  }

  async deleteFile(path: string, options: RemoveOptions = {}): Promise<void> {
    this.writable(path);
    const p = this.resolveAbsolutePath(path);
    const sbx = await this.sbx();
    const now = await this.maybeStat(sbx, p);
    if (!now) {
      if (options.force) return;
      throw new FileNotFoundError(path);
    }
    if (now.type === 'dir') throw new IsDirectoryError(path);
    await this.wrap(path, 'delete', () => sbx.files.remove(p, this.as()));
  }

  async copyFile(src: string, dest: string, options: CopyOptions = {}): Promise<void> {
    this.writable(dest);
    const from = this.resolveAbsolutePath(src);
    const to = this.resolveAbsolutePath(dest);
    const sbx = await this.sbx();
    const info = await this.statOf(sbx, from, src, 'read');
    if (info.type === 'dir' && !options.recursive) throw new IsDirectoryError(src);
    if (options.overwrite === false && (await this.maybeStat(sbx, to))) throw new FileExistsError(dest);
    await this.wrap(dest, 'copy', () => sbx.files.copy(from, to, this.as()));
  }

  async moveFile(src: string, dest: string, options: CopyOptions = {}): Promise<void> {
    this.writable(src);
    this.writable(dest);
    const from = this.resolveAbsolutePath(src);
    const to = this.resolveAbsolutePath(dest);
    const sbx = await this.sbx();
    await this.statOf(sbx, from, src, 'move');
    if (options.overwrite === false && (await this.maybeStat(sbx, to))) throw new FileExistsError(dest);
    const parent = to.slice(0, to.lastIndexOf('/')) || '/';
    if (!(await this.maybeStat(sbx, parent))) await this.wrap(dest, 'move', () => sbx.files.makeDir(parent, this.as()));
    await this.wrap(dest, 'move', () => sbx.files.rename(from, to, this.as()));
  }

  async mkdir(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    this.writable(path);
    const p = this.resolveAbsolutePath(path);
    const sbx = await this.sbx();
    const now = await this.maybeStat(sbx, p);
    if (now) {
      if (now.type !== 'dir') throw new FileExistsError(path);
      if (options.recursive) return;
      throw new FileExistsError(path);
    }
    if (!options.recursive) {
      const parent = p.slice(0, p.lastIndexOf('/')) || '/';
      if (!(await this.maybeStat(sbx, parent))) throw new DirectoryNotFoundError(parent);
    }
    await this.wrap(path, 'mkdir', () => sbx.files.makeDir(p, this.as()));
  }

  async rmdir(path: string, options: RemoveOptions = {}): Promise<void> {
    this.writable(path);
    const p = this.resolveAbsolutePath(path);
    const sbx = await this.sbx();
    const now = await this.maybeStat(sbx, p);
    if (!now) {
      if (options.force) return;
      throw new DirectoryNotFoundError(path);
    }
    if (now.type !== 'dir') throw new NotDirectoryError(path);
    if (!options.recursive && (await this.wrap(path, 'rmdir', () => sbx.files.list(p, this.as()))).length > 0) {
      throw new DirectoryNotEmptyError(path);
    }
    await this.wrap(path, 'rmdir', () => sbx.files.remove(p, this.as()));
  }

  async readdir(path: string, options: ListOptions = {}): Promise<FileEntry[]> {
    const p = this.resolveAbsolutePath(path);
    const sbx = await this.sbx();
    const info = await this.maybeStat(sbx, p);
    if (!info) throw new DirectoryNotFoundError(path);
    if (info.type !== 'dir') throw new NotDirectoryError(path);
    return this.list(sbx, p, path, options, options.maxDepth ?? 100);
  }

  private async list(sbx: Sandbox, p: string, path: string, options: ListOptions, depth: number): Promise<FileEntry[]> {
    const exts = options.extension === undefined ? undefined : (Array.isArray(options.extension) ? options.extension : [options.extension]).map((e) => e.replace(/^\./, ''));
    const out: FileEntry[] = [];
    for (const e of await this.wrap(path, 'list', () => sbx.files.list(p, this.as()))) {
      let type: 'file' | 'directory' = e.type === 'dir' ? 'directory' : 'file';
      if (e.type === 'symlink') {
        const target = await this.maybeStatFollow(sbx, e.path);
        if (target === 'dir') type = 'directory';
      }
      if (exts && type === 'file' && !exts.some((x) => e.name.endsWith(`.${x}`))) continue;
      const entry: FileEntry = { name: e.name, type };
      if (type === 'file' && e.type === 'file') entry.size = e.size;
      if (e.type === 'symlink') {
        entry.isSymlink = true;
        if (e.symlinkTarget !== undefined) entry.symlinkTarget = e.symlinkTarget;
      }
      out.push(entry);
      if (options.recursive && e.type === 'dir' && depth > 0) {
        for (const sub of await this.list(sbx, e.path, `${path}/${e.name}`, options, depth - 1)) out.push({ ...sub, name: `${e.name}/${sub.name}` });
      }
    }
    return out;
  }

  async exists(path: string): Promise<boolean> {
    const sbx = await this.sbx();
    return sbx.files.exists(this.resolveAbsolutePath(path), this.as());
  }

  async stat(path: string): Promise<FileStat> {
    const p = this.resolveAbsolutePath(path);
    const sbx = await this.sbx();
    const e = await this.statOf(sbx, p, path, 'stat');
    let type: 'file' | 'directory' = e.type === 'dir' ? 'directory' : 'file';
    if (e.type === 'symlink' && (await this.maybeStatFollow(sbx, p)) === 'dir') type = 'directory';
    return { name: e.name, path: p, type, size: e.size, createdAt: e.modifiedTime, modifiedAt: e.modifiedTime };
  }

  private async sbx(): Promise<Sandbox> {
    const s = this.source;
    if (isTupperSandbox(s)) {
      await s.ensureRunning();
      this.status = 'ready';
      return s.instance;
    }
    this.status = 'ready';
    return s;
  }

  private as(): { user?: string } {
    const u = this.user ?? (isTupperSandbox(this.source) ? this.source.user : undefined);
    return u !== undefined ? { user: u } : {};
  }

  private writable(path: string): void {
    if (this.readOnly) throw new PermissionError(path, 'write (read-only filesystem)');
  }

  private async statOf(sbx: Sandbox, p: string, path: string, op: string): Promise<EntryInfo> {
    try {
      return await sbx.files.getInfo(p, this.as());
    } catch (e) {
      if (e instanceof NotFoundError) throw new FileNotFoundError(path);
      throw this.mapped(e, path, op);
    }
  }

  private async maybeStat(sbx: Sandbox, p: string): Promise<EntryInfo | undefined> {
    try {
      return await sbx.files.getInfo(p, this.as());
    } catch (e) {
      if (e instanceof NotFoundError) return undefined;
      throw this.mapped(e, p, 'stat');
    }
  }

  /** What a symlink leads to ('dir', 'file', or undefined when dangling), as ls -L would say. */
  private async maybeStatFollow(sbx: Sandbox, p: string): Promise<'dir' | 'file' | undefined> {
    try {
      await sbx.files.list(p, this.as());
      return 'dir';
    } catch (e) {
      if (e instanceof SandboxError && e.errnoCode === 'ENOTDIR') return 'file';
      return undefined;
    }
  }

  private async wrap<T>(path: string, op: string, f: () => Promise<T>): Promise<T> {
    try {
      return await f();
    } catch (e) {
      throw this.mapped(e, path, op);
    }
  }

  private mapped(e: unknown, path: string, op: string): unknown {
    if (e instanceof TupperPermissionError) return new PermissionError(path, op);
    if (!(e instanceof SandboxError)) return e;
    switch (e.errnoCode) {
      case 'ENOENT':
        return new FileNotFoundError(path);
      case 'EACCES':
      case 'EPERM':
      case 'EROFS':
        return new PermissionError(path, op);
      case 'EISDIR':
        return new IsDirectoryError(path);
      case 'ENOTDIR':
        return new NotDirectoryError(path);
      case 'EEXIST':
        return new FileExistsError(path);
      case 'ENOTEMPTY':
        return new DirectoryNotEmptyError(path);
      default:
        return e;
    }
  }
}
