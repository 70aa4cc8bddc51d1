/**
 * /sandboxes/{id}/files: download and upload (raw bodies, streamed in 1 MiB
 * chunks both ways: a file never sits whole in memory), remove, list, stat,
 * mkdir, rename.
 */
import * as crypto from 'node:crypto';
import * as nodePath from 'node:path';
import { actingAs, fromHome } from '../../account';
import { asBuffer, CHUNK, inChunks } from '../../chunks';
import { type Connection, withConnection } from '../../connection';
import type { EntryInfo } from '../../entry';
import { ErrorCode, NotFoundError, SandboxError } from '../../errors';
import { decodeData } from '../../wire';
import type { BoxCache } from '../box-cache';
import { checkRawLength, drained, readJson, sendJson } from '../body';
import type { ServerContext } from '../context';
import { badRequest, HttpError } from '../errors';
import { checkPath, onlyKeys, pathQuery, sandboxParam, userParam, userQuery } from '../params';
import type { Exchange, Router } from '../router';

/** A file call made directly on the daemon, as the SDK's files make it: its path, and its user param. */
interface FileTarget {
  id: string;
  path: string;
  as: { user?: string };
}

async function target(boxes: BoxCache, c: Exchange): Promise<FileTarget> {
  const id = sandboxParam(c);
  const user = userQuery(c);
  const path = pathQuery(c);
  const a = actingAs(await boxes.box(id), user);
  return { id, path: a.base !== undefined ? fromHome(path, a.base) : path, as: a.user !== undefined ? { user: a.user } : {} };
}

/** The sandbox, path and account of a call on one path through the SDK's files. */
function fileQuery(c: Exchange): { id: string; path: string; user: string | undefined } {
  const id = sandboxParam(c);
  const path = pathQuery(c);
  return { id, path, user: userQuery(c) };
}

/** GET: the file's bytes, read a chunk at a time as the client takes them. */
async function download(d: Connection, c: Exchange, { id, path, as }: FileTarget): Promise<void> {
  let offset = 0;
  let started = false;
  for (;;) {
    const r = await d.call<{ data: string; encoding: string; size: number; eof: boolean }>('fs.read', {
      sandbox: id,
      path,
      offset,
      length: CHUNK,
      encoding: 'base64',
      ...as,
    });
    const bytes = decodeData(r.data, r.encoding);
    if (!started) {
      started = true;
      c.res.writeHead(200, {
        'content-type': 'application/octet-stream',
        'cache-control': 'no-store',
        'x-file-size': String(r.size),
      });
    }
    if (bytes.length > 0) {
      c.res.write(bytes);
      await drained(c.res);
    }
    if (c.res.destroyed) return;
    offset += bytes.length;
    if (r.eof || bytes.length === 0) break;
  }
  c.res.end();
}

/** The request body, refused past max bytes. */
async function* bounded(req: AsyncIterable<Buffer>, max: number): AsyncGenerator<Buffer> {
  let n = 0;
  for await (const chunk of req) {
    n += chunk.length;
    if (n > max) throw new HttpError(413, 'InvalidArgumentError', `a body is at most ${max} bytes`);
    yield chunk;
  }
}

/**
 * Where an upload to path is written first: a new name beside it.  An
 * upload is written under it, then renamed: readers never see half a file,
 * and a refused upload leaves the old file as it was.
 */
function uploadName(path: string): string {
  const dir = nodePath.posix.dirname(path);
  const base = nodePath.posix.basename(path);
  if (base === '' || base === '.' || base === '..' || path.endsWith('/')) throw badRequest(`${path} does not name a file`);
  return nodePath.posix.join(dir, `.${base.slice(0, 200)}.upload-${crypto.randomBytes(6).toString('hex')}`);
}

/**
 * An error about the upload's temporary file, told of the path the client
 * named: the temporary name is the server's business.
 */
function ofTarget(e: unknown, tmp: string, path: string): unknown {
  if (!(e instanceof SandboxError) || !e.message.includes(tmp)) return e;
  const Kind = e.constructor as new (m: string, o: { code?: number; data?: unknown; cause?: unknown }) => SandboxError;
  return new Kind(e.message.split(tmp).join(path), { code: e.code, data: e.data, cause: e });
}

