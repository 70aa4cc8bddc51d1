/**
 * /sandboxes: create, list, describe, kill, lifetime, pause and resume,
 * metrics.
 */
import { ErrorCode, SandboxError } from '../../errors';
import { dropConnection, IMAGE_CREATE_TIMEOUT_MS, Sandbox } from '../../sandbox';
import type { SandboxInfo, SandboxState } from '../../sandbox-info';
import type { SandboxOpts } from '../../sandbox-opts';
import { readJson, sendJson } from '../body';
import type { ServerContext } from '../context';
import { badRequest, HttpError } from '../errors';
import { checkPath, limitsValue, nonNegInt, onlyKeys, sandboxParam, stringMap } from '../params';
import type { Exchange, Router } from '../router';

/** The options of a create, from its body. */
function createOpts(ctx: ServerContext, b: Record<string, unknown>): SandboxOpts {
  onlyKeys(b, ['image', 'envs', 'metadata', 'timeoutMs', 'limits', 'cwd'], 'body');
  const o: SandboxOpts = { ...ctx.conn };
  if (b.image !== undefined) {
    if (typeof b.image !== 'string' || b.image === '' || b.image.length > 512) throw badRequest('image must be a non-empty string');
    o.image = b.image;
  }
  if (b.envs !== undefined) o.envs = stringMap(b.envs, 'envs');
  if (b.metadata !== undefined) o.metadata = stringMap(b.metadata, 'metadata');
  if (b.timeoutMs !== undefined) o.timeoutMs = nonNegInt(b.timeoutMs, 'timeoutMs');
  if (b.limits !== undefined) o.limits = limitsValue(b.limits);
  if (b.cwd !== undefined) o.cwd = checkPath(b.cwd, 'cwd');
  return o;
}

async function create(ctx: ServerContext, c: Exchange): Promise<void> {
  const o = createOpts(ctx, await readJson(c.req, ctx.maxJson, true));
  // a create naming an image may pull it first (minutes): its connection
  // waits longer, and is let go after; later calls use a normal one
  const pulling = o.image !== undefined && ctx.conn.requestTimeoutMs === undefined;
  if (pulling) o.requestTimeoutMs = IMAGE_CREATE_TIMEOUT_MS;
  let s: Sandbox;
  try {
    s = await Sandbox.create(o);
  } catch (e) {
    // the daemon could not make it (an image it lacks, a limit the host
    // cannot enforce): the request is understood but cannot be done
    if (e instanceof SandboxError && e.code === ErrorCode.Sandbox) throw new HttpError(422, e.name, e.message);
    throw e;
  }
  const info = await s.getInfo();
  if (pulling) dropConnection(s);
  else ctx.boxes.remember(s.sandboxId, Promise.resolve(s));
  sendJson(c.res, 201, info);
}

async function list(ctx: ServerContext, c: Exchange): Promise<void> {
  const metadata: Record<string, string> = {};
  let state: SandboxState[] | undefined;
  let limit: number | undefined;
  let nextToken: string | undefined;
  for (const [k, v] of c.query) {
    if (k.startsWith('metadata.') && k.length > 9) metadata[k.slice(9)] = v;
    else if (k === 'state') {
      state = v.split(',') as SandboxState[];
      for (const s of state) if (s !== 'running' && s !== 'paused') throw badRequest(`state: ${s}? (running, paused)`);
    } else if (k === 'limit') {
      if (!/^\d{1,6}$/.test(v) || Number(v) < 1) throw badRequest('limit must be an integer from 1 to 999999');
      limit = Number(v);
    } else if (k === 'nextToken') {
      if (!/^[A-Za-z0-9_-]{1,200}$/.test(v)) throw badRequest('bad nextToken');
      nextToken = v;
    } else throw badRequest(`unknown query parameter ${k}`);
  }
  const query: { metadata?: Record<string, string>; state?: SandboxState[] } = {};
  if (Object.keys(metadata).length) query.metadata = metadata;
  if (state) query.state = state;
  const p = Sandbox.list({ ...ctx.conn, query, ...(limit ? { limit } : {}), ...(nextToken ? { nextToken } : {}) });
  const sandboxes: SandboxInfo[] = await p.nextItems();
  const out: Record<string, unknown> = { sandboxes };
  if (p.nextToken !== undefined) out.nextToken = p.nextToken;
  sendJson(c.res, 200, out);
}

export function register(router: Router, ctx: ServerContext): void {
  const { conn, boxes } = ctx;

  router.route('POST', '/sandboxes', (c) => create(ctx, c));

  router.route('GET', '/sandboxes', (c) => list(ctx, c));

  router.route('GET', '/sandboxes/{id}', async (c) => {
    sendJson(c.res, 200, await Sandbox.getInfo(sandboxParam(c), conn));
  });

  router.route('DELETE', '/sandboxes/{id}', async (c) => {
    const id = sandboxParam(c);
    const killed = await Sandbox.kill(id, conn);
    boxes.evict(id);
    if (!killed) throw new HttpError(404, 'SandboxNotFoundError', `no sandbox ${id}`);
    sendJson(c.res, 200, { killed: true });
  });

  router.route('POST', '/sandboxes/{id}/timeout', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req, ctx.maxJson);
    onlyKeys(b, ['timeoutMs'], 'body');
    await Sandbox.setTimeout(id, nonNegInt(b.timeoutMs, 'timeoutMs'), conn);
    sendJson(c.res, 200, await Sandbox.getInfo(id, conn));
  });

  router.route('POST', '/sandboxes/{id}/pause', async (c) => {
    const id = sandboxParam(c);
    await boxes.onBox(id, (s) => s.pause());
    sendJson(c.res, 200, await Sandbox.getInfo(id, conn));
  });

  router.route('POST', '/sandboxes/{id}/resume', async (c) => {
    const id = sandboxParam(c);
    if (boxes.has(id)) await boxes.onBox(id, (s) => s.resume());
    else {
      // connect resumes a paused sandbox (and leaves a running one be)
      const s = Sandbox.connect(id, conn);
      boxes.remember(id, s);
      await s;
    }
    sendJson(c.res, 200, await Sandbox.getInfo(id, conn));
  });

  router.route('GET', '/sandboxes/{id}/metrics', async (c) => {
    const id = sandboxParam(c);
    const [m] = await boxes.onBox(id, (s) => s.getMetrics());
    sendJson(c.res, 200, m);
  });
}
