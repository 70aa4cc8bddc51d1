// bench/sdk's measurements (see bench/sdk).  Each measurement runs the SDK
// and the bare client alternately, so that a busy moment of the machine
// falls on both.
import { randomBytes } from 'node:crypto';
import { Sandbox } from '../sdk/js/dist/index.js';
import { Bare, stats, loadavg } from './rpc.mjs';

const runs = Number(process.argv[2] ?? 200);
const rounds = Number(process.argv[3] ?? 3);
const SIZE = 100 * 1024 * 1024;
const CHUNK = 1024 * 1024;

const sbx = await Sandbox.create({ timeoutMs: 0 });
const bare = await Bare.open(process.env.TUPPER_SOCKET);
// BASE (bench/sdk): the other build's daemon, its bare round trip in the same
// alternation, on a box made as the bare client's here (one each, made the
// same way), the two in turn first (the one timed after the SDK call pays more)
const base = process.env.TUPPER_SOCKET_BASE ? await Bare.open(process.env.TUPPER_SOCKET_BASE) : null;
const baseBox = base ? (await base.call('sandbox.create', { limits: { timeout: 0 } })).id : null;
const bareBox = base ? (await bare.call('sandbox.create', { limits: { timeout: 0 } })).id : sbx.sandboxId;
try {
  // warm both paths
  for (let i = 0; i < 10; i++) {
    await sbx.commands.run('true');
    await bare.run(bareBox, { cmd: 'true', timeout: 60 });
    if (base) await base.run(baseBox, { cmd: 'true', timeout: 60 });
  }
  const sdkMs = [];
  const bareMs = [];
  const baseMs = [];
  // with BASE, the bare call as the SDK's account (`user`) too, both builds:
  // what the account lookup costs each
  const bareUserMs = [];
  const baseUserMs = [];
  const timed = async (c, box, into, extra) => {
    const t = process.hrtime.bigint();
    await c.run(box, { cmd: 'true', timeout: 60, ...extra });
    into.push(Number(process.hrtime.bigint() - t) / 1e6);
  };
  const user = { user: 'user' };
  for (let i = 0; i < runs; i++) {
    const t = process.hrtime.bigint();
    await sbx.commands.run('true');
    sdkMs.push(Number(process.hrtime.bigint() - t) / 1e6);
    if (base && i % 2 === 1) {
      await timed(base, baseBox, baseMs);
      await timed(base, baseBox, baseUserMs, user);
    }
    await timed(bare, bareBox, bareMs);
    if (base) await timed(bare, bareBox, bareUserMs, user);
    if (base && i % 2 === 0) {
      await timed(base, baseBox, baseMs);
      await timed(base, baseBox, baseUserMs, user);
    }
  }
  const a = stats(sdkMs);
  const b = stats(bareMs);
  console.log(`\ncommands.run('true'), ${runs} runs each, alternated (load ${loadavg()})`);
  console.log('| client | p50 ms | p99 ms | mean ms | p50 ratio to bare |');
  console.log('|---|---:|---:|---:|---:|');
  if (base) {
    const c = stats(baseMs);
    console.log(`| bare JSON-RPC, BASE build | ${c.median.toFixed(2)} | ${c.p99.toFixed(2)} | ${c.mean.toFixed(2)} | ${(c.median / b.median).toFixed(2)}x |`);
  }
  console.log(`| bare JSON-RPC | ${b.median.toFixed(2)} | ${b.p99.toFixed(2)} | ${b.mean.toFixed(2)} | 1.00x |`);
  if (base) {
    const bu = stats(baseUserMs);
    const u = stats(bareUserMs);
    console.log(`| bare JSON-RPC as user, BASE build | ${bu.median.toFixed(2)} | ${bu.p99.toFixed(2)} | ${bu.mean.toFixed(2)} | ${(bu.median / b.median).toFixed(2)}x |`);
    console.log(`| bare JSON-RPC as user | ${u.median.toFixed(2)} | ${u.p99.toFixed(2)} | ${u.mean.toFixed(2)} | ${(u.median / b.median).toFixed(2)}x |`);
  }
  console.log(`| @tupper/sdk | ${a.median.toFixed(2)} | ${a.p99.toFixed(2)} | ${a.mean.toFixed(2)} | ${(a.median / b.median).toFixed(2)}x |`);
  if (rounds === 0) { // the round trip only (bench/sdk RUNS 0)
    if (base) {
      await base.call('sandbox.kill', { id: baseBox });
      await bare.call('sandbox.kill', { id: bareBox });
      base.close();
    }
    bare.close();
    await sbx.kill();
    process.exit(0);
  }

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
  // with BASE, both bare boxes go and the BASE connection closes too: an
  // open connection would keep node (and bench/sdk) waiting for good
  if (base) {
    await base.call('sandbox.kill', { id: baseBox }).catch(() => {});
    await bare.call('sandbox.kill', { id: bareBox }).catch(() => {});
    base.close();
  }
  bare.close();
  await sbx.kill();
}
