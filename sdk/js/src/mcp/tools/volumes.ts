/**
 * volume_create, volume_list, volume_destroy: the daemon's named persistent
 * volumes (docs/volumes.md); sandbox_create's volumeMounts mounts them.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { NotFoundError } from '../../errors';
import { Volume, type VolumeInfo } from '../../volume';
import type { Session } from '../session';
import { ok, tool } from '../tool';

const volumeName = () =>
  z
    .string()
    .min(1)
    .max(63)
    .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/)
    .refine((s) => !s.includes('..'), { message: "a volume's name has no '..'" })
    .describe("The volume's name: letters, digits, '.', '_' and '-', starting with a letter or digit.");

const volumeShape = () => ({
  volumeId: z.string(),
  name: z.string(),
  size: z.number().int().describe('Capacity in bytes.'),
  createdAt: z.string(),
  mountedBy: z.array(z.object({ sandboxId: z.string(), path: z.string() })).describe('The sandbox that mounts it now, and where.'),
});

function describe(v: VolumeInfo): Record<string, unknown> {
  return { volumeId: v.volumeId, name: v.name, size: v.size, createdAt: v.createdAt.toISOString(), mountedBy: v.mountedBy };
}

export function register(server: McpServer, session: Session): void {
  tool(
    server,
    'volume_create',
    {
      title: 'Create a volume',
      description:
        'Makes a named persistent volume: a filesystem of its own size (default 1 GiB) that outlives sandboxes. ' +
        'Mount it with sandbox_create\'s volumeMounts; what a sandbox writes there is there for the next one.',
      inputSchema: {
        name: volumeName(),
        size: z
          .string()
          .regex(/^[0-9]+(\.[0-9]+)?[kKMGT]?$/)
          .optional()
          .describe('Its capacity, e.g. "256M", "2G" (16M to 64G; default 1G).'),
      },
      outputSchema: volumeShape(),
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    },
    ({ name, size }) =>
      session.guarded(async () => {
        const v = await Volume.create(name, { ...session.conn, ...(size !== undefined ? { size } : {}) });
        return ok(describe(await Volume.getInfo(v.volumeId, session.conn)));
      }),
  );

  tool(
    server,
    'volume_list',
    {
      title: 'List volumes',
      description: "Lists the daemon's volumes, with the sandbox that mounts each.",
      inputSchema: {},
      outputSchema: { volumes: z.array(z.object(volumeShape())) },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    () => session.guarded(async () => ok({ volumes: (await Volume.list(session.conn)).map(describe) })),
  );

  tool(
    server,
    'volume_destroy',
    {
      title: 'Destroy a volume',
      description: 'Removes a volume and everything in it. Refused while a sandbox mounts it (the error names the sandbox: kill it first).',
      inputSchema: { name: volumeName() },
      outputSchema: { name: z.string(), destroyed: z.boolean() },
      annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
    },
    ({ name }) =>
      session.guarded(async () => {
        const destroyed = await Volume.destroy(name, session.conn);
        if (!destroyed) throw new NotFoundError(`no volume '${name}'`);
        return ok({ name, destroyed });
      }),
  );
}