/** PUT: the body written to tmp, then renamed to the target's path. Resolves with the size written. */
async function upload(d: Connection, c: Exchange, { id, path, as }: FileTarget, tmp: string, maxBody: number): Promise<number> {
  let wrote = false;
  try {
    // the file keeps its mode
    let mode: number | undefined;
    try {
      const st = await d.call<{ type: string; mode: number }>('fs.stat', { sandbox: id, path, ...as });
      if (st.type === 'file') mode = st.mode & 0o7777;
    } catch (e) {
      if (!(e instanceof NotFoundError) || e.code === ErrorCode.NotFound) throw e;
    }
    let offset = 0;
    // whole 1 MiB chunks while the body comes; the rest at its end
    for await (const piece of inChunks(bounded(c.req as AsyncIterable<Buffer>, maxBody))) {
      const chunk = asBuffer(piece);
      const params: Record<string, unknown> = { sandbox: id, path: tmp, offset, data: chunk.toString('base64'), encoding: 'base64', ...as };
      if (offset === 0 && mode !== undefined) params.mode = mode;
      wrote = true;
      await d.call('fs.write', params);
      offset += chunk.length;
    }
    await d.call('fs.rename', { sandbox: id, from: tmp, to: path, ...as });
    wrote = false;
    return offset;
  } catch (e) {
    throw ofTarget(e, tmp, path);
  } finally {
    if (wrote) await d.call('fs.remove', { sandbox: id, path: tmp, ...as }).catch(() => {});
  }
}

export function register(router: Router, ctx: ServerContext): void {
  const { boxes, conn, maxBody } = ctx;

  router.route('GET', '/sandboxes/{id}/files', async (c) => {
    const t = await target(boxes, c);
    try {
      await withConnection(conn, (d) => download(d, c, t));
    } catch (e) {
      // once bytes went out, the only honest signal left is a cut response
      if (c.res.headersSent) c.res.destroy(e as Error);
      throw e;
    }
  });

  router.route('PUT', '/sandboxes/{id}/files', async (c) => {
    const t = await target(boxes, c);
    checkRawLength(c.req, maxBody);
    const tmp = uploadName(t.path);
    const size = await withConnection(conn, (d) => upload(d, c, t, tmp, maxBody));
    sendJson(c.res, 200, { path: t.path, size });
  });

  router.route('DELETE', '/sandboxes/{id}/files', async (c) => {
    const { id, path, user } = fileQuery(c);
    await boxes.onBox(id, (s) => s.files.remove(path, { user }));
    sendJson(c.res, 200, { removed: true });
  });

  router.route('GET', '/sandboxes/{id}/files/list', async (c) => {
    const { id, path, user } = fileQuery(c);
    const entries: EntryInfo[] = await boxes.onBox(id, (s) => s.files.list(path, { user }));
    sendJson(c.res, 200, { entries });
  });

  router.route('GET', '/sandboxes/{id}/files/stat', async (c) => {
    const { id, path, user } = fileQuery(c);
    sendJson(c.res, 200, await boxes.onBox(id, (s) => s.files.getInfo(path, { user })));
  });

  router.route('POST', '/sandboxes/{id}/files/mkdir', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req, ctx.maxJson);
    onlyKeys(b, ['path', 'user'], 'body');
    const path = checkPath(b.path, 'path');
    const user = userParam(b.user, 'user');
    const created = await boxes.onBox(id, (s) => s.files.makeDir(path, { user }));
    sendJson(c.res, created ? 201 : 200, { created });
  });

  router.route('POST', '/sandboxes/{id}/files/rename', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req, ctx.maxJson);
    onlyKeys(b, ['from', 'to', 'user'], 'body');
    const from = checkPath(b.from, 'from');
    const to = checkPath(b.to, 'to');
    const user = userParam(b.user, 'user');
    sendJson(c.res, 200, await boxes.onBox(id, (s) => s.files.rename(from, to, { user })));
  });
}
