/**
 * sandbox_create, sandbox_list, sandbox_kill, sandbox_port: the session's
 * sandboxes (and kept ones), and the ports they serve.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { randomBytes } from 'node:crypto';
import { InvalidArgumentError, NotFoundError, SandboxError } from '../../errors';
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
  background?: boolean;
}

/** A create running in the background (sandbox_create with background: true). */
interface Pending {
  done: boolean;
  result?: Record<string, unknown>;
  error?: unknown;
  settled: Promise<void>;
}

const MAX_PENDING = 16;
const pendingOf = new WeakMap<Session, Map<string, Pending>>();

function pendings(session: Session): Map<string, Pending> {
  let m = pendingOf.get(session);
  if (!m) pendingOf.set(session, (m = new Map()));
  return m;
}

/** A context for work that outlives its request: no progress, never cancelled. */
const DETACHED: CallContext = { signal: new AbortController().signal, wantsProgress: false, progress: () => {} };

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
  ...moreShape(),
});

/** What sandbox_create and sandbox_wait answer: a sandbox, or a create still running (state "creating", createId). */
const createdShape = () => ({
  sandboxId: z.string().optional().describe('The id, once it is made.'),
  state: z.string().describe('running, paused, or creating (a background create still at work: see sandbox_wait).'),
  createId: z.string().optional().describe('The background create to pass to sandbox_wait.'),
  image: z.string().optional(),
  startedAt: z.string().optional(),
  endAt: z.string().nullable().optional().describe('When its lifetime ends (null: until killed).'),
  metadata: z.record(z.string()).optional(),
  ...moreShape(),
});

const moreShape = () => ({
  defaultUser: z.string().optional().describe('The account commands and file tools act as by default.'),
  home: z.string().optional().describe("That account's home: relative paths and commands start there."),
  workdir: z.string().optional(),
  kept: z.boolean().optional().describe('True for a sandbox kept by name beyond the session.'),
  reused: z.boolean().optional().describe('True when sandbox_create found the kept sandbox of that name and gave it back.'),
});

/** Starts create in the background; its result waits for sandbox_wait. */
function startPending(session: Session, args: CreateArgs): Record<string, unknown> {
  const all = pendings(session);
  if (all.size >= MAX_PENDING) {
    const old = [...all].find(([, p]) => p.done);
    if (!old) throw new InvalidArgumentError(`this session already has ${MAX_PENDING} background creates at work: wait for one`);
    all.delete(old[0]);
  }
  const createId = `create-${randomBytes(6).toString('hex')}`;
  const p = { done: false } as Pending;
  p.settled = create(session, args, DETACHED).then(
    (r) => {
      p.result = r;
    },
    (e: unknown) => {
      p.error = e;
    },
  ).finally(() => {
    p.done = true;
  });
  all.set(createId, p);
  return { state: 'creating', createId };
}

/** Waits at most ms for a background create, with progress; its sandbox once made (or its error, thrown). */
async function waitPending(session: Session, createId: string, ms: number, ctx: CallContext): Promise<Record<string, unknown>> {
  const p = pendings(session).get(createId);
  if (!p) throw new NotFoundError(`no background create ${createId} in this session (a finished one is given once)`);
  if (!p.done && ms > 0) {
    const t0 = Date.now();
    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    try {
      await withProgress(
        ctx,
        session.limits.progressIntervalMs,
        () => `creating: ${Math.round((Date.now() - t0) / 1000)} s`,
        Promise.race([
          p.settled,
          new Promise<void>((resolve) => {
            timer = setTimeout(resolve, ms);
            onAbort = () => resolve();
            ctx.signal.addEventListener('abort', onAbort);
          }),
        ]),
      );
    } finally {
      clearTimeout(timer);
      if (onAbort) ctx.signal.removeEventListener('abort', onAbort);
    }
  }
  if (!p.done) return { state: 'creating', createId };
  pendings(session).delete(createId);
  if (p.error !== undefined) throw p.error;
  return p.result!;
}

/** The running kept sandbox of that name, if there is one. */
async function keptNamed(session: Session, name: string): Promise<string | undefined> {
  const all = await Sandbox.list({ ...session.conn, query: { metadata: { [KEEP_KEY]: name } } }).nextItems();
  return all[0]?.sandboxId;
}

/** Creates a sandbox (kept when named, else dying with the session), and adopts it. */
async function create(session: Session, a: CreateArgs, ctx: CallContext): Promise<Record<string, unknown>> {
  const { boxes } = session;
  const { maxSandboxes, progressIntervalMs } = session.limits;
  if (a.background) return startPending(session, { ...a, background: false });
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
  const { name, background: _, ...opts } = a;
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
        'A long create (a pull, a recipe setup) sends progress notifications when the request has a progressToken; ' +
        'with background: true it answers at once with a createId for sandbox_wait.',
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
        volumeMounts: z
          .record(z.string().min(1).max(256))
          .optional()
          .describe('Volumes to mount (volume_create makes them): mount point in the sandbox -> volume name, e.g. {"/mnt/data": "data"}. What is written there outlives the sandbox; one sandbox at a time mounts a volume.'),
        name: z
          .string()
          .min(1)
          .max(128)
          .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/)
          .optional()
          .describe('Keep the sandbox beyond this session under this name: a later sandbox_create with the same name gets it back.'),
        background: z
          .boolean()
          .optional()
          .describe('Answer at once with a createId (state "creating") and make the sandbox meanwhile; sandbox_wait gives it once made.'),
      },
      outputSchema: createdShape(),
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: true },
    },
    (args, ctx) => session.guarded(async () => ok(await create(session, args, ctx))),
  );

  tool(
    server,
    'sandbox_wait',
    {
      title: 'Wait for a background create',
      description:
        'The sandbox a sandbox_create with background: true makes, once made (the same result as sandbox_create), else state "creating". ' +
        'waitMs > 0 waits that long at most first, sending progress notifications when the request has a progressToken. A failed create is a tool error.',
      inputSchema: {
        createId: z.string().min(1).max(64).describe('The createId sandbox_create returned.'),
        waitMs: z.number().int().min(0).max(24 * 3600 * 1000).optional().describe('Wait this long at most (default 0: answer now).'),
      },
      outputSchema: createdShape(),
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    ({ createId, waitMs }, ctx) => session.guarded(async () => ok(await waitPending(session, createId, waitMs ?? 0, ctx))),
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
        return ok({ sandboxId: id, port, host: await sbx.getHostAsync(port) });
      }),
  );
}
