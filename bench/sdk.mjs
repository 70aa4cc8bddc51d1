// bench/sdk's measurements (see bench/sdk).  Each measurement runs the SDK
// and the bare client alternately, so that a busy moment of the machine
// falls on both.
import * as net from 'node:net';
import { randomBytes } from 'node:crypto';
import { Sandbox } from '../sdk/js/dist/index.js';

const runs = Number(process.argv[2] ?? 200);
const rounds = Number(process.argv[3] ?? 3);
const SIZE = 100 * 1024 * 1024;
const CHUNK = 1024 * 1024;

// A bare client: JSON lines over the socket, nothing else.
class Bare {
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
          if (m.error) p.reject(new Error(m.error.message));
          else p.resolve(m.result);
        } else if (m.method === 'process.exit') {
          const w = this.exits.get(m.params.pid);
          if (w) w(m.params);
          else this.exits.set(m.params.pid, m.params);
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
  async run(sandbox, cmd) {
    const { pid } = await this.call('process.start', { sandbox, cmd, timeout: 60 });
    const got = this.exits.get(pid);
    if (got) { this.exits.delete(pid); return got; }
    return new Promise((resolve) => this.exits.set(pid, (p) => { this.exits.delete(pid); resolve(p); }));
  }
  close() { this.s.destroy(); }
}

function stats(ms) {
  const s = [...ms].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)], mean: s.reduce((a, b) => a + b, 0) / s.length };
}

