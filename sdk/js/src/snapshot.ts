/**
 * Filesystem snapshots and fork (docs/snapshots.md), with E2B's names:
 * `sbx.createSnapshot()`, `Sandbox.createSnapshot(id)`, `Sandbox.listSnapshots()`,
 * `Sandbox.deleteSnapshot(id)`; a sandbox is made from one with
 * `Sandbox.create(snapshotId)` (E2B's form) or `Sandbox.create({ snapshot })`.
 */
import { type Connection, withConnection } from './connection';
import { InvalidArgumentError, NotFoundError } from './errors';
import type { SandboxConnectionOpts } from './sandbox-opts';

/** A snapshot: E2B's `snapshotId` and `names`, and tupper's own fields. */
export interface SnapshotInfo {
  /** The snapshot's id (`s` + 12 hex digits): `Sandbox.create(snapshotId)` starts from it. */
  snapshotId: string;
  /** Its names (at most one: the name it was given). */
  names: string[];
  /** The sandbox it was taken of. */
  sandboxId?: string;
  /** The image that sandbox was made from. */
  image?: string;
  /** When it was taken. */
  createdAt?: Date;
  /** Bytes of its regular files. */
  size: number;
  /** The sandboxes made from it that are alive. */
  sandboxes: string[];
}

/** E2B's snapshot options: a name (unique; no '/', '..', NUL or control characters). */
export interface CreateSnapshotOpts extends SandboxConnectionOpts {
  name?: string;
}

/** Fork options (E2B's): how many sandboxes, and their lifetime. */
export interface SandboxForkOpts extends SandboxConnectionOpts {
  /** 1 to 64 (default 1). */
  count?: number;
  /** Lifetime of each fork, in milliseconds (default: the snapshotted sandbox's limits' lifetime, else 5 minutes). */
  timeoutMs?: number;
}

export const FORK_MAX = 64;

/** A snapshot as the daemon describes it, as SnapshotInfo. */
export function toSnapshotInfo(r: Record<string, unknown>): SnapshotInfo {
  const at = typeof r.created_at === 'string' ? new Date(r.created_at) : undefined;
  return {
    snapshotId: String(r.id),
    names: Array.isArray(r.names) ? r.names.map(String) : [],
    sandboxId: typeof r.sandbox === 'string' ? r.sandbox : undefined,
    image: typeof r.image === 'string' ? r.image : undefined,
    createdAt: at,
    size: typeof r.size === 'number' ? r.size : 0,
    sandboxes: Array.isArray(r.sandboxes) ? r.sandboxes.map(String) : [],
  };
}

/** Checks a fork count here, so that a bad one never reaches the daemon. */
export function checkForkCount(count: unknown, what: string): number {
  if (count === undefined) return 1;
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > FORK_MAX) {
    throw new InvalidArgumentError(`${what}: count must be an integer from 1 to ${FORK_MAX}, not ${String(count)}`);
  }
  return count;
}

/** sandbox.snapshot on an open connection. */
export async function snapshotOn(c: Connection, sandboxId: string, name: string | undefined): Promise<SnapshotInfo> {
  if (name !== undefined && (typeof name !== 'string' || name.length === 0)) {
    throw new InvalidArgumentError('createSnapshot: name must be a non-empty string');
  }
  const params: Record<string, unknown> = { id: sandboxId };
  if (name !== undefined) params.name = name;
  return toSnapshotInfo(await c.call<Record<string, unknown>>('sandbox.snapshot', params));
}

/** The daemon's snapshots, oldest first. */
export async function listSnapshotsOn(opts: SandboxConnectionOpts | undefined): Promise<SnapshotInfo[]> {
  return withConnection(opts, async (c) => {
    const r = await c.call<{ snapshots: Record<string, unknown>[] }>('snapshot.list', {});
    return r.snapshots.map(toSnapshotInfo);
  });
}

/** E2B's snapshot paginator, over one page: the daemon's whole list. */
export class SnapshotPaginator {
  private done = false;
  constructor(private readonly opts?: SandboxConnectionOpts) {}
  /** Whether nextItems has more to give. */
  get hasNext(): boolean {
    return !this.done;
  }
  /** The next page (here, all of them; then an error, as E2B's). */
  async nextItems(): Promise<SnapshotInfo[]> {
    if (this.done) throw new InvalidArgumentError('listSnapshots: no more items');
    this.done = true;
    return listSnapshotsOn(this.opts);
  }
}

/** snapshot.delete: true when deleted, false when there was none (E2B's); refused while used. */
export async function deleteSnapshotOn(snapshotId: string, opts: SandboxConnectionOpts | undefined): Promise<boolean> {
  return withConnection(opts, async (c) => {
    try {
      await c.call('snapshot.delete', { id: snapshotId });
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  });
}
