/**
 * The routes of the HTTP API: HTTP_ROUTES lists them all (openapi.json
 * documents each, a test checks), the Router holds their handlers and finds
 * the one of a request.
 */
import type * as http from 'node:http';
import { HttpError } from './errors';

/** Every route, as OpenAPI writes it; openapi.json must document each one (a test checks). */
export const HTTP_ROUTES: ReadonlyArray<{ method: string; path: string }> = [
  ['POST', '/sandboxes'],
  ['GET', '/sandboxes'],
  ['GET', '/sandboxes/{id}'],
  ['DELETE', '/sandboxes/{id}'],
  ['POST', '/sandboxes/{id}/timeout'],
  ['POST', '/sandboxes/{id}/pause'],
  ['POST', '/sandboxes/{id}/resume'],
  ['GET', '/sandboxes/{id}/metrics'],
  ['POST', '/sandboxes/{id}/ports'],
  ['PUT', '/sandboxes/{id}/network'],
  ['GET', '/sandboxes/{id}/network/log'],
  ['POST', '/sandboxes/{id}/snapshots'],
  ['POST', '/sandboxes/{id}/fork'],
  ['GET', '/snapshots'],
  ['DELETE', '/snapshots/{snapshot}'],
  ['POST', '/sandboxes/{id}/commands'],
  ['GET', '/sandboxes/{id}/commands'],
  ['POST', '/sandboxes/{id}/code'],
  ['GET', '/sandboxes/{id}/commands/{pid}'],
  ['DELETE', '/sandboxes/{id}/commands/{pid}'],
  ['POST', '/sandboxes/{id}/commands/{pid}/stdin'],
  ['DELETE', '/sandboxes/{id}/commands/{pid}/stdin'],
  ['GET', '/sandboxes/{id}/files'],
  ['PUT', '/sandboxes/{id}/files'],
  ['DELETE', '/sandboxes/{id}/files'],
  ['GET', '/sandboxes/{id}/files/list'],
  ['GET', '/sandboxes/{id}/files/stat'],
  ['POST', '/sandboxes/{id}/files/mkdir'],
  ['POST', '/sandboxes/{id}/files/rename'],
  ['POST', '/volumes'],
  ['GET', '/volumes'],
  ['GET', '/volumes/{volume}'],
  ['DELETE', '/volumes/{volume}'],
  ['GET', '/openapi.json'],
].map(([method, path]) => ({ method, path }));

/** One request being answered: the request, its response, the path's {params} and the query. */
export interface Exchange {
  req: http.IncomingMessage;
  res: http.ServerResponse;
  params: Record<string, string>;
  query: URLSearchParams;
}

export type Handler = (c: Exchange) => Promise<void>;

interface Route {
  method: string;
  path: string;
  re: RegExp;
  keys: string[];
  handler: Handler;
}

export class Router {
  private readonly routes: Route[] = [];

  /** Adds the handler of a route of HTTP_ROUTES. */
  route(method: string, path: string, handler: Handler): void {
    if (!HTTP_ROUTES.some((r) => r.method === method && r.path === path)) throw new Error(`route ${method} ${path} is not in HTTP_ROUTES`);
    const keys: string[] = [];
    const re = new RegExp('^' + path.replace(/\{(\w+)\}/g, (_, k: string) => (keys.push(k), '([^/]+)')) + '$');
    this.routes.push({ method, path, re, keys, handler });
  }

  /** Throws unless every route of HTTP_ROUTES has a handler. */
  checkComplete(): void {
    if (this.routes.length !== HTTP_ROUTES.length) throw new Error('a route of HTTP_ROUTES has no handler');
  }

  /** Runs the handler of req's route; 404 for no route, 405 for a route without that method. */
  async dispatch(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x');
    let allowed: string[] = [];
    for (const r of this.routes) {
      const m = r.re.exec(url.pathname);
      if (!m) continue;
      if (r.method !== req.method) {
        allowed.push(r.method);
        continue;
      }
      const params: Record<string, string> = {};
      r.keys.forEach((k, i) => {
        params[k] = decodeURIComponent(m[i + 1]);
      });
      await r.handler({ req, res, params, query: url.searchParams });
      return;
    }
    allowed = [...new Set(allowed)];
    if (allowed.length) throw new HttpError(405, 'InvalidArgumentError', `${req.method} is not allowed here (${allowed.join(', ')})`);
    throw new HttpError(404, 'NotFoundError', `no route ${req.method} ${url.pathname}`);
  }
}
