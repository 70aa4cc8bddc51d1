/**
 * /sandboxes: create, list, describe, kill, lifetime, pause and resume,
 * metrics, ports, network rules and log.
 */
import * as nodePath from 'node:path';
import { withConnection } from '../../connection';
import { ErrorCode, SandboxError } from '../../errors';
import { policyParam } from '../../policy';
import { IMAGE_CREATE_TIMEOUT_MS, RECIPE_CREATE_TIMEOUT_MS, Sandbox } from '../../sandbox';
import { type SandboxInfo, type SandboxState, toInfo } from '../../sandbox-info';
import type { NetworkLogEntry, NetworkRules } from '../../sandbox-opts';
import { readJson, sendJson } from '../body';
import { createParams, type ServerCreateOpts } from '../create-params';
import type { ServerContext } from '../context';
import { badRequest, HttpError } from '../errors';
import { checkPath, limitsValue, nonNegInt, onlyKeys, sandboxParam, stringMap } from '../params';
import type { Exchange, Router } from '../router';

/** Network rules from a body: "none", "all" or {allow, deny} of strings. */
function networkValue(v: unknown, what: string): NetworkRules {
  if (v === 'none' || v === 'all') return v;
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw badRequest(`${what} must be "none", "all" or {allow, deny}`);
  const n = v as Record<string, unknown>;
  onlyKeys(n, ['allow', 'deny'], what);
  const out: { allow?: string[]; deny?: string[] } = {};
  for (const k of ['allow', 'deny'] as const) {
    const list = n[k];
    if (list === undefined) continue;
    if (!Array.isArray(list) || list.length > 256 || !list.every((r) => typeof r === 'string' && r !== '' && r.length <= 512)) {
      throw badRequest(`${what}.${k} must be an array of at most 256 rules (non-empty strings)`);
    }
    out[k] = list as string[];
  }
  return out;
}

/** A recipe or policy given as its text: {source, name?, lock?}. */
function textValue(v: unknown, what: string, keys: string[]): { source: string; name?: string; lock?: string } {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw badRequest(`${what} must be {${keys.join(', ')}}`);
  const t = v as Record<string, unknown>;
  onlyKeys(t, keys, what);
  if (typeof t.source !== 'string' || t.source === '') throw badRequest(`${what}.source must be a non-empty string`);
  const out: { source: string; name?: string; lock?: string } = { source: t.source };
  for (const k of ['name', 'lock'] as const) {
    if (t[k] === undefined) continue;
    if (typeof t[k] !== 'string') throw badRequest(`${what}.${k} must be a string`);
    out[k] = t[k] as string;
  }
  return out;
}

/** The options of a create, from its body. */
function createOpts(b: Record<string, unknown>): ServerCreateOpts {
  onlyKeys(b, ['image', 'recipe', 'envs', 'metadata', 'timeoutMs', 'limits', 'cwd', 'network', 'policy', 'volumeMounts', 'snapshot'], 'body');
  if (b.snapshot !== undefined) {
    if (typeof b.snapshot !== 'string' || b.snapshot === '' || b.snapshot.length > 128) throw badRequest('snapshot must be a non-empty string (an id or name)');
  }
  const o: ServerCreateOpts = {};
  if (b.image !== undefined) {
    if (typeof b.image !== 'string' || b.image === '' || b.image.length > 512) throw badRequest('image must be a non-empty string');
    o.image = b.image;
  }
  if (b.recipe !== undefined) o.recipe = typeof b.recipe === 'string' ? b.recipe : textValue(b.recipe, 'recipe', ['source', 'name', 'lock']);
  if (b.envs !== undefined) o.envs = stringMap(b.envs, 'envs');
  if (b.metadata !== undefined) o.metadata = stringMap(b.metadata, 'metadata');
  if (b.timeoutMs !== undefined) o.timeoutMs = nonNegInt(b.timeoutMs, 'timeoutMs');
  if (b.limits !== undefined) o.limits = limitsValue(b.limits);
  if (b.cwd !== undefined) o.cwd = checkPath(b.cwd, 'cwd');
  if (b.network !== undefined) o.network = networkValue(b.network, 'network');
  if (b.policy !== undefined) o.policy = textValue(b.policy, 'policy', ['source', 'name']);
  if (b.volumeMounts !== undefined) o.volumeMounts = stringMap(b.volumeMounts, 'volumeMounts');
  if (b.snapshot !== undefined) o.snapshot = b.snapshot as string;
  return o;
}

