/**
 * sandbox_create, sandbox_list, sandbox_kill, sandbox_port: the session's
 * sandboxes (and kept ones), and the ports they serve.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { InvalidArgumentError, SandboxError } from '../../errors';
import { createParams, type ServerCreateOpts } from '../../http/create-params';
import { policyParam } from '../../policy';
import { DEFAULT_SANDBOX_TIMEOUT_MS, IMAGE_CREATE_TIMEOUT_MS, RECIPE_CREATE_TIMEOUT_MS, Sandbox } from '../../sandbox';
import type { SandboxInfo } from '../../sandbox-info';
import { imagesText } from '../facts';
import * as S from '../schemas';
import { KEEP_KEY, type Session } from '../session';
import { type CallContext, ok, tool, withProgress } from '../tool';

interface CreateArgs extends Omit<ServerCreateOpts, 'policy'> {
  name?: string;
}

function describe(id: string, i: SandboxInfo, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const v: Record<string, unknown> = {
    sandboxId: id,
    state: i.state,
    image: i.templateId,
    startedAt: i.startedAt.toISOString(),
    endAt: i.endAt?.toISOString() ?? null,
    metadata: i.metadata,
    ...extra,
  };
  if (i.defaultUser !== undefined) v.defaultUser = i.defaultUser;
  if (i.home !== undefined) v.home = i.home;
  if (i.workdir !== undefined) v.workdir = i.workdir;
  return v;
}

const sandboxShape = () => ({
  sandboxId: z.string(),
  state: z.string().describe('running or paused.'),
  image: z.string(),
  startedAt: z.string(),
  endAt: z.string().nullable().describe('When its lifetime ends (null: until killed).'),
  metadata: z.record(z.string()),
  defaultUser: z.string().optional().describe('The account commands and file tools act as by default.'),
  home: z.string().optional().describe("That account's home: relative paths and commands start there."),
  workdir: z.string().optional(),
  kept: z.boolean().optional().describe('True for a sandbox kept by name beyond the session.'),
  reused: z.boolean().optional().describe('True when sandbox_create found the kept sandbox of that name and gave it back.'),
});

/** The running kept sandbox of that name, if there is one. */
async function keptNamed(session: Session, name: string): Promise<string | undefined> {
  const all = await Sandbox.list({ ...session.conn, query: { metadata: { [KEEP_KEY]: name } } }).nextItems();
  return all[0]?.sandboxId;
}

/** Creates a sandbox (kept when named, else dying with the session), and adopts it. */
async function create(session: Session, a: CreateArgs, ctx: CallContext): Promise<Record<string, unknown>> {
  const { boxes } = session;
  const { maxSandboxes, progressIntervalMs } = session.limits;
  if (a.name !== undefined) {
    const id = await keptNamed(session, a.name);
    if (id !== undefined) {
      const s = await session.box(id);
      return describe(id, await s.getInfo(), { kept: true, reused: true });
    }
  }
  if (boxes.size >= maxSandboxes) {
    throw new InvalidArgumentError(`this session already has ${boxes.size} sandboxes (at most ${maxSandboxes}); kill one first`);
  }
  const { name, ...opts } = a;
  if (name !== undefined) opts.metadata = { ...opts.metadata, [KEEP_KEY]: name };
  const params = createParams(opts);
  // the server's own policy binds what it makes, as the CLI's and the SDK's creates
  const policy = await policyParam(undefined);
  if (policy !== undefined) params.policy = policy;
  if (name === undefined) params.kill_on_disconnect = true;
  const c = await session.connection();
  // an image not pulled yet is pulled by this create, a recipe's first
  // create runs its setup: give it time, and say so while it lasts
  const long = a.recipe !== undefined ? RECIPE_CREATE_TIMEOUT_MS : a.image !== undefined ? IMAGE_CREATE_TIMEOUT_MS : undefined;
  const t0 = Date.now();
  const what = a.recipe !== undefined ? 'building the recipe' : a.image !== undefined ? `getting image ${a.image}` : 'creating';
  ctx.progress(`${what}...`);
  const r = await withProgress(
    ctx,
    progressIntervalMs,
    () => `${what}: ${Math.round((Date.now() - t0) / 1000)} s`,
    c.call<{ id: string }>('sandbox.create', params, long !== undefined ? { timeoutMs: long } : {}),
  );
  let sbx: Sandbox;
  try {
    sbx = await Sandbox.connect(r.id, session.conn);
  } catch (e) {
    await c.call('sandbox.kill', { id: r.id }).catch(() => {});
    throw e;
  }
  if (session.closed || ctx.signal.aborted) {
    await sbx.kill().catch(() => false);
    throw new SandboxError(session.closed ? 'the session closed' : 'the request was cancelled');
  }
  session.adopt(sbx, name !== undefined);
  const extra: Record<string, unknown> = name !== undefined ? { kept: true } : {};
  return describe(r.id, await sbx.getInfo(), extra);
}

