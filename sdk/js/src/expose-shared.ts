/**
 * @internal What the synchronous `Sandbox.getHost` (sandbox.ts) and its
 * worker thread (expose-worker.cts) share: the job and the layout of the
 * SharedArrayBuffer the answer comes back in.  An Int32 state, an Int32
 * byte count, then that many bytes of JSON, `{ ok: { host, port } }` or
 * `{ err: { code?, data?, message } }`.
 */
import type { ConnectionOpts } from './connection';

/** What the caller gives the worker. */
export interface ExposeJob {
  conn: ConnectionOpts;
  id: string;
  port: number;
  shared: SharedArrayBuffer;
}

/** The state word: the worker has not run yet. */
export const STATE_NEW = 0;
/** The worker runs (its first statement says so: a caller stops waiting for a thread that never started). */
export const STATE_RUNNING = 1;
/** The answer is in the buffer. */
export const STATE_ANSWERED = 2;

/** Bytes of the buffer before the JSON. */
export const HEADER_BYTES = 8;