/**
 * POST /sandboxes.  The server's own policy (the nearest tupper.lua from
 * its working directory, as the SDK and the CLI send) binds what it makes;
 * a client's policy is taken only when the server has none, so that a
 * client cannot trade the server's policy for a laxer one.  (The daemon's
 * own --policy binds every sandbox whatever is sent.)
 */
async function create(ctx: ServerContext, c: Exchange): Promise<void> {
  const o = createOpts(await readJson(c.req, ctx.maxJson, true));
  const own = await policyParam(undefined);
  if (own !== undefined && o.policy !== undefined) {
    throw new HttpError(403, 'PolicyError', `this server binds its sandboxes with its own policy (${nodePath.basename(own.name)}): a client's policy is not taken`);
  }
  const params = createParams(o);
  if (own !== undefined) params.policy = own;
  // a create naming an image may pull it first, a recipe's first create
  // runs its setup (minutes): its call waits longer
  const wait = ctx.conn.requestTimeoutMs ?? (o.recipe !== undefined ? RECIPE_CREATE_TIMEOUT_MS : o.image !== undefined ? IMAGE_CREATE_TIMEOUT_MS : undefined);
  let r: Record<string, unknown>;
  try {
    r = await withConnection(ctx.conn, (d) => d.call<Record<string, unknown>>('sandbox.create', params, wait !== undefined ? { timeoutMs: wait } : {}));
  } catch (e) {
    // the daemon could not make it (an image it lacks, a limit the host
    // cannot enforce, a recipe that fails): understood but cannot be done
    if (e instanceof SandboxError && e.code === ErrorCode.Sandbox) throw new HttpError(422, 'SandboxError', e.message);
    throw e;
  }
  sendJson(c.res, 201, toInfo(r));
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
    if (!killed) throw new HttpError(404, 'NotFoundError', `no sandbox ${id}`);
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
    // an optional body: {"keepMemory": true|false} writes the pause to disk
    const b = await readJson(c.req, ctx.maxJson, true);
    onlyKeys(b, ['keepMemory'], 'body');
    if (b.keepMemory !== undefined && typeof b.keepMemory !== 'boolean') throw badRequest('keepMemory must be a boolean');
    const opts = b.keepMemory === undefined ? undefined : { keepMemory: b.keepMemory as boolean };
    await boxes.onBox(id, (s) => s.pause(opts));
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

  router.route('POST', '/sandboxes/{id}/ports', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req, ctx.maxJson);
    onlyKeys(b, ['port'], 'body');
    const port = b.port;
    if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) throw badRequest('port must be an integer from 1 to 65535');
    const host = await boxes.onBox(id, (s) => s.getHostAsync(port));
    sendJson(c.res, 200, { port, host });
  });

  router.route('PUT', '/sandboxes/{id}/network', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req, ctx.maxJson);
    onlyKeys(b, ['network'], 'body');
    const network = networkValue(b.network, 'network');
    await boxes.onBox(id, (s) => s.updateNetwork(network));
    sendJson(c.res, 200, { network });
  });

  router.route('GET', '/sandboxes/{id}/network/log', async (c) => {
    const id = sandboxParam(c);
    const entries: NetworkLogEntry[] = await boxes.onBox(id, (s) => s.getNetworkLog());
    sendJson(c.res, 200, { entries });
  });
}
