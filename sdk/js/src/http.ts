/**
 * An HTTP API over tupper's sandboxes (node:http, no framework), built on
 * this package's Sandbox.  REST routes for sandboxes, commands (output
 * streamed as NDJSON or server-sent events) and files (raw bodies, streamed
 * in 1 MiB chunks both ways: a file never sits whole in memory).  The routes
 * are HTTP_ROUTES; openapi.json documents each of them (a test checks it).
 *
 * Security: it binds 127.0.0.1 unless told otherwise, and refuses to listen
 * on any other address without a bearer token, which every request must
 * then carry.  Without a token it refuses requests a browser could send on
 * a web page's behalf: any request with an Origin header, or whose Host is
 * not a loopback name (DNS rebinding).  Bodies are bounded (JSON and raw
 * ones separately), and everything from the client is validated.
 */
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import * as nodePath from 'node:path';
import { StringDecoder } from 'node:string_decoder';
import { actingAs, fromHome, startAs } from './account';
import { CHUNK } from './chunks';
import { DEFAULT_COMMAND_TIMEOUT_MS } from './commands';
import { Connection, type ConnectionOpts } from './connection';
import {
  ErrorCode,
  InvalidArgumentError,
  NotEnoughSpaceError,
  NotFoundError,
  PolicyError,
  SandboxError,
  TimeoutError,
} from './errors';
import type { EntryInfo } from './entry';
import { Sandbox } from './sandbox';
import type { SandboxInfo, SandboxState } from './sandbox-info';
import type { SandboxLimits, SandboxOpts } from './sandbox-opts';

/** Where the server listens unless told: loopback only. */
export const DEFAULT_LISTEN = '127.0.0.1:8787';
/** How long a create naming an image may take: a first use pulls it. */
const IMAGE_CREATE_TIMEOUT_MS = 30 * 60_000;
/** Shortest bearer token accepted. */
export const MIN_TOKEN_LENGTH = 16;

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
  ['POST', '/sandboxes/{id}/commands'],
  ['GET', '/sandboxes/{id}/commands'],
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
  ['GET', '/openapi.json'],
].map(([method, path]) => ({ method, path }));

/** An error with an HTTP status, answered as JSON. */
export class HttpError extends Error {
  readonly status: number;
  readonly type: string;
  constructor(status: number, type: string, message: string) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

const ERRNO_STATUS: Record<string, number> = {
  ENOENT: 404,
  EISDIR: 409,
  ENOTDIR: 409,
  EEXIST: 409,
  ENOTEMPTY: 409,
  EBUSY: 409,
  EACCES: 403,
  EPERM: 403,
  EROFS: 403,
  EINVAL: 400,
  ENAMETOOLONG: 400,
  ELOOP: 400,
  EFBIG: 413,
  ENOSPC: 507,
  EDQUOT: 507,
  EAGAIN: 503,
};

/** The status and JSON body of an error. */
export function errorResponse(e: unknown): { status: number; body: { error: Record<string, unknown> } } {
  const err: Record<string, unknown> = {};
  let status = 500;
  if (e instanceof HttpError) {
    status = e.status;
    err.type = e.type;
    err.message = e.message;
  } else if (e instanceof SandboxError) {
    err.type = e.name;
    err.message = e.message;
    if (e.errnoCode) err.code = e.errnoCode;
    if (e instanceof NotFoundError) status = 404;
    else if (e instanceof InvalidArgumentError) status = 400;
    else if (e instanceof TimeoutError) status = 504;
    else if (e instanceof NotEnoughSpaceError) status = 507;
    else if (e instanceof PolicyError) status = 403;
    else if (e.code === -32004) status = 503; // busy: too many requests in flight on one connection
    else if (e.code === -32006) status = 422; // an image error (none such, refused, too big)
    else if (e.errnoCode && ERRNO_STATUS[e.errnoCode]) status = ERRNO_STATUS[e.errnoCode];
    else if (e.code === ErrorCode.Sandbox) status = 409;
    else if (e.code === undefined) status = 502; // the daemon could not be reached
  } else {
    err.type = 'InternalError';
    err.message = e instanceof Error ? e.message : String(e);
  }
  return { status, body: { error: err } };
}

function isLoopbackHost(host: string): boolean {
  const h = host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
  if (h === 'localhost' || h === '::1') return true;
  if (net.isIPv4(h)) return h.startsWith('127.');
  if (h.toLowerCase().startsWith('::ffff:')) return isLoopbackHost(h.slice(7));
  return false;
}

/** Parses ADDR:PORT, [V6]:PORT or PORT. */
export function parseListen(s: string): { host: string; port: number } {
  let host = '127.0.0.1';
  let port: string;
  const m6 = /^\[([0-9a-fA-F:.]+)\]:(\d+)$/.exec(s);
  if (m6) {
    host = m6[1];
    port = m6[2];
  } else if (/^\d+$/.test(s)) {
    port = s;
  } else {
    const i = s.lastIndexOf(':');
    if (i <= 0) throw new InvalidArgumentError(`--listen ${s}: want ADDR:PORT, [IPV6]:PORT or PORT`);
    host = s.slice(0, i);
    port = s.slice(i + 1);
    if (host.includes(':')) throw new InvalidArgumentError(`--listen ${s}: write an IPv6 address in brackets, [::1]:8787`);
  }
  const n = Number(port);
  if (!/^\d+$/.test(port) || !Number.isInteger(n) || n < 0 || n > 65535) throw new InvalidArgumentError(`--listen ${s}: bad port`);
  if (host !== 'localhost' && net.isIP(host) === 0) throw new InvalidArgumentError(`--listen ${s}: the address must be an IP address or localhost`);
  return { host, port: n };
}

function digest(s: string): Buffer {
  return crypto.createHash('sha256').update(s, 'utf8').digest();
}

function sendJson(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': String(Buffer.byteLength(text)),
    'cache-control': 'no-store',
    ...headers,
  });
  res.end(text);
}

