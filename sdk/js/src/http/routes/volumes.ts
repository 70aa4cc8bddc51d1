/**
 * /volumes: create, list, describe and destroy the daemon's volumes
 * (docs/volumes.md); POST /sandboxes's volumeMounts mounts them.
 */
import { RateLimitError } from '../../errors';
import { Volume, type VolumeInfo } from '../../volume';
import { readJson, sendJson } from '../body';
import type { ServerContext } from '../context';
import { badRequest, HttpError } from '../errors';
import { onlyKeys } from '../params';
import type { Exchange, Router } from '../router';

const VOLUME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;

/** The {volume} of the path: a volume's name or id. */
function volumeParam(c: Exchange): string {
  const v = c.params.volume ?? '';
  if (!VOLUME.test(v) || v.includes('..')) throw badRequest(`bad volume name or id ${JSON.stringify(v)}`);
  return v;
}

function wire(v: VolumeInfo): Record<string, unknown> {
  return { volumeId: v.volumeId, name: v.name, size: v.size, createdAt: v.createdAt.toISOString(), mountedBy: v.mountedBy };
}

export function register(router: Router, ctx: ServerContext): void {
  const { conn } = ctx;

  router.route('POST', '/volumes', async (c) => {
    const b = await readJson(c.req, ctx.maxJson);
    onlyKeys(b, ['name', 'size'], 'body');
    if (typeof b.name !== 'string' || b.name === '') throw badRequest('name must be a non-empty string');
    if (b.size !== undefined && !(typeof b.size === 'string' && b.size.length <= 32) && !(typeof b.size === 'number' && Number.isInteger(b.size) && b.size > 0)) {
      throw badRequest('size must be bytes, or a string like "256M"');
    }
    const v = await Volume.create(b.name, { ...conn, ...(b.size !== undefined ? { size: b.size as number | string } : {}) });
    sendJson(c.res, 201, wire(await Volume.getInfo(v.volumeId, conn)));
  });

  router.route('GET', '/volumes', async (c) => {
    sendJson(c.res, 200, { volumes: (await Volume.list(conn)).map(wire) });
  });

  router.route('GET', '/volumes/{volume}', async (c) => {
    sendJson(c.res, 200, wire(await Volume.getInfo(volumeParam(c), conn)));
  });

  router.route('DELETE', '/volumes/{volume}', async (c) => {
    const v = volumeParam(c);
    let destroyed: boolean;
    try {
      destroyed = await Volume.destroy(v, conn);
    } catch (e) {
      // a sandbox mounts it: a conflict, the sandbox named
      if (e instanceof RateLimitError) throw new HttpError(409, 'SandboxError', e.message);
      throw e;
    }
    if (!destroyed) throw new HttpError(404, 'NotFoundError', `no volume ${v}`);
    sendJson(c.res, 200, { destroyed: true });
  });
}
