// What the benchmarks' node scripts share (bench/loop.mjs, bench/sdk.mjs,
// bench/loop-cycles.mjs, bench/loop-idle.mjs): a bare JSON-RPC client of
// the daemon's socket, a few lines of `net` and `JSON.parse` (the floor
// any client of the socket API stands on), and the statistics they print.
import * as net from 'node:net';
import { readFileSync } from 'node:fs';

// JSON lines over the socket, nothing else.  Of notifications only
// process.exit is kept, for run().
export class Bare {
  static open(path) {
    return new Promise((resolve, reject) => {
      const s = net.createConnection({ path });
      s.once('error', reject);
      s.once('connect', () => resolve(new Bare(s)));
    });
  }
  constructor(s) {
    this.s = s;
    this.id = 0;
    this.pending = new Map();
    this.exits = new Map();
    this.parts = [];
    s.setEncoding('utf8');
    s.on('data', (d) => {
      // look for the end of a line in the new data only: a 1.4 MB reply
      // arrives in many pieces
      let start = 0;
      let nl;
      while ((nl = d.indexOf('\n', start)) >= 0) {
        this.parts.push(d.slice(start, nl));
        const m = JSON.parse(this.parts.join(''));
        this.parts = [];
        start = nl + 1;
        if (m.id !== undefined) {
          const p = this.pending.get(m.id);
          this.pending.delete(m.id);
          if (m.error) p.reject(Object.assign(new Error(m.error.message), { code: m.error.code }));
          else p.resolve(m.result);
        } else if (m.method === 'process.exit') {
          // pids are a box's own: two boxes have the same ones
          const key = `${m.params.sandbox}/${m.params.pid}`;
          const w = this.exits.get(key);
          if (typeof w === 'function') w(m.params);
          else this.exits.set(key, m.params);
        }
      }
      if (start < d.length) this.parts.push(d.slice(start));
    });
  }
  call(method, params) {
    const id = ++this.id;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.s.write(JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n');
    });
  }
  // process.start (params: argv or cmd, ...) and its process.exit
  async run(sandbox, params) {
    const { pid } = await this.call('process.start', { sandbox, ...params });
    const key = `${sandbox}/${pid}`;
    const got = this.exits.get(key);
    if (got) { this.exits.delete(key); return got; }
    return new Promise((resolve) => this.exits.set(key, (p) => { this.exits.delete(key); resolve(p); }));
  }
  close() { this.s.destroy(); }
}

export const now = () => Number(process.hrtime.bigint()) / 1e6;

// the p-quantile (0..1) of a list of numbers
export const pct = (ms, p) => {
  const s = [...ms].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(s.length * p))];
};

export function stats(ms) {
  const s = [...ms].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)], mean: s.reduce((a, b) => a + b, 0) / s.length,
           p99: pct(s, 0.99) };
}

// a process's CPU time so far, in seconds (utime + stime of /proc/PID/stat)
export const cpuOf = (pid) => {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const v = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return (Number(v[11]) + Number(v[12])) / 100;
};

// the 1-minute load average, as docs/benchmarks.md records it
export const loadavg = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