/** Waits until the response can take more, or is gone. */
function drained(res: http.ServerResponse): Promise<void> {
  if (!res.writableNeedDrain || res.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

// ---------------------------------------------------------------- validation

const SANDBOX_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const PID = /^[1-9][0-9]{0,9}$/;
const MAX_PATH = 4096;

function checkPath(v: unknown, what: string): string {
  if (typeof v !== 'string' || v === '') throw new HttpError(400, 'InvalidArgumentError', `${what}: a non-empty path is needed`);
  if (v.length > MAX_PATH) throw new HttpError(400, 'InvalidArgumentError', `${what}: longer than ${MAX_PATH} characters`);
  if (v.includes('\0')) throw new HttpError(400, 'InvalidArgumentError', `${what}: a path has no NUL byte`);
  return v;
}

function stringMap(v: unknown, what: string): Record<string, string> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new HttpError(400, 'InvalidArgumentError', `${what} must be an object of strings`);
  const out: Record<string, string> = {};
  for (const [k, x] of Object.entries(v)) {
    if (typeof x !== 'string') throw new HttpError(400, 'InvalidArgumentError', `${what}.${k} must be a string`);
    out[k] = x;
  }
  return out;
}

function nonNegInt(v: unknown, what: string, max = 1e13): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > max) throw new HttpError(400, 'InvalidArgumentError', `${what} must be an integer from 0 to ${max}`);
  return v;
}

function onlyKeys(body: Record<string, unknown>, allowed: string[], what: string): void {
  for (const k of Object.keys(body)) {
    if (!allowed.includes(k)) throw new HttpError(400, 'InvalidArgumentError', `${what}: unknown field ${JSON.stringify(k)} (known: ${allowed.join(', ')})`);
  }
}

function sizeValue(v: unknown, what: string): number | string {
  if (typeof v === 'string' && v.length <= 32) return v;
  if (typeof v === 'number' && Number.isFinite(v) && v >= 0) return v;
  throw new HttpError(400, 'InvalidArgumentError', `${what} must be a size: bytes, or a string like "256M"`);
}

function limitsValue(v: unknown): SandboxLimits {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new HttpError(400, 'InvalidArgumentError', 'limits must be an object');
  const l = v as Record<string, unknown>;
  onlyKeys(l, ['memory', 'cpus', 'pids', 'disk'], 'limits');
  const out: SandboxLimits = {};
  if (l.memory !== undefined) out.memory = sizeValue(l.memory, 'limits.memory');
  if (l.disk !== undefined) out.disk = sizeValue(l.disk, 'limits.disk');
  if (l.cpus !== undefined) {
    if (typeof l.cpus !== 'number' || !(l.cpus > 0) || l.cpus > 4096) throw new HttpError(400, 'InvalidArgumentError', 'limits.cpus must be a positive number');
    out.cpus = l.cpus;
  }
  if (l.pids !== undefined) out.pids = nonNegInt(l.pids, 'limits.pids', 1 << 22);
  return out;
}

// ---------------------------------------------------------------- streams of events

type Event = Record<string, unknown> & { type: string };

/** Writes events as NDJSON lines or server-sent events. */
class EventWriter {
  private readonly res: http.ServerResponse;
  private readonly sse: boolean;
  private readonly max: number;
  private started = false;
  private ended = false;
  private readonly early: Event[] = [];

  constructor(res: http.ServerResponse, sse: boolean, max: number) {
    this.res = res;
    this.sse = sse;
    this.max = max;
  }

  /** Headers go out now, then `first`, then the events sent before. */
  start(first?: Event, status = 200): void {
    if (this.started) return;
    this.started = true;
    this.res.writeHead(status, {
      'content-type': this.sse ? 'text/event-stream; charset=utf-8' : 'application/x-ndjson; charset=utf-8',
      'cache-control': 'no-store',
      'x-accel-buffering': 'no',
    });
    this.res.flushHeaders();
    if (first) this.write(first);
    for (const e of this.early.splice(0)) this.write(e);
  }

  get closed(): boolean {
    return this.ended || this.res.destroyed;
  }

  /** False when the reader fell more than `max` bytes behind. */
  send(e: Event): boolean {
    if (this.closed) return false;
    if (!this.started) {
      this.early.push(e);
      return true;
    }
    return this.write(e);
  }

  private write(e: Event): boolean {
    const json = JSON.stringify(e);
    this.res.write(this.sse ? `event: ${e.type}\ndata: ${json}\n\n` : json + '\n');
    return this.res.writableLength <= this.max;
  }

  end(): void {
    if (this.ended) return;
    this.ended = true;
    if (!this.res.destroyed) this.res.end();
  }
}

