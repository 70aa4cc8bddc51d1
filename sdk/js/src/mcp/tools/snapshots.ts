/**
 * sandbox_snapshot, sandbox_fork, sandbox_restore, snapshot_list,
 * snapshot_delete: filesystem snapshots of the session's sandboxes, and
 * sandboxes made from them (docs/snapshots.md).  Forks and restored
 * sandboxes belong to the session: they die with it, as sandbox_create's.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { InvalidArgumentError, SandboxError } from '../../errors';
import { Sandbox } from '../../sandbox';
import { FORK_MAX, type SnapshotInfo, listSnapshotsOn, deleteSnapshotOn } from '../../snapshot';
import * as S from '../schemas';
import type { Session } from '../session';
import { ok, tool } from '../tool';

const snapshotShape = () => ({
  snapshotId: z.string(),
  names: z.array(z.string()),
  sandboxId: z.string().optional().describe('The sandbox it was taken of.'),
  createdAt: z.string().optional(),
  size: z.number().describe('Bytes of its regular files.'),
  sandboxes: z.array(z.string()).describe('Sandboxes made from it that are alive.'),
});

function describe(s: SnapshotInfo): Record<string, unknown> {
  const v: Record<string, unknown> = { snapshotId: s.snapshotId, names: s.names, size: s.size, sandboxes: s.sandboxes };
  if (s.sandboxId !== undefined) v.sandboxId = s.sandboxId;
  if (s.createdAt !== undefined) v.createdAt = s.createdAt.toISOString();
  return v;
}

const snapshotName = () =>
  z
    .string()
    .min(1)
    .max(128)
    .regex(/^[A-Za-z0-9][A-Za-z0-9_.:-]*$/)
    .refine((n) => !n.includes('..'), 'no ".." in a snapshot name');

/** Adopts sandboxes the daemon made on the session's connection (they die with it). */
async function adoptAll(session: Session, ids: string[]): Promise<string[]> {
  const c = await session.connection();
  const out: string[] = [];
  for (const id of ids) {
    try {
      session.adopt(await Sandbox.connect(id, session.conn), false);
      out.push(id);
    } catch (e) {
      for (const rest of ids.slice(out.length)) await c.call('sandbox.kill', { id: rest }).catch(() => {});
      throw e;
    }
  }
  return out;
}

function room(session: Session, n: number): void {
  const { maxSandboxes } = session.limits;
  if (session.boxes.size + n > maxSandboxes) {
    throw new InvalidArgumentError(
      `this session has ${session.boxes.size} sandboxes; ${n} more would pass its limit of ${maxSandboxes}: kill some first`,
    );
  }
}

export function register(server: McpServer, session: Session): void {
  tool(
    server,
    'sandbox_snapshot',
    {
      title: 'Snapshot a sandbox',
      description:
        "Copies a sandbox's files as they are now into a read-only snapshot (the sandbox is frozen for the copy, then runs on). " +
        'sandbox_restore makes a new sandbox from it; processes and memory are not kept. The copy costs time in proportion to the files.',
      inputSchema: { sandboxId: S.sandboxId(), name: snapshotName().optional().describe('A name for it (unique).') },
      outputSchema: snapshotShape(),
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    },
    ({ sandboxId, name }) =>
      session.guarded(async () => {
        const sbx = await session.box(sandboxId);
        return ok(describe(await sbx.createSnapshot(name !== undefined ? { name } : {})));
      }),
  );

  tool(
    server,
    'sandbox_fork',
    {
      title: 'Fork a sandbox',
      description:
        `Makes count (1 to ${FORK_MAX}) new sandboxes, each with a copy of a sandbox's files as they are now and its env, limits and network rules; ` +
        'each then changes on its own. They belong to this session (killed when it ends).',
      inputSchema: { sandboxId: S.sandboxId(), count: z.number().int().min(1).max(FORK_MAX).optional().describe('How many (default 1).') },
      outputSchema: { snapshotId: z.string(), sandboxIds: z.array(z.string()) },
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    },
    ({ sandboxId, count }) =>
      session.guarded(async () => {
        await session.box(sandboxId);
        const n = count ?? 1;
        room(session, n);
        const c = await session.connection();
        const r = await c.call<{ snapshot: string; sandboxes: Array<{ id: string }> }>('sandbox.fork', {
          id: sandboxId, count: n, kill_on_disconnect: true,
        });
        const ids = await adoptAll(session, r.sandboxes.map((s) => s.id));
        return ok({ snapshotId: r.snapshot, sandboxIds: ids });
      }),
  );

  tool(
    server,
    'sandbox_restore',
    {
      title: 'Make a sandbox from a snapshot',
      description:
        "Creates a new sandbox from a snapshot (by id or name): the snapshot's files, env, limits and network rules, fresh processes. " +
        'It belongs to this session (killed when it ends).',
      inputSchema: { snapshot: z.string().min(1).max(128).describe('The snapshot id or name.') },
      outputSchema: { sandboxId: z.string(), snapshotId: z.string() },
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    },
    ({ snapshot }) =>
      session.guarded(async () => {
        room(session, 1);
        const c = await session.connection();
        const r = await c.call<{ id: string }>('sandbox.create', { snapshot, kill_on_disconnect: true });
        const [id] = await adoptAll(session, [r.id]);
        if (id === undefined) throw new SandboxError('the restored sandbox went away');
        return ok({ sandboxId: id, snapshotId: snapshot });
      }),
  );

  tool(
    server,
    'snapshot_list',
    {
      title: 'List snapshots',
      description: "The daemon's snapshots, oldest first.",
      inputSchema: {},
      outputSchema: { snapshots: z.array(z.object(snapshotShape())) },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    () => session.guarded(async () => ok({ snapshots: (await listSnapshotsOn(session.conn)).map(describe) })),
  );

  tool(
    server,
    'snapshot_delete',
    {
      title: 'Delete a snapshot',
      description: 'Deletes a snapshot (by id or name); refused while a sandbox made from it is alive. deleted is false when there was none.',
      inputSchema: { snapshot: z.string().min(1).max(128).describe('The snapshot id or name.') },
      outputSchema: { snapshot: z.string(), deleted: z.boolean() },
      annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
    },
    ({ snapshot }) => session.guarded(async () => ok({ snapshot, deleted: await deleteSnapshotOn(snapshot, session.conn) })),
  );
}
