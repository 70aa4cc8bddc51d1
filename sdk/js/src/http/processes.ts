/**
 * The commands the server runs.  They go over a connection of their own per
 * sandbox, not through the SDK's CommandHandle: a handle keeps all the
 * output it ever saw, and this server must hold at most maxOutputBytes per
 * command.  A background command's output is kept here (bounded) for
 * whoever asks for it, until ten minutes after its end.
 */
import { StringDecoder } from 'node:string_decoder';
import { startParams } from '../account';
import { DEFAULT_COMMAND_TIMEOUT_MS } from '../commands';
import { Connection, type ConnectionOpts } from '../connection';
import { decodeData, outputStream } from '../wire';
import type { BoxCache } from './box-cache';
import { HttpError } from './errors';
import { type Event, exitEvent, isEnd } from './events';

const MAX_BACKGROUND = 1024;
const KEEP_FINISHED_MS = 10 * 60_000;

export interface StartOpts {
  cwd?: string;
  /** The account (default: the sandbox's default account, as the SDK). */
  user?: string;
  envs?: Record<string, string>;
  timeoutMs?: number;
  stdin?: boolean;
}

/** A background command's output, kept (bounded) for whoever asks for it. */
export interface Background {
  sandboxId: string;
  pid: number;
  events: Event[];
  bytes: number;
  dropped: number;
  done: boolean;
  readers: Set<(e: Event) => void>;
  expiry?: NodeJS.Timeout;
}

export class Processes {
  private readonly conn: ConnectionOpts;
  private readonly maxOutput: number;
  /** The Sandbox objects: the accounts commands start as, and whether a sandbox is gone. */
  private readonly boxes: BoxCache;
  /** One connection per sandbox, for its commands. */
  private readonly conns = new Map<string, Promise<Connection>>();
  /** Where the events of each running command ("id/pid") go. */
  private readonly procs = new Map<string, (e: Event) => void>();
  private readonly background = new Map<string, Background>();

  constructor(conn: ConnectionOpts, boxes: BoxCache, maxOutput: number) {
    this.conn = conn;
    this.boxes = boxes;
    this.maxOutput = maxOutput;
  }

  /** The ids of the sandboxes with a connection for commands. */
  sandboxIds(): string[] {
    return [...this.conns.keys()];
  }

  /** Ends the streams of a sandbox's commands that will hear no more. */
  private failProcs(id: string, message: string): void {
    for (const [k, fn] of [...this.procs]) {
      if (k.startsWith(`${id}/`)) {
        this.procs.delete(k);
        fn({ type: 'error', error: { type: 'SandboxError', message } });
      }
    }
  }

  private dropConn(id: string, why: string): void {
    const c = this.conns.get(id);
    if (!c) return;
    this.conns.delete(id);
    // close() runs no close handler: the streams are ended here
    this.failProcs(id, why);
    void c.then((x) => x.close(), () => {});
  }

  /** A sandbox is gone: its commands' streams end, its kept output goes. */
  forget(id: string): void {
    this.dropConn(id, `sandbox ${id} is gone`);
    for (const [k, b] of this.background) {
      if (b.sandboxId === id) {
        if (b.expiry) clearTimeout(b.expiry);
        this.background.delete(k);
      }
    }
  }

  private connection(id: string): Promise<Connection> {
    let p = this.conns.get(id);
    if (!p) {
      p = Connection.open(this.conn).then((c) => {
        c.onClose((err) => {
          if (this.conns.get(id) === p) this.conns.delete(id);
          this.failProcs(id, err.message);
        });
        return c;
      });
      this.conns.set(id, p);
      p.catch(() => this.conns.delete(id));
    }
    return p;
  }

  /** Starts cmd; `onEvent` gets its stdout and stderr, then exit (or error). Resolves with its pid. */
  async start(id: string, cmd: string, o: StartOpts, onEvent: (e: Event) => void): Promise<number> {
    const c = await this.connection(id);
    const timeoutMs = o.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
    const params: Record<string, unknown> = { sandbox: id, cmd, encoding: 'utf8' };
    if (o.stdin) params.stdin = true;
    // the SDK's defaults: the sandbox's default account, in its home
    Object.assign(params, startParams(await this.boxes.box(id), o, timeoutMs));
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
          this.procs.set(key, onEvent);
          c.subscribe(id, r.pid, (method, p) => {
            if (method === 'process.output') {
              const stream = outputStream(p);
              // a chunk that is not valid UTF-8 comes as base64; the decoder
              // joins characters split across chunks
              const text = dec[stream].write(decodeData(p.data, p.encoding));
              if (text) onEvent({ type: stream, data: text });
            } else if (method === 'process.exit') {
              c.unsubscribe(id, r.pid);
              this.procs.delete(key);
              flush();
              onEvent(exitEvent(p));
            }
          });
        },
      });
      return r.pid;
    } catch (e) {
      this.boxes.checkGone(id, e);
      throw e;
    }
  }

  /** SIGKILL to a command and its tree. */
  async kill(id: string, pid: number): Promise<void> {
    const c = await this.connection(id);
    await c.call('process.signal', { sandbox: id, pid, signal: 'KILL' });
  }

  /** Starts cmd in the background, its output kept here; resolves with its pid. */
  async startBackground(id: string, cmd: string, o: StartOpts): Promise<number> {
    if (this.background.size >= MAX_BACKGROUND) {
      for (const [k, b] of this.background) {
        if (b.done) {
          if (b.expiry) clearTimeout(b.expiry);
          this.background.delete(k);
          break;
        }
      }
      if (this.background.size >= MAX_BACKGROUND) throw new HttpError(503, 'RateLimitError', `${MAX_BACKGROUND} background commands are followed already`);
    }
    const rec: Background = { sandboxId: id, pid: 0, events: [], bytes: 0, dropped: 0, done: false, readers: new Set() };
    let key = '';
    const add = (e: Event) => {
      const n = typeof e.data === 'string' ? e.data.length : 0;
      rec.events.push(e);
      rec.bytes += n;
      while (rec.bytes > this.maxOutput && rec.events.length > 1) {
        const old = rec.events.shift()!;
        const m = typeof old.data === 'string' ? old.data.length : 0;
        rec.bytes -= m;
        rec.dropped += m;
      }
      for (const r of [...rec.readers]) r(e);
      if (isEnd(e)) {
        rec.done = true;
        rec.readers.clear();
        rec.expiry = setTimeout(() => {
          if (this.background.get(key) === rec) this.background.delete(key);
        }, KEEP_FINISHED_MS);
        rec.expiry.unref();
      }
    };
    rec.pid = await this.start(id, cmd, o, add);
    key = `${id}/${rec.pid}`;
    this.background.set(key, rec);
    return rec.pid;
  }

  /** A background command started here (and not ended over ten minutes ago). */
  followed(id: string, pid: number): Background | undefined {
    return this.background.get(`${id}/${pid}`);
  }

  /** Forgets every background command's output. */
  clearBackground(): void {
    for (const b of this.background.values()) if (b.expiry) clearTimeout(b.expiry);
    this.background.clear();
  }

  /** Closes every connection for commands; their streams end with `why`. */
  close(why: string): void {
    for (const id of [...this.conns.keys()]) this.dropConn(id, why);
  }
}