const sbx = await Sandbox.create({ timeoutMs: 0 });
const bare = await Bare.open(process.env.TUPPER_SOCKET);
try {
  // warm both paths
  for (let i = 0; i < 10; i++) { await sbx.commands.run('true'); await bare.run(sbx.sandboxId, 'true'); }
  const sdkMs = [];
  const bareMs = [];
  for (let i = 0; i < runs; i++) {
    let t = process.hrtime.bigint();
    await sbx.commands.run('true');
    sdkMs.push(Number(process.hrtime.bigint() - t) / 1e6);
    t = process.hrtime.bigint();
    await bare.run(sbx.sandboxId, 'true');
    bareMs.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  const a = stats(sdkMs);
  const b = stats(bareMs);
  console.log(`\ncommands.run('true'), ${runs} runs each`);
  console.log('| client | median ms | mean ms | ratio to bare |');
  console.log('|---|---:|---:|---:|');
  console.log(`| bare JSON-RPC | ${b.median.toFixed(2)} | ${b.mean.toFixed(2)} | 1.00x |`);
  console.log(`| @tupper/sdk | ${a.median.toFixed(2)} | ${a.mean.toFixed(2)} | ${(a.median / b.median).toFixed(2)}x |`);

  // what acting as an account costs a small file call: the daemon looks
  // the account up in the box's /etc/passwd and /etc/group (two reads
  // through the agent) and the agent switches its filesystem ids around
  // the call.  The SDK's default (E2B's: `user`) takes this path.
  await sbx.files.write('/home/user/small.txt', 'x');
  const asRoot = [];
  const asUser = [];
  const stat = (extra) => bare.call('fs.stat', { sandbox: sbx.sandboxId, path: '/home/user/small.txt', ...extra });
  for (let i = 0; i < 10; i++) { await stat({}); await stat({ user: 'user' }); }
  for (let i = 0; i < runs; i++) {
    let t = process.hrtime.bigint();
    await stat({});
    asRoot.push(Number(process.hrtime.bigint() - t) / 1e6);
    t = process.hrtime.bigint();
    await stat({ user: 'user' });
    asUser.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  const r0 = stats(asRoot);
  const r1 = stats(asUser);
  console.log(`\nfs.stat of a small file, ${runs} runs each`);
  console.log('| as | median ms | mean ms | ratio to root |');
  console.log('|---|---:|---:|---:|');
  console.log(`| root (no user) | ${r0.median.toFixed(2)} | ${r0.mean.toFixed(2)} | 1.00x |`);
  console.log(`| user: 'user' | ${r1.median.toFixed(2)} | ${r1.mean.toFixed(2)} | ${(r1.median / r0.median).toFixed(2)}x |`);
  // and on 1 MiB chunks: 20 MiB in fs.write calls, as root and as user, alternated
  {
    const n = 20;
    const chunk = randomBytes(CHUNK).toString('base64');
    const put = async (path, extra) => {
      const t = process.hrtime.bigint();
      for (let i = 0; i < n; i++) await bare.call('fs.write', { sandbox: sbx.sandboxId, path, offset: i * CHUNK, data: chunk, ...extra });
      return Number(process.hrtime.bigint() - t) / 1e9;
    };
    const w0 = [];
    const w1 = [];
    for (let round = 0; round < Math.max(rounds, 3); round++) {
      w0.push(await put('/tmp/as-root.bin', {}));
      w1.push(await put('/tmp/as-user.bin', { user: 'user' }));
    }
    const m0 = n / stats(w0).median;
    const m1 = n / stats(w1).median;
    console.log(`\n${n} MiB in 1 MiB fs.write calls, median of ${w0.length} alternated rounds`);
    console.log('| as | MiB/s | ratio to root |');
    console.log('|---|---:|---:|');
    console.log(`| root (no user) | ${m0.toFixed(1)} | 1.00x |`);
    console.log(`| user: 'user' | ${m1.toFixed(1)} | ${(m1 / m0).toFixed(2)}x |`);
  }

  const data = randomBytes(SIZE);
  const rows = [];
  const time = async (fn) => { const t = process.hrtime.bigint(); await fn(); return Number(process.hrtime.bigint() - t) / 1e9; };
  const mbs = (s) => SIZE / (1024 * 1024) / s;
  for (let round = 0; round < rounds; round++) {
    const r = {};
    r.bareWrite = await time(async () => {
      for (let off = 0; off < SIZE; off += CHUNK) {
        await bare.call('fs.write', { sandbox: sbx.sandboxId, path: '/tmp/bare.bin', offset: off,
          data: data.subarray(off, off + CHUNK).toString('base64') });
      }
    });
    r.sdkWrite = await time(() => sbx.files.write('/tmp/sdk.bin', data));
    r.bareRead = await time(async () => {
      for (let off = 0; off < SIZE; off += CHUNK) {
        const x = await bare.call('fs.read', { sandbox: sbx.sandboxId, path: '/tmp/bare.bin', offset: off, length: CHUNK });
        Buffer.from(x.data, 'base64');
      }
    });
    r.sdkRead = await time(async () => {
      const back = await sbx.files.read('/tmp/sdk.bin', { format: 'bytes' });
      if (back.length !== SIZE) throw new Error('short read');
    });
    r.sdkStream = await time(async () => {
      let n = 0;
      for await (const c of await sbx.files.read('/tmp/sdk.bin', { format: 'stream' })) n += c.length;
      if (n !== SIZE) throw new Error('short stream');
    });
    rows.push(r);
  }
  const med = (k) => stats(rows.map((r) => r[k])).median;
  console.log(`\n100 MiB, median of ${rounds} rounds`);
  console.log('| transfer | bare MiB/s | @tupper/sdk MiB/s | ratio to bare |');
  console.log('|---|---:|---:|---:|');
  console.log(`| write | ${mbs(med('bareWrite')).toFixed(1)} | ${mbs(med('sdkWrite')).toFixed(1)} | ${(med('bareWrite') / med('sdkWrite')).toFixed(2)}x |`);
  console.log(`| read (bytes) | ${mbs(med('bareRead')).toFixed(1)} | ${mbs(med('sdkRead')).toFixed(1)} | ${(med('bareRead') / med('sdkRead')).toFixed(2)}x |`);
  console.log(`| read (stream) | ${mbs(med('bareRead')).toFixed(1)} | ${mbs(med('sdkStream')).toFixed(1)} | ${(med('bareRead') / med('sdkStream')).toFixed(2)}x |`);
} finally {
  bare.close();
  await sbx.kill();
}