export function register(server: McpServer, session: Session): void {
  const { facts } = session;
  tool(
    server,
    'sandbox_create',
    {
      title: 'Create a sandbox',
      description:
        'Creates a new isolated Linux sandbox (its own filesystem, processes and network namespace) and returns its id, ' +
        'the account commands act as (defaultUser) and its home. ' +
        `Images: ${imagesText(facts)}; another registry reference (e.g. "python:3.12-slim") is pulled on first use, which may take minutes. ` +
        `It lives timeoutMs (default ${DEFAULT_SANDBOX_TIMEOUT_MS}; 0 = until killed or the session ends). No network unless network says so. ` +
        'It is killed when this session ends, unless it has a name: then it is kept, and a later sandbox_create with the same name (in any session) gives it back. ' +
        'A long create (a pull, a recipe setup) sends progress notifications when the request has a progressToken.',
      inputSchema: {
        image: z.string().min(1).max(512).optional().describe(`The image: ${imagesText(facts)}, or a registry reference. Not together with recipe.`),
        recipe: S.recipe().optional(),
        envs: S.stringMap('Environment variables of every command in the sandbox.').optional(),
        metadata: S.stringMap('Free-form labels, returned by sandbox_list.').optional(),
        timeoutMs: z
          .number()
          .int()
          .min(0)
          .max(7 * 24 * 3600 * 1000)
          .optional()
          .describe(`Lifetime in milliseconds (default ${DEFAULT_SANDBOX_TIMEOUT_MS}, or the recipe's).`),
        limits: S.limits().optional(),
        network: S.network().optional(),
        cwd: S.filePath("Default working directory of the sandbox's commands.").optional(),
        name: z
          .string()
          .min(1)
          .max(128)
          .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/)
          .optional()
          .describe('Keep the sandbox beyond this session under this name: a later sandbox_create with the same name gets it back.'),
      },
      outputSchema: sandboxShape(),
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: true },
    },
    (args, ctx) => session.guarded(async () => ok(await create(session, args, ctx))),
  );

  tool(
    server,
    'sandbox_list',
    {
      title: 'List sandboxes',
      description: "Lists this session's sandboxes and the kept (named) sandboxes of this server.",
      inputSchema: {},
      outputSchema: { sandboxes: z.array(z.object(sandboxShape())) },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    () =>
      session.guarded(async () => {
        const out: Array<Record<string, unknown>> = [];
        for (const [id, sbx] of [...session.boxes]) {
          try {
            out.push(describe(id, await sbx.getInfo(), session.kept.has(id) ? { kept: true } : {}));
          } catch {
            // gone (its lifetime ran out): forget it
            session.forget(id);
          }
        }
        const all = await Sandbox.list({ ...session.conn, limit: 1000 }).nextItems();
        for (const i of all) {
          if (i.metadata[KEEP_KEY] !== undefined && !session.boxes.has(i.sandboxId)) out.push(describe(i.sandboxId, i, { kept: true }));
        }
        return ok({ sandboxes: out });
      }),
  );

  tool(
    server,
    'sandbox_kill',
    {
      title: 'Kill a sandbox',
      description: 'Kills a sandbox of this session (or a kept one): every process and file in it is gone.',
      inputSchema: { sandboxId: S.sandboxId() },
      outputSchema: { sandboxId: z.string(), killed: z.boolean() },
      annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
    },
    ({ sandboxId: id }) =>
      session.guarded(async () => {
        const sbx = await session.box(id);
        const killed = await sbx.kill();
        session.forget(id);
        return ok({ sandboxId: id, killed });
      }),
  );

  tool(
    server,
    'sandbox_port',
    {
      title: 'Reach a port of a sandbox',
      description:
        "Forwards a port on the host's loopback to a port a program in the sandbox listens on (on the sandbox's 127.0.0.1) " +
        'and returns the host:port to connect to from the host. Asking again gives the same port.',
      inputSchema: { sandboxId: S.sandboxId(), port: z.number().int().min(1).max(65535).describe('The port inside the sandbox.') },
      outputSchema: { sandboxId: z.string(), port: z.number().int(), host: z.string().describe('host:port on the host (127.0.0.1:PORT).') },
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
    },
    ({ sandboxId: id, port }) =>
      session.guarded(async () => {
        const sbx = await session.box(id);
        return ok({ sandboxId: id, port, host: await sbx.getHost(port) });
      }),
  );
}
