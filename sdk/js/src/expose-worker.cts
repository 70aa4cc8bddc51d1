/**
 * @internal The worker thread of the synchronous `Sandbox.getHost`
 * (sandbox.ts `exposeSync`): one `sandbox.expose` request on a connection
 * of its own, its answer handed back through the SharedArrayBuffer it was
 * given (expose-shared.ts) while the caller's thread waits on it
 * (`Atomics.wait`).  A thread of the caller's process, not a child
 * process: nothing to find on PATH, no interpreter to start, the same
 * runtime (Node, Bun, Deno) as the caller.  A .cts file, so that it is
 * `.cjs` in dist: Deno loads a worker's `.js` file as an ES module whatever
 * package.json says.
 */
import { workerData } from 'node:worker_threads';
import type { Connection as ConnectionType } from './connection';
import { HEADER_BYTES, STATE_ANSWERED, STATE_RUNNING, type ExposeJob } from './expose-shared';

const job = workerData as ExposeJob;
const head = new Int32Array(job.shared, 0, 2);
Atomics.store(head, 0, STATE_RUNNING);

function answer(value: unknown): void {
  const room = job.shared.byteLength - HEADER_BYTES;
  let bytes = Buffer.from(JSON.stringify(value), 'utf8');
  if (bytes.length > room) {
    bytes = Buffer.from(JSON.stringify({ err: { message: `the daemon's answer is over ${room} bytes` } }), 'utf8');
  }
  new Uint8Array(job.shared, HEADER_BYTES, bytes.length).set(bytes);
  head[1] = bytes.length;
  Atomics.store(head, 0, STATE_ANSWERED);
  Atomics.notify(head, 0);
}

async function run(): Promise<void> {
  let c: ConnectionType | undefined;
  try {
    // loaded here, not at the top: a failure to load is an answer too
    const { Connection } = require('./connection') as typeof import('./connection');
    c = await Connection.open(job.conn);
    const r = await c.call<{ host: string; port: number }>('sandbox.expose', { id: job.id, port: job.port });
    answer({ ok: { host: r.host, port: r.port } });
  } catch (e) {
    const x = e as { code?: unknown; data?: unknown; message?: unknown };
    answer({ err: { code: typeof x.code === 'number' ? x.code : undefined, data: x.data, message: String(x.message ?? e) } });
  } finally {
    c?.close();
  }
}

void run();
