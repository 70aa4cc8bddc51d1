/**
 * The entries of a sandbox's filesystem as files.list and files.getInfo
 * describe them, made from the daemon's fs.stat and fs.list replies.
 */

import type { SandboxLink } from './link';
import { decodeData } from './wire';

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
  /** E2B's per-file metadata (user.e2b.* extended attributes): tupper keeps none, so it is never set. */
  metadata?: Record<string, string>;
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
  /** Owner and group names from the box's /etc/passwd and /etc/group (E2B's), else the ids as strings. */
  owner: string;
  group: string;
  /** Owner and group ids as seen inside the box. */
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

/** uid and gid -> name, from a box's /etc/passwd and /etc/group. */
export interface OwnerNames {
  users: Map<number, string>;
  groups: Map<number, string>;
}

/** Most of /etc/passwd or /etc/group read for names (the box's files are hostile: bounded). */
const NAMES_MAX = 256 * 1024;

function parseIds(text: string): Map<number, string> {
  const m = new Map<number, string>();
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length < 3 || f[0] === '' || !/^\d{1,10}$/.test(f[2])) continue;
    const id = Number(f[2]);
    if (!m.has(id)) m.set(id, f[0]);
  }
  return m;
}

/** The names of the box's accounts and groups, read as root now; empty maps when they cannot be read. */
export async function ownerNames(link: SandboxLink): Promise<OwnerNames> {
  const read = async (path: string): Promise<Map<number, string>> => {
    try {
      const r = await link.conn.call<{ data: string; encoding: string }>('fs.read', {
        sandbox: link.sandboxId, path, offset: 0, length: NAMES_MAX, encoding: 'base64', user: 'root',
      });
      return parseIds(decodeData(r.data, r.encoding).toString('utf8'));
    } catch {
      return new Map();
    }
  };
  const [users, groups] = await Promise.all([read('/etc/passwd'), read('/etc/group')]);
  return { users, groups };
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

export function toEntry(r: Record<string, unknown>, names?: OwnerNames): EntryInfo {
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
    owner: typeof r.uid === 'number' ? (names?.users.get(r.uid) ?? String(r.uid)) : '',
    group: typeof r.gid === 'number' ? (names?.groups.get(r.gid) ?? String(r.gid)) : '',
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
