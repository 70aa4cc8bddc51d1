/**
 * A command's output as a stream of events: NDJSON lines, or server-sent
 * events when the client asks for text/event-stream.
 */
import type * as http from 'node:http';
import { exitStatus } from '../wire';

export type Event = Record<string, unknown> & { type: string };

/** Writes events as NDJSON lines or server-sent events. */
export class EventWriter {
  private readonly res: http.ServerResponse;
  private readonly sse: boolean;
  private readonly max: number;
  private started = false;
  private ended = false;
  private readonly early: Event[] = [];

  /** The stream of req's answer res, as req asks for it; `max`: the most bytes waiting for a slow reader. */
  constructor(req: http.IncomingMessage, res: http.ServerResponse, max: number) {
    this.res = res;
    this.sse = /\btext\/event-stream\b/i.test(req.headers.accept ?? '');
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

/** The exit event of a process.exit notification, worded as the SDK's CommandResult. */
export function exitEvent(p: Record<string, unknown>): Event {
  const { exitCode, error } = exitStatus(p);
  const ev: Event = { type: 'exit', exitCode };
  if (error !== undefined) ev.error = error;
  if (p.timed_out === true) ev.timedOut = true;
  return ev;
}

/** Whether an event ends its command's stream. */
export function isEnd(e: Event): boolean {
  return e.type === 'exit' || e.type === 'error';
}
