/**
 * sandbox_create, sandbox_list, sandbox_kill: the session's sandboxes.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { InvalidArgumentError, SandboxError } from '../../errors';
import { DEFAULT_SANDBOX_TIMEOUT_MS, IMAGE_CREATE_TIMEOUT_MS, RECIPE_CREATE_TIMEOUT_MS, Sandbox } from '../../sandbox';
import { sandboxId, stringMap } from '../schemas';
import type { Session } from '../session';
import { ok, tool } from '../tool';

interface CreateArgs {
  image?: string;
  recipe?: string;
  envs?: Record<string, string>;
  metadata?: Record<string, string>;
  timeoutMs?: number;
  memory?: string;
  cpus?: number;
}

/** Creates a sandbox that dies with the session's connection, and adopts it. */
async function create(session: Session, { image, recipe, envs, metadata, timeoutMs, memory, cpus }: CreateArgs): Promise<Record<string, unknown>> {
  const { boxes } = session;
  const { maxSandboxes } = session.limits;
  if (boxes.size >= maxSandboxes) {
    throw new InvalidArgumentError(`this session already has ${boxes.size} sandboxes (at most ${maxSandboxes}); kill one first`);
  }
  const limits: Record<string, unknown> = { timeout: (timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS) / 1000 };
  if (memory !== undefined) limits.memory = memory;
  if (cpus !== undefined) limits.cpus = cpus;
  const params: Record<string, unknown> = { limits, kill_on_disconnect: true };
  if (image !== undefined) params.image = image;
  if (recipe !== undefined) params.recipe = { name: recipe };
  if (envs !== undefined) params.env = envs;
  if (metadata !== undefined) params.metadata = metadata;
  const c = await session.connection();
  // an image not pulled yet is pulled by this create: give it time
  // (a recipe's first use builds its image: longer still)
  const wait = recipe !== undefined ? { timeoutMs: RECIPE_CREATE_TIMEOUT_MS } : image !== undefined ? { timeoutMs: IMAGE_CREATE_TIMEOUT_MS } : {};
  const r = await c.call<{ id: string }>('sandbox.create', params, wait);
  let sbx: Sandbox;
  try {
    sbx = await Sandbox.connect(r.id, session.conn);
  } catch (e) {
    await c.call('sandbox.kill', { id: r.id }).catch(() => {});
    throw e;
  }
  if (session.closed) {
    await sbx.kill().catch(() => false);
    throw new SandboxError('the session closed');
  }
  boxes.set(r.id, sbx);
  const info = await sbx.getInfo();
  return { sandboxId: r.id, endAt: info.endAt?.toISOString() ?? null };
}

export function register(server: McpServer, session: Session): void {
  tool(
    server,
    'sandbox_create',
    {
      title: 'Create a sandbox',
      description:
        'Creates a new isolated Linux sandbox (its own filesystem, processes and network namespace) and returns its id. ' +
        'It lives timeoutMs (default 300000 = 5 minutes; 0 = until killed or the session ends).',
      inputSchema: {
        image: z
          .string()
          .min(1)
          .max(512)
          .optional()
          .describe('The image, e.g. "default" (busybox, the default) or a registry reference such as "python:3.12-slim" (pulled on first use, which may take minutes).'),
        recipe: z
          .string()
          .regex(/^[A-Za-z0-9._-]{1,64}$/)
          .optional()
          .describe('A shipped recipe instead of an image, e.g. "code-interpreter" (Python with Jupyter, numpy, pandas, matplotlib: for run_code) or "python". Its first use builds it (minutes).'),
        envs: stringMap.optional().describe('Environment variables of every command in the sandbox.'),
        metadata: stringMap.optional().describe('Free-form labels, returned by sandbox_list.'),
        timeoutMs: z
          .number()
          .int()
          .min(0)
          .max(7 * 24 * 3600 * 1000)
          .optional()
          .describe('Lifetime in milliseconds (default 300000).'),
        memory: z.string().max(32).optional().describe('Memory limit, e.g. "256M" or "1G".'),
        cpus: z.number().positive().max(1024).optional().describe('CPU quota in cores, e.g. 0.5.'),
      },
    },
    (args) => session.guarded(async () => ok(await create(session, args))),
  );

  tool(
    server,
    'sandbox_list',
    {
      title: 'List sandboxes',
      description: 'Lists the sandboxes this session created and still has.',
      inputSchema: {},
    },
    () =>
      session.guarded(async () => {
        const out: Array<Record<string, unknown>> = [];
        for (const [id, sbx] of [...session.boxes]) {
          try {
            const i = await sbx.getInfo();
            out.push({ sandboxId: id, state: i.state, startedAt: i.startedAt.toISOString(), endAt: i.endAt?.toISOString() ?? null, metadata: i.metadata });
          } catch {
            // gone (its lifetime ran out): forget it
            session.boxes.delete(id);
            await sbx.kill().catch(() => false);
          }
        }
        return ok({ sandboxes: out });
      }),
  );

  tool(
    server,
    'sandbox_kill',
    {
      title: 'Kill a sandbox',
      description: 'Kills a sandbox of this session: every process and file in it is gone.',
      inputSchema: { sandboxId },
    },
    ({ sandboxId: id }) =>
      session.guarded(async () => {
        const sbx = await session.box(id);
        session.boxes.delete(id);
        const killed = await sbx.kill();
        return ok({ sandboxId: id, killed });
      }),
  );
}