function wantsSse(req: http.IncomingMessage): boolean {
  return /\btext\/event-stream\b/i.test(req.headers.accept ?? '');
}

/** A background command's output, kept (bounded) for whoever asks for it. */
interface Background {
  sandboxId: string;
  pid: number;
  events: Event[];
  bytes: number;
  dropped: number;
  done: boolean;
  readers: Set<(e: Event) => void>;
  expiry?: NodeJS.Timeout;
}

/** The exit event of a process.exit notification, worded as the SDK's CommandResult. */
function exitEvent(p: Record<string, unknown>): Event {
  const exitCode = typeof p.exit_code === 'number' ? p.exit_code : -1;
  const signal = typeof p.signal === 'number' ? p.signal : 0;
  const ev: Event = { type: 'exit', exitCode };
  if (signal) ev.error = signal === 9 ? 'signal: killed' : `signal: ${signal}`;
  else if (exitCode !== 0) ev.error = `exit status ${exitCode}`;
  if (p.timed_out === true) ev.timedOut = true;
  return ev;
}

// ---------------------------------------------------------------- the server

interface StartOpts {
  cwd?: string;
  /** The account (default: the sandbox's default account, as the SDK). */
  user?: string;
  envs?: Record<string, string>;
  timeoutMs?: number;
  stdin?: boolean;
}

interface Ctx {
  req: http.IncomingMessage;
  res: http.ServerResponse;
  params: Record<string, string>;
  query: URLSearchParams;
}

type Handler = (c: Ctx) => Promise<void>;

interface Route {
  method: string;
  path: string;
  re: RegExp;
  keys: string[];
  handler: Handler;
}

/** The spec served at /openapi.json: sdk/js/openapi.json. */
export function openApiPath(): string {
  return nodePath.join(__dirname, '..', 'openapi.json');
}

export interface TupperHttpServer {
  server: http.Server;
  /** Answers one request (for embedding in another server). */
  handle: (req: http.IncomingMessage, res: http.ServerResponse) => void;
  /** Stops listening, ends open streams, lets go of the daemon. Sandboxes stay. */
  close: () => Promise<void>;
}

