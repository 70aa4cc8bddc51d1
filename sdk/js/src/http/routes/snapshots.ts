/**
 * Snapshots and fork (docs/snapshots.md): POST /sandboxes/{id}/snapshots,
 * POST /sandboxes/{id}/fork, GET /snapshots, DELETE /snapshots/{snapshot};
 * POST /sandboxes with `snapshot` makes a sandbox from one.
 */
import { withConnection } from '../../connection';
import { ErrorCode, SandboxError } from '../../errors';
import { toInfo } from '../../sandbox-info';
import { FORK_MAX, type SnapshotInfo, deleteSnapshotOn, listSnapshotsOn, snapshotOn } from '../../snapshot';
import { readJson, sendJson } from '../body';
import type { ServerContext } from '../context';
import { badRequest, HttpError } from '../errors';
import { onlyKeys, sandboxParam } from '../params';
import type { Router } from '../router';

const SNAPSHOT_REF = /^[^\u0000-\u001f\u007f/]{1,128}$/;

function view(s: SnapshotInfo): Record<string, unknown> {
  return { ...s, createdAt: s.createdAt?.toISOString() };
}

/** The daemon could not do it (a paused box mid-snapshot, a snapshot in use): 409, as other refusals. */
async function daemonCall<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof SandboxError && e.code === ErrorCode.Sandbox) throw new HttpError(409, 'SandboxError', e.message);
    throw e;
  }
}

export function register(router: Router, ctx: ServerContext): void {
  const { conn } = ctx;

  router.route('POST', '/sandboxes/{id}/snapshots', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req, ctx.maxJson, true);
    onlyKeys(b, ['name'], 'body');
    if (b.name !== undefined && (typeof b.name !== 'string' || b.name === '')) throw badRequest('name must be a non-empty string');
    const s = await daemonCall(() => withConnection(conn, (d) => snapshotOn(d, id, b.name as string | undefined)));
    sendJson(c.res, 201, view(s));
  });

  router.route('POST', '/sandboxes/{id}/fork', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req, ctx.maxJson, true);
    onlyKeys(b, ['count'], 'body');
    const count = b.count ?? 1;
    if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > FORK_MAX) {
      throw badRequest(`count must be an integer from 1 to ${FORK_MAX}`);
    }
    const r = await daemonCall(() =>
      withConnection(conn, (d) => d.call<{ snapshot: string; sandboxes: Record<string, unknown>[] }>('sandbox.fork', { id, count })));
    sendJson(c.res, 201, { snapshotId: r.snapshot, sandboxes: r.sandboxes.map(toInfo) });
  });

  router.route('GET', '/snapshots', async (c) => {
    if ([...c.query].length > 0) throw badRequest('GET /snapshots takes no query parameters');
    sendJson(c.res, 200, { snapshots: (await listSnapshotsOn(conn)).map(view) });
  });

  router.route('DELETE', '/snapshots/{snapshot}', async (c) => {
    const ref = c.params.snapshot;
    if (!SNAPSHOT_REF.test(ref)) throw badRequest('bad snapshot id or name');
    const deleted = await daemonCall(() => deleteSnapshotOn(ref, conn));
    if (!deleted) throw new HttpError(404, 'NotFoundError', `no snapshot ${ref}`);
    sendJson(c.res, 200, { deleted: true });
  });
}
