/**
 * POST /sandboxes/{id}/code: a cell of Python in a sandbox made from the
 * code-interpreter recipe, on the same machinery as the SDK's runCode; the
 * answer is its Execution (E2B's shape) once the cell ends.
 */
import { CODE_MAX_BYTES, DEFAULT_RUN_CODE_TIMEOUT_MS, type RunCodeOpts, runCodeIn } from '../../code-interpreter';
import { readJson, sendJson } from '../body';
import type { ServerContext } from '../context';
import { badRequest } from '../errors';
import { nonNegInt, onlyKeys, sandboxParam, stringMap } from '../params';
import type { Router } from '../router';

/** The cell and its options, from the body. */
function codeBody(b: Record<string, unknown>): { code: string; o: RunCodeOpts } {
  onlyKeys(b, ['code', 'language', 'contextId', 'envs', 'timeoutMs'], 'body');
  if (typeof b.code !== 'string') throw badRequest('code must be a string');
  if (Buffer.byteLength(b.code, 'utf8') > CODE_MAX_BYTES) throw badRequest(`code is at most ${CODE_MAX_BYTES} bytes`);
  const o: RunCodeOpts = { timeoutMs: DEFAULT_RUN_CODE_TIMEOUT_MS };
  if (b.language !== undefined) {
    if (typeof b.language !== 'string') throw badRequest('language must be a string');
    o.language = b.language;
  }
  if (b.contextId !== undefined) {
    if (typeof b.contextId !== 'string' || b.contextId === '' || b.contextId.length > 64) throw badRequest('contextId must be a string of 1 to 64 characters');
    o.context = { id: b.contextId, language: 'python', cwd: '' };
  }
  if (b.envs !== undefined) o.envs = stringMap(b.envs, 'envs');
  if (b.timeoutMs !== undefined) o.timeoutMs = nonNegInt(b.timeoutMs, 'timeoutMs', 24 * 3600 * 1000);
  return { code: b.code, o };
}

export function register(router: Router, ctx: ServerContext): void {
  router.route('POST', '/sandboxes/{id}/code', async (c) => {
    const id = sandboxParam(c);
    const { code, o } = codeBody(await readJson(c.req, ctx.maxJson));
    const e = await ctx.boxes.onBox(id, (s) => runCodeIn(s, code, o));
    sendJson(c.res, 200, e.toJSON());
  });
}
