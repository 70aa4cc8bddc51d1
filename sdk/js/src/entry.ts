/**
 * The entries of a sandbox's filesystem as files.list and files.getInfo
 * describe them, made from the daemon's fs.stat and fs.list replies.
 */

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
  /**
   * The exact bytes of a name, path or symlink target that is not UTF-8
   * (then `name`, `path`, `symlinkTarget` show its bad bytes as U+FFFD);
   * absent when the text field is exact.  docs/protocol.md, "Names that are
   * not UTF-8".
   */
  nameRaw?: Uint8Array;
  pathRaw?: Uint8Array;
  symlinkTargetRaw?: Uint8Array;
}

function raw(v: unknown): Uint8Array | undefined {
  return typeof v === 'string' ? new Uint8Array(Buffer.from(v, 'base64')) : undefined;
}

function permissions(type: string, mode: number): string {
  const kind = type === 'dir' ? 'd' : type === 'symlink' ? 'l' : type === 'file' ? '-' : '?';
  const rwx = ['r', 'w', 'x'];
  let s = kind;
  for (let i = 8; i >= 0; i--) s += mode & (1 << i) ? rwx[(8 - i) % 3] : '-';
  return s;
}

export function basename(p: string): string {
  const parts = p.split('/').filter((x) => x !== '');
  return parts.length ? parts[parts.length - 1] : '/';
}

export function toEntry(r: Record<string, unknown>): EntryInfo {
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
  const nameRaw = raw(r.name_raw), pathRaw = raw(r.path_raw), linkRaw = raw(r.link_raw);
  if (nameRaw) e.nameRaw = nameRaw;
  if (pathRaw) e.pathRaw = pathRaw;
  if (linkRaw) e.symlinkTargetRaw = linkRaw;
  return e;
}