/** Makes the server (not listening yet: see listenHttp). */
export function createHttpServer(opts: HttpServerOpts = {}): TupperHttpServer {
  const conn: ConnectionOpts = {};
  if (opts.socket !== undefined) conn.socket = opts.socket;
  if (opts.requestTimeoutMs !== undefined) conn.requestTimeoutMs = opts.requestTimeoutMs;
  if (opts.token !== undefined && opts.token.length < MIN_TOKEN_LENGTH) {
    throw new InvalidArgumentError(`the bearer token must be at least ${MIN_TOKEN_LENGTH} characters`);
  }
  const tokenDigest = opts.token !== undefined ? digest(opts.token) : undefined;
  const maxJson = opts.maxJsonBytes ?? 1 << 20;
  const maxBody = opts.maxBodyBytes ?? 1 << 30;
  const maxOutput = opts.maxOutputBytes ?? 16 << 20;
  let spec: string | undefined;

  // one Sandbox object (one daemon connection) per sandbox used here
  const boxes = new Map<string, Promise<Sandbox>>();
  const background = new Map<string, Background>();
  const MAX_BACKGROUND = 1024;
  const KEEP_FINISHED_MS = 10 * 60_000;

  function dropConnection(s: Sandbox): void {
    // a Sandbox has no public "disconnect"; its connection is closed here so
    // a sandbox that is gone (or the server closing) leaves no socket open
    const c = (s as unknown as { conn?: { close?: () => void } }).conn;
    c?.close?.();
  }

  /** Ends the streams of a sandbox's commands that will hear no more. */
  function failProcs(id: string, message: string): void {
    for (const [k, fn] of [...procs]) {
      if (k.startsWith(`${id}/`)) {
        procs.delete(k);
        fn({ type: 'error', error: { type: 'SandboxError', message } });
      }
    }
  }

  function dropProcConn(id: string, why: string): void {
    const c = procConns.get(id);
    if (!c) return;
    procConns.delete(id);
    // close() runs no close handler: the streams are ended here
    failProcs(id, why);
    void c.then((x) => x.close(), () => {});
  }

  function evict(id: string): void {
    dropProcConn(id, `sandbox ${id} is gone`);
    for (const [k, b] of background) {
      if (b.sandboxId === id) {
        if (b.expiry) clearTimeout(b.expiry);
        background.delete(k);
      }
    }
    const p = boxes.get(id);
    if (!p) return;
    boxes.delete(id);
    void p.then(dropConnection, () => {});
  }

  /** After a NotFoundError: forget the sandbox if it is gone (and not just a process or file). */
  function checkGone(id: string, e: unknown): void {
    if (!(e instanceof NotFoundError) || e.code !== ErrorCode.NotFound) return;
    void Sandbox.getInfo(id, conn).then(
      () => {},
      (err: unknown) => {
        if (err instanceof NotFoundError) evict(id);
      },
    );
  }

  function box(id: string): Promise<Sandbox> {
    let p = boxes.get(id);
    if (!p) {
      // Sandbox.connect resumes a paused sandbox: only POST .../resume may
      p = Sandbox.getInfo(id, conn).then((info) => {
        if (info.state === 'paused') throw new HttpError(409, 'SandboxPaused', `sandbox ${id} is paused: POST /sandboxes/${id}/resume first`);
        return Sandbox.connect(id, conn);
      });
      boxes.set(id, p);
      p.catch(() => boxes.delete(id));
    }
    return p;
  }

  async function onBox<T>(id: string, fn: (s: Sandbox) => Promise<T>): Promise<T> {
    const s = await box(id);
    try {
      return await fn(s);
    } catch (e) {
      checkGone(id, e);
      throw e;
    }
  }

  // Commands run over a connection of their own per sandbox, not through
  // the SDK's CommandHandle: a handle keeps all the output it ever saw,
  // and this server must hold at most maxOutputBytes per command.
  const procConns = new Map<string, Promise<Connection>>();
  const procs = new Map<string, (e: Event) => void>();

  function procConn(id: string): Promise<Connection> {
    let p = procConns.get(id);
    if (!p) {
      p = Connection.open(conn).then((c) => {
        c.onClose((err) => {
          if (procConns.get(id) === p) procConns.delete(id);
          failProcs(id, err.message);
        });
        return c;
      });
      procConns.set(id, p);
      p.catch(() => procConns.delete(id));
    }
    return p;
  }

  /** Starts cmd; `onEvent` gets its stdout and stderr, then exit (or error). Resolves with its pid. */
  async function start(id: string, cmd: string, o: StartOpts, onEvent: (e: Event) => void): Promise<number> {
    const c = await procConn(id);
    const timeoutMs = o.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
    const params: Record<string, unknown> = { sandbox: id, cmd, encoding: 'utf8' };
    // the SDK's defaults: the sandbox's default account, in its home
    Object.assign(params, startAs(await box(id), o.user, o.cwd));
    if (o.envs !== undefined) params.env = o.envs;
    if (o.stdin) params.stdin = true;
    if (timeoutMs > 0) params.timeout = timeoutMs / 1000;
    const dec = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
    const flush = () => {
      for (const stream of ['stdout', 'stderr'] as const) {
        const rest = dec[stream].end();
        if (rest) onEvent({ type: stream, data: rest });
      }
    };
    try {
      const r = await c.call<{ pid: number }>('process.start', params, {
        // subscribed before the next line is read: output may follow the reply at once
        onResult: (r) => {
          const key = `${id}/${r.pid}`;
          procs.set(key, onEvent);
          c.subscribe(id, r.pid, (method, p) => {
            if (method === 'process.output') {
              const stream = p.stream === 'stderr' ? 'stderr' : 'stdout';
              const data = typeof p.data === 'string' ? p.data : '';
              // a chunk that is not valid UTF-8 comes as base64; the decoder
              // joins characters split across chunks
              const text = dec[stream].write(Buffer.from(data, p.encoding === 'utf8' ? 'utf8' : 'base64'));
              if (text) onEvent({ type: stream, data: text });
            } else if (method === 'process.exit') {
              c.unsubscribe(id, r.pid);
              procs.delete(key);
              flush();
              onEvent(exitEvent(p));
            }
          });
        },
      });
      return r.pid;
    } catch (e) {
      checkGone(id, e);
      throw e;
    }
  }

  async function signal(id: string, pid: number): Promise<void> {
    const c = await procConn(id);
    await c.call('process.signal', { sandbox: id, pid, signal: 'KILL' });
  }

  // forget sandboxes that went away by themselves (their lifetime ran out)
  const sweep = setInterval(() => {
    if (boxes.size === 0 && procConns.size === 0) return;
    void Sandbox.list({ ...conn, limit: 1_000_000 })
      .nextItems()
      .then((all) => {
        const live = new Set(all.map((s) => s.sandboxId));
        for (const id of new Set([...boxes.keys(), ...procConns.keys()])) if (!live.has(id)) evict(id);
      })
      .catch(() => {});
  }, 30_000);
  sweep.unref();

  const routes: Route[] = [];
  function route(method: string, path: string, handler: Handler): void {
    if (!HTTP_ROUTES.some((r) => r.method === method && r.path === path)) throw new Error(`route ${method} ${path} is not in HTTP_ROUTES`);
    const keys: string[] = [];
    const re = new RegExp('^' + path.replace(/\{(\w+)\}/g, (_, k: string) => (keys.push(k), '([^/]+)')) + '$');
    routes.push({ method, path, re, keys, handler });
  }

  async function readJson(req: http.IncomingMessage, optional = false): Promise<Record<string, unknown>> {
    const len = req.headers['content-length'];
    const chunked = req.headers['transfer-encoding'] !== undefined;
    if (optional && !chunked && (len === undefined || len === '0')) return {};
    const type = req.headers['content-type'] ?? '';
    if (!/^application\/json\s*(;|$)/i.test(type)) throw new HttpError(415, 'UnsupportedMediaType', 'send the body as Content-Type: application/json');
    if (len !== undefined && Number(len) > maxJson) throw new HttpError(413, 'PayloadTooLarge', `a JSON body is at most ${maxJson} bytes`);
    const parts: Buffer[] = [];
    let n = 0;
    for await (const chunk of req as AsyncIterable<Buffer>) {
      n += chunk.length;
      if (n > maxJson) throw new HttpError(413, 'PayloadTooLarge', `a JSON body is at most ${maxJson} bytes`);
      parts.push(chunk);
    }
    let v: unknown;
    try {
      v = JSON.parse(Buffer.concat(parts).toString('utf8'));
    } catch {
      throw new HttpError(400, 'InvalidArgumentError', 'the body is not valid JSON');
    }
    if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new HttpError(400, 'InvalidArgumentError', 'the body must be a JSON object');
    return v as Record<string, unknown>;
  }

  function checkRawLength(req: http.IncomingMessage): void {
    const len = req.headers['content-length'];
    if (len !== undefined && Number(len) > maxBody) throw new HttpError(413, 'PayloadTooLarge', `a body is at most ${maxBody} bytes`);
  }

  function sandboxParam(c: Ctx): string {
    const id = c.params.id;
    if (!SANDBOX_ID.test(id)) throw new HttpError(400, 'InvalidArgumentError', 'bad sandbox id');
    return id;
  }

  function pidParam(c: Ctx): number {
    if (!PID.test(c.params.pid)) throw new HttpError(400, 'InvalidArgumentError', 'bad pid');
    return Number(c.params.pid);
  }

  function pathQuery(c: Ctx, name = 'path'): string {
    return checkPath(c.query.get(name) ?? undefined, `query parameter ${name}`);
  }

  /** An account name (`user` of a body or query), as the daemon accepts them. */
  function userParam(v: unknown, what: string): string | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'string' || !/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$/.test(v)) {
      throw new HttpError(400, 'InvalidArgumentError', `${what} must be an account name (letters, digits, _ . -; at most 32)`);
    }
    return v;
  }

  function userQuery(c: Ctx): string | undefined {
    return userParam(c.query.get('user') ?? undefined, 'query parameter user');
  }

  /** path and the user param of a file call made directly on the daemon: as the SDK's files do. */
  async function fileAs(id: string, user: string | undefined, path: string): Promise<{ path: string; as: { user?: string } }> {
    const a = actingAs(await box(id), user);
    return { path: a.base !== undefined ? fromHome(path, a.base) : path, as: a.user !== undefined ? { user: a.user } : {} };
  }

  // ------------------------------------------------------------ sandboxes

  route('POST', '/sandboxes', async (c) => {
    const b = await readJson(c.req, true);
    onlyKeys(b, ['image', 'envs', 'metadata', 'timeoutMs', 'limits', 'cwd'], 'body');
    const o: SandboxOpts = { ...conn };
    if (b.image !== undefined) {
      if (typeof b.image !== 'string' || b.image === '' || b.image.length > 512) throw new HttpError(400, 'InvalidArgumentError', 'image must be a non-empty string');
      o.image = b.image;
    }
    if (b.envs !== undefined) o.envs = stringMap(b.envs, 'envs');
    if (b.metadata !== undefined) o.metadata = stringMap(b.metadata, 'metadata');
    if (b.timeoutMs !== undefined) o.timeoutMs = nonNegInt(b.timeoutMs, 'timeoutMs');
    if (b.limits !== undefined) o.limits = limitsValue(b.limits);
    if (b.cwd !== undefined) o.cwd = checkPath(b.cwd, 'cwd');
    // a create naming an image may pull it first (minutes): its connection
    // waits longer, and is let go after; later calls use a normal one
    const pulling = o.image !== undefined && opts.requestTimeoutMs === undefined;
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
    else boxes.set(s.sandboxId, Promise.resolve(s));
    sendJson(c.res, 201, info);
  });

  route('GET', '/sandboxes', async (c) => {
    const metadata: Record<string, string> = {};
    let state: SandboxState[] | undefined;
    let limit: number | undefined;
    let nextToken: string | undefined;
    for (const [k, v] of c.query) {
      if (k.startsWith('metadata.') && k.length > 9) metadata[k.slice(9)] = v;
      else if (k === 'state') {
        state = v.split(',') as SandboxState[];
        for (const s of state) if (s !== 'running' && s !== 'paused') throw new HttpError(400, 'InvalidArgumentError', `state: ${s}? (running, paused)`);
      } else if (k === 'limit') {
        if (!/^\d{1,6}$/.test(v) || Number(v) < 1) throw new HttpError(400, 'InvalidArgumentError', 'limit must be an integer from 1 to 999999');
        limit = Number(v);
      } else if (k === 'nextToken') {
        if (!/^\d{1,9}$/.test(v)) throw new HttpError(400, 'InvalidArgumentError', 'bad nextToken');
        nextToken = v;
      } else throw new HttpError(400, 'InvalidArgumentError', `unknown query parameter ${k}`);
    }
    const query: { metadata?: Record<string, string>; state?: SandboxState[] } = {};
    if (Object.keys(metadata).length) query.metadata = metadata;
    if (state) query.state = state;
    const p = Sandbox.list({ ...conn, query, ...(limit ? { limit } : {}), ...(nextToken ? { nextToken } : {}) });
    const sandboxes: SandboxInfo[] = await p.nextItems();
    const out: Record<string, unknown> = { sandboxes };
    if (p.nextToken !== undefined) out.nextToken = p.nextToken;
    sendJson(c.res, 200, out);
  });

  route('GET', '/sandboxes/{id}', async (c) => {
    sendJson(c.res, 200, await Sandbox.getInfo(sandboxParam(c), conn));
  });

  route('DELETE', '/sandboxes/{id}', async (c) => {
    const id = sandboxParam(c);
    const killed = await Sandbox.kill(id, conn);
    evict(id);
    if (!killed) throw new HttpError(404, 'SandboxNotFoundError', `no sandbox ${id}`);
    sendJson(c.res, 200, { killed: true });
  });

  route('POST', '/sandboxes/{id}/timeout', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req);
    onlyKeys(b, ['timeoutMs'], 'body');
    await Sandbox.setTimeout(id, nonNegInt(b.timeoutMs, 'timeoutMs'), conn);
    sendJson(c.res, 200, await Sandbox.getInfo(id, conn));
  });

  route('POST', '/sandboxes/{id}/pause', async (c) => {
    const id = sandboxParam(c);
    await onBox(id, (s) => s.pause());
    sendJson(c.res, 200, await Sandbox.getInfo(id, conn));
  });

  route('POST', '/sandboxes/{id}/resume', async (c) => {
    const id = sandboxParam(c);
    const cached = boxes.get(id);
    if (cached) await onBox(id, (s) => s.resume());
    else {
      // connect resumes a paused sandbox (and leaves a running one be)
      const s = Sandbox.connect(id, conn);
      boxes.set(id, s);
      s.catch(() => boxes.delete(id));
      await s;
    }
    sendJson(c.res, 200, await Sandbox.getInfo(id, conn));
  });

  route('GET', '/sandboxes/{id}/metrics', async (c) => {
    const id = sandboxParam(c);
    const [m] = await onBox(id, (s) => s.getMetrics());
    sendJson(c.res, 200, m);
  });

  // ------------------------------------------------------------ commands

  route('POST', '/sandboxes/{id}/commands', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req);
    onlyKeys(b, ['cmd', 'cwd', 'envs', 'timeoutMs', 'stdin', 'background', 'user'], 'body');
    if (typeof b.cmd !== 'string' || b.cmd === '') throw new HttpError(400, 'InvalidArgumentError', 'cmd must be a non-empty string');
    const o: StartOpts = {};
    if (b.cwd !== undefined) o.cwd = checkPath(b.cwd, 'cwd');
    if (b.user !== undefined) o.user = userParam(b.user, 'user');
    if (b.envs !== undefined) o.envs = stringMap(b.envs, 'envs');
    if (b.timeoutMs !== undefined) o.timeoutMs = nonNegInt(b.timeoutMs, 'timeoutMs');
    if (b.stdin !== undefined) {
      if (typeof b.stdin !== 'boolean') throw new HttpError(400, 'InvalidArgumentError', 'stdin must be a boolean');
      o.stdin = b.stdin;
    }
    if (b.background !== undefined && typeof b.background !== 'boolean') throw new HttpError(400, 'InvalidArgumentError', 'background must be a boolean');
    const cmd = b.cmd;
    if (b.background === true) return startBackground(c, id, cmd, o);

    const out = new EventWriter(c.res, wantsSse(c.req), maxOutput);
    let pid = 0;
    let ended = false;
    let overflow = false;
    const kill = () => void signal(id, pid).catch(() => {});
    let finish!: (e: Event) => void;
    const end = new Promise<Event>((resolve) => (finish = resolve));
    pid = await start(id, cmd, o, (e) => {
      if (e.type === 'exit' || e.type === 'error') {
        ended = true;
        finish(e);
      } else if (!overflow && !out.send(e)) {
        // the reader does not keep up: the command is killed rather than
        // its output piling up here without bound
        overflow = true;
        out.send({ type: 'error', error: { type: 'OutputOverflow', message: `the client read too slowly (over ${maxOutput} bytes waiting): the command was killed` } });
        kill();
      }
    });
    out.start({ type: 'start', pid });
    c.res.on('close', () => {
      // the client went away before the end: a foreground command goes too
      if (!ended) kill();
    });
    const ev = await end;
    if (!overflow) out.send(ev);
    out.end();
  });

  async function startBackground(c: Ctx, id: string, cmd: string, o: StartOpts): Promise<void> {
    if (background.size >= MAX_BACKGROUND) {
      for (const [k, b] of background) {
        if (b.done) {
          if (b.expiry) clearTimeout(b.expiry);
          background.delete(k);
          break;
        }
      }
      if (background.size >= MAX_BACKGROUND) throw new HttpError(503, 'TooManyCommands', `${MAX_BACKGROUND} background commands are followed already`);
    }
    const rec: Background = { sandboxId: id, pid: 0, events: [], bytes: 0, dropped: 0, done: false, readers: new Set() };
    let key = '';
    const add = (e: Event) => {
      const n = typeof e.data === 'string' ? e.data.length : 0;
      rec.events.push(e);
      rec.bytes += n;
      while (rec.bytes > maxOutput && rec.events.length > 1) {
        const old = rec.events.shift()!;
        const m = typeof old.data === 'string' ? old.data.length : 0;
        rec.bytes -= m;
        rec.dropped += m;
      }
      for (const r of [...rec.readers]) r(e);
      if (e.type === 'exit' || e.type === 'error') {
        rec.done = true;
        rec.readers.clear();
        rec.expiry = setTimeout(() => {
          if (background.get(key) === rec) background.delete(key);
        }, KEEP_FINISHED_MS);
        rec.expiry.unref();
      }
    };
    rec.pid = await start(id, cmd, o, add);
    key = `${id}/${rec.pid}`;
    background.set(key, rec);
    sendJson(c.res, 201, { pid: rec.pid });
  }

  route('GET', '/sandboxes/{id}/commands', async (c) => {
    const id = sandboxParam(c);
    const procs = await onBox(id, (s) => s.commands.list());
    sendJson(c.res, 200, { processes: procs });
  });

  route('GET', '/sandboxes/{id}/commands/{pid}', async (c) => {
    const id = sandboxParam(c);
    const pid = pidParam(c);
    const rec = background.get(`${id}/${pid}`);
    if (!rec) {
      throw new HttpError(404, 'NotFoundError', `no background command ${pid} started through this server in sandbox ${id} (or it ended over 10 minutes ago)`);
    }
    const out = new EventWriter(c.res, wantsSse(c.req), maxOutput);
    out.start();
    if (rec.dropped > 0) out.send({ type: 'dropped', bytes: rec.dropped });
    for (const e of rec.events) out.send(e);
    if (rec.done) return out.end();
    await new Promise<void>((resolve) => {
      const reader = (e: Event) => {
        if (!out.send(e)) {
          out.send({ type: 'error', error: { type: 'OutputOverflow', message: 'the client read too slowly; the command runs on' } });
          finish();
        } else if (e.type === 'exit' || e.type === 'error') finish();
      };
      const finish = () => {
        rec.readers.delete(reader);
        out.end();
        resolve();
      };
      rec.readers.add(reader);
      c.res.once('close', finish);
    });
  });

  route('DELETE', '/sandboxes/{id}/commands/{pid}', async (c) => {
    const id = sandboxParam(c);
    const pid = pidParam(c);
    const killed = await onBox(id, (s) => s.commands.kill(pid));
    if (!killed) throw new HttpError(404, 'NotFoundError', `no process ${pid} in sandbox ${id}`);
    sendJson(c.res, 200, { killed: true });
  });

  route('POST', '/sandboxes/{id}/commands/{pid}/stdin', async (c) => {
    const id = sandboxParam(c);
    const pid = pidParam(c);
    checkRawLength(c.req);
    const s = await box(id);
    let n = 0;
    for await (const chunk of c.req as AsyncIterable<Buffer>) {
      n += chunk.length;
      if (n > maxBody) throw new HttpError(413, 'PayloadTooLarge', `a body is at most ${maxBody} bytes (the first ${n - chunk.length} were written)`);
      await onBox(id, () => s.commands.sendStdin(pid, chunk));
    }
    sendJson(c.res, 200, { written: n });
  });

  route('DELETE', '/sandboxes/{id}/commands/{pid}/stdin', async (c) => {
    const id = sandboxParam(c);
    const pid = pidParam(c);
    await onBox(id, (s) => s.commands.closeStdin(pid));
    sendJson(c.res, 200, { closed: true });
  });

  // ------------------------------------------------------------ files

  route('GET', '/sandboxes/{id}/files', async (c) => {
    const id = sandboxParam(c);
    const { path, as } = await fileAs(id, userQuery(c), pathQuery(c));
    const d = await Connection.open(conn);
    try {
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
        const bytes = Buffer.from(r.data, r.encoding === 'utf8' ? 'utf8' : 'base64');
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
    } catch (e) {
      // once bytes went out, the only honest signal left is a cut response
      if (c.res.headersSent) c.res.destroy(e as Error);
      throw e;
    } finally {
      d.close();
    }
  });

  route('PUT', '/sandboxes/{id}/files', async (c) => {
    const id = sandboxParam(c);
    const { path, as } = await fileAs(id, userQuery(c), pathQuery(c));
    checkRawLength(c.req);
    const dir = nodePath.posix.dirname(path);
    const base = nodePath.posix.basename(path);
    if (base === '' || base === '.' || base === '..' || path.endsWith('/')) throw new HttpError(400, 'InvalidArgumentError', `${path} does not name a file`);
    // written under a temporary name, then renamed: readers never see half a
    // file, and a refused upload leaves the old file as it was
    const tmp = nodePath.posix.join(dir, `.${base.slice(0, 200)}.upload-${crypto.randomBytes(6).toString('hex')}`);
    const d = await Connection.open(conn);
    let wrote = false;
    try {
      let mode: number | undefined;
      try {
        const st = await d.call<{ type: string; mode: number }>('fs.stat', { sandbox: id, path, ...as });
        if (st.type === 'file') mode = st.mode & 0o7777;
      } catch (e) {
        if (!(e instanceof NotFoundError) || e.code === ErrorCode.NotFound) throw e;
      }
      let offset = 0;
      let pending: Buffer[] = [];
      let pendingLen = 0;
      const put = async (chunk: Buffer) => {
        const params: Record<string, unknown> = { sandbox: id, path: tmp, offset, data: chunk.toString('base64'), encoding: 'base64', ...as };
        if (offset === 0 && mode !== undefined) params.mode = mode;
        wrote = true;
        await d.call('fs.write', params);
        offset += chunk.length;
      };
      // whole 1 MiB chunks while the body comes; the rest at its end
      const flush = async (final: boolean) => {
        if (pendingLen < CHUNK && !final) return;
        let buf = Buffer.concat(pending, pendingLen);
        while (buf.length >= CHUNK || (final && buf.length > 0)) {
          const n = Math.min(CHUNK, buf.length);
          await put(buf.subarray(0, n));
          buf = buf.subarray(n);
        }
        pending = buf.length ? [buf] : [];
        pendingLen = buf.length;
        if (final && offset === 0) await put(Buffer.alloc(0));
      };
      for await (const chunk of c.req as AsyncIterable<Buffer>) {
        if (offset + pendingLen + chunk.length > maxBody) throw new HttpError(413, 'PayloadTooLarge', `a body is at most ${maxBody} bytes`);
        pending.push(chunk);
        pendingLen += chunk.length;
        if (pendingLen >= CHUNK) await flush(false);
      }
      await flush(true);
      await d.call('fs.rename', { sandbox: id, from: tmp, to: path, ...as });
      wrote = false;
      sendJson(c.res, 200, { path, size: offset });
    } finally {
      if (wrote) await d.call('fs.remove', { sandbox: id, path: tmp, ...as }).catch(() => {});
      d.close();
    }
  });

  route('DELETE', '/sandboxes/{id}/files', async (c) => {
    const id = sandboxParam(c);
    const path = pathQuery(c);
    const user = userQuery(c);
    await onBox(id, (s) => s.files.remove(path, { user }));
    sendJson(c.res, 200, { removed: true });
  });

  route('GET', '/sandboxes/{id}/files/list', async (c) => {
    const id = sandboxParam(c);
    const path = pathQuery(c);
    const user = userQuery(c);
    const entries: EntryInfo[] = await onBox(id, (s) => s.files.list(path, { user }));
    sendJson(c.res, 200, { entries });
  });

  route('GET', '/sandboxes/{id}/files/stat', async (c) => {
    const id = sandboxParam(c);
    const path = pathQuery(c);
    const user = userQuery(c);
    sendJson(c.res, 200, await onBox(id, (s) => s.files.getInfo(path, { user })));
  });

  route('POST', '/sandboxes/{id}/files/mkdir', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req);
    onlyKeys(b, ['path', 'user'], 'body');
    const path = checkPath(b.path, 'path');
    const user = userParam(b.user, 'user');
    const created = await onBox(id, (s) => s.files.makeDir(path, { user }));
    sendJson(c.res, created ? 201 : 200, { created });
  });

  route('POST', '/sandboxes/{id}/files/rename', async (c) => {
    const id = sandboxParam(c);
    const b = await readJson(c.req);
    onlyKeys(b, ['from', 'to', 'user'], 'body');
    const from = checkPath(b.from, 'from');
    const to = checkPath(b.to, 'to');
    const user = userParam(b.user, 'user');
    sendJson(c.res, 200, await onBox(id, (s) => s.files.rename(from, to, { user })));
  });

  // ------------------------------------------------------------ the spec

  route('GET', '/openapi.json', async (c) => {
    spec ??= fs.readFileSync(openApiPath(), 'utf8');
    c.res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
    c.res.end(spec);
  });

  if (routes.length !== HTTP_ROUTES.length) throw new Error('a route of HTTP_ROUTES has no handler');

  // ------------------------------------------------------------ dispatch

  function refuse(req: http.IncomingMessage, res: http.ServerResponse): boolean {
    if (tokenDigest) {
      const h = req.headers.authorization ?? '';
      const m = /^Bearer ([\x21-\x7e]+)$/.exec(h);
      const given = digest(m ? m[1] : '');
      // both are SHA-256 digests: equal lengths, compared in constant time
      if (!m || !crypto.timingSafeEqual(given, tokenDigest)) {
        sendJson(res, 401, { error: { type: 'Unauthorized', message: 'a valid Authorization: Bearer token is required' } }, { 'www-authenticate': 'Bearer' });
        return true;
      }
      return false;
    }
    if (req.headers.origin !== undefined) {
      sendJson(res, 403, { error: { type: 'Forbidden', message: 'requests from web pages (with an Origin header) are refused without a bearer token' } });
      return true;
    }
    const host = (req.headers.host ?? '').replace(/:\d+$/, '');
    if (!isLoopbackHost(host)) {
      sendJson(res, 403, { error: { type: 'Forbidden', message: `Host ${host} is not a loopback name: refused without a bearer token` } });
      return true;
    }
    return false;
  }

  function handle(req: http.IncomingMessage, res: http.ServerResponse): void {
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
        const url = new URL(req.url ?? '/', 'http://x');
        let allowed: string[] = [];
        for (const r of routes) {
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
        if (allowed.length) throw new HttpError(405, 'MethodNotAllowed', `${req.method} is not allowed here (${allowed.join(', ')})`);
        throw new HttpError(404, 'NotFound', `no route ${req.method} ${url.pathname}`);
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

  const server = http.createServer({ requestTimeout: opts.requestBodyTimeoutMs ?? 300_000 }, handle);
  server.maxHeadersCount = 64;

  async function close(): Promise<void> {
    clearInterval(sweep);
    await new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections?.();
    });
    for (const b of background.values()) if (b.expiry) clearTimeout(b.expiry);
    background.clear();
    const all = [...boxes.values()];
    boxes.clear();
    for (const p of all) await p.then(dropConnection, () => {});
    for (const id of [...procConns.keys()]) dropProcConn(id, 'the server is closing');
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
