/**
 * @internal The worker thread of the synchronous `Sandbox.getHost`
 * (sandbox.ts `exposeSync`): one `sandbox.expose` request on a connection
 * of its own, its answer handed back through the SharedArrayBuffer it was
 * given while the caller's thread waits on it (`Atomics.wait`).  A thread
 * of the caller's process, not a child process: nothing to find on PATH,
 * no interpreter to start, the same runtime (Node, Bun, Deno) as the caller.
 *
 * The buffer: an Int32 state (0 while pending, 1 once answered), an Int32
 * byte count, then that many bytes of JSON, `{ ok: { host, port } }` or
 * `{ err: { code?, data?, message } }`.
 */
import { isMainThread, workerData } from 'node:worker_threads';
import type { ConnectionOpts } from './connection';

/** What the caller gives the worker. */
export interface ExposeJob {
  conn: ConnectionOpts;
  id: string;
  port: number;
  shared: SharedArrayBuffer;
}

/** Bytes of the buffer before the JSON. */
export const HEADER_BYTES = 8;

function answer(shared: SharedArrayBuffer, value: unknown): void {
  const head = new Int32Array(shared, 0, 2);
  const room = shared.byteLength - HEADER_BYTES;
  let bytes = Buffer.from(JSON.stringify(value), 'utf8');
  if (bytes.length > room) {
    bytes = Buffer.from(JSON.stringify({ err: { message: `the daemon's answer is over ${room} bytes` } }), 'utf8');
  }
  new Uint8Array(shared, HEADER_BYTES, bytes.length).set(bytes);
  head[1] = bytes.length;
  Atomics.store(head, 0, 1);
  Atomics.notify(head, 0);
}

async function run(job: ExposeJob): Promise<void> {
  let c: import('./connection').Connection | undefined;
  try {
    // loaded here, not at the top: a failure to load is an answer too,
    // never a caller left waiting for its whole bound
    const { Connection } = require('./connection') as typeof import('./connection');
    c = await Connection.open(job.conn);
    const r = await c.call<{ host: string; port: number }>('sandbox.expose', { id: job.id, port: job.port });
    answer(job.shared, { ok: { host: r.host, port: r.port } });
  } catch (e) {
    const x = e as { code?: unknown; data?: unknown; message?: unknown };
    answer(job.shared, { err: { code: typeof x.code === 'number' ? x.code : undefined, data: x.data, message: String(x.message ?? e) } });
  } finally {
    c?.close();
  }
}

// sandbox.ts imports this file's types and constants: only the worker runs it
if (!isMainThread && workerData !== null && typeof workerData === 'object' && 'shared' in workerData) {
  void run(workerData as ExposeJob);
}
