/**
 * The HTTP server: its shared state (the context every route group gets),
 * the gate every request passes, the router and its route groups, and the
 * sweep that forgets sandboxes that went away by themselves.
 */
import * as http from 'node:http';
import type * as net from 'node:net';
import { type ConnectionOpts, connectionOpts } from '../connection';
import { InvalidArgumentError } from '../errors';
import { Sandbox } from '../sandbox';
import { DEFAULT_LISTEN, isLoopbackHost, parseListen } from './address';
import { gate } from './auth';
import { sendJson } from './body';
import { BoxCache } from './box-cache';
import type { ServerContext } from './context';
import { errorResponse, HttpError } from './errors';
import { Processes } from './processes';
import { Router } from './router';
import * as code from './routes/code';
import * as commands from './routes/commands';
import * as files from './routes/files';
import * as openapi from './routes/openapi';
import * as sandboxes from './routes/sandboxes';
import * as volumes from './routes/volumes';
import * as snapshots from './routes/snapshots';

export interface HttpServerOpts extends ConnectionOpts {
  /** Bearer token every request must carry; required to listen beyond loopback. */
  token?: string;
  /** Largest JSON body, bytes (default 1 MiB). */
  maxJsonBytes?: number;
  /** Largest raw body (a file upload, stdin), bytes (default 1 GiB). */
  maxBodyBytes?: number;
  /**
   * Most output held for one command stream: what a slow reader has not
   * taken yet, and what a background command keeps for later readers
   * (default 16 MiB).  A foreground command whose reader falls that far
   * behind is killed; a background command's oldest output is dropped.
   */
  maxOutputBytes?: number;
  /** How long a client may take to send a whole request, ms (default 300000; 0: no limit). */
  requestBodyTimeoutMs?: number;
}

export interface TupperHttpServer {
  server: http.Server;
  /** Answers one request (for embedding in another server). */
  handle: (req: http.IncomingMessage, res: http.ServerResponse) => void;
  /** Stops listening, ends open streams, lets go of the daemon. Sandboxes stay. */
  close: () => Promise<void>;
}

/** The state the route groups share. */
function createContext(opts: HttpServerOpts): ServerContext {
  const conn = connectionOpts(opts);
  const maxOutput = opts.maxOutputBytes ?? 16 << 20;
  // a sandbox that is gone: its commands go first, then its Sandbox object
  const boxes: BoxCache = new BoxCache(conn, (id) => processes.forget(id));
  const processes = new Processes(conn, boxes, maxOutput);
  return { conn, maxJson: opts.maxJsonBytes ?? 1 << 20, maxBody: opts.maxBodyBytes ?? 1 << 30, maxOutput, boxes, processes };
}

/** Forgets, every 30 s, the sandboxes that went away by themselves (their lifetime ran out). */
function startSweep(ctx: ServerContext): NodeJS.Timeout {
  const { boxes, processes } = ctx;
  const sweep = setInterval(() => {
    if (boxes.ids().length === 0 && processes.sandboxIds().length === 0) return;
    void Sandbox.list({ ...ctx.conn, limit: 1_000_000 })
      .nextItems()
      .then((all) => {
        const live = new Set(all.map((s) => s.sandboxId));
        for (const id of new Set([...boxes.ids(), ...processes.sandboxIds()])) if (!live.has(id)) boxes.evict(id);
      })
      .catch(() => {});
  }, 30_000);
  sweep.unref();
  return sweep;
}

/** Answers req through router once refuse let it through; an error thrown becomes its JSON answer. */
function answer(
  router: Router,
  refuse: (req: http.IncomingMessage, res: http.ServerResponse) => boolean,
  req: http.IncomingMessage,
  res: http.ServerResponse,
): void {
  const closeAfter = () => {
    // the rest of a refused body is not read: the connection goes
    res.setHeader('connection', 'close');
    res.once('finish', () => req.socket?.destroy());
  };
  void (async () => {
    try {
      if (refuse(req, res)) {
        closeAfter();
        return;
      }
      await router.dispatch(req, res);
    } catch (e) {
      if (res.headersSent) {
        if (!res.writableEnded) res.destroy();
        return;
      }
      const { status, body } = errorResponse(e instanceof URIError ? new HttpError(400, 'InvalidArgumentError', 'bad percent-encoding in the path') : e);
      if (!req.complete) closeAfter();
      sendJson(res, status, body);
    }
  })();
}

/** Makes the server (not listening yet: see listenHttp). */
export function createHttpServer(opts: HttpServerOpts = {}): TupperHttpServer {
  const refuse = gate(opts.token);
  const ctx = createContext(opts);
  const sweep = startSweep(ctx);

  const router = new Router();
  sandboxes.register(router, ctx);
  snapshots.register(router, ctx);
  commands.register(router, ctx);
  code.register(router, ctx);
  files.register(router, ctx);
  volumes.register(router, ctx);
  openapi.register(router);
  router.checkComplete();

  const handle = (req: http.IncomingMessage, res: http.ServerResponse): void => answer(router, refuse, req, res);
  const server = http.createServer({ requestTimeout: opts.requestBodyTimeoutMs ?? 300_000 }, handle);
  server.maxHeadersCount = 64;

  async function close(): Promise<void> {
    clearInterval(sweep);
    await new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections?.();
    });
    ctx.processes.clearBackground();
    await ctx.boxes.close();
    ctx.processes.close('the server is closing');
  }

  return { server, handle, close };
}

/**
 * Makes the server and listens on ADDR:PORT (default 127.0.0.1:8787).
 * Refuses an address that is not loopback unless a token is set.
 */
export async function listenHttp(opts: HttpServerOpts & { listen?: string } = {}): Promise<TupperHttpServer & { url: string }> {
  const { host, port } = parseListen(opts.listen ?? DEFAULT_LISTEN);
  if (!isLoopbackHost(host) && opts.token === undefined) {
    throw new InvalidArgumentError(`refusing to listen on ${host} without a bearer token: pass --token or set TUPPER_HTTP_TOKEN, or listen on 127.0.0.1`);
  }
  const s = createHttpServer(opts);
  await new Promise<void>((resolve, reject) => {
    s.server.once('error', reject);
    s.server.listen(port, host, () => {
      s.server.off('error', reject);
      resolve();
    });
  });
  const addr = s.server.address() as net.AddressInfo;
  const h = addr.family === 'IPv6' || addr.family === (6 as unknown as string) ? `[${addr.address}]` : addr.address;
  return { ...s, url: `http://${h}:${addr.port}` };
}
