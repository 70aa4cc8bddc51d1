// bench/loop-cycles's measurements (see bench/loop-cycles).
import { Bare, now, pct, cpuOf, loadavg } from './rpc.mjs';

const clients = Number(process.argv[2] ?? 50);
const secs = Number(process.argv[3] ?? 20);
const sock = process.env.TUPPER_SOCKET;

const other = await Bare.open(sock);
const conns = await Promise.all(Array.from({ length: clients }, () => Bare.open(sock)));
// warm: the image laid out, the pool of ready boxes filled
{
  const b = await other.call('sandbox.create', {});
  await other.run(b.id, { argv: ['/bin/true'] });
  await other.call('sandbox.kill', { id: b.id });
}
const load0 = loadavg();
const cpu0 = cpuOf(process.env.TUPPER_DAEMON_PID);
const t0 = now();
const end = t0 + secs * 1000;
let cycles = 0;
const errors = new Map();
const cycle = async (c) => {
  while (now() < end) {
    let id;
    try {
      id = (await c.call('sandbox.create', {})).id;
      const x = await c.run(id, { argv: ['/bin/true'] });
      if (x.exit_code !== 0) throw new Error(`exit ${x.exit_code}`);
      cycles++;
    } catch (e) {
      const k = String(e.message).slice(0, 80);
      errors.set(k, (errors.get(k) ?? 0) + 1);
    } finally {
      if (id) await c.call('sandbox.kill', { id }).catch(() => {});
    }
  }
};
const ms = [];
const probe = (async () => {
  while (now() < end) {
    const t = now();
    await other.call('sandbox.list', {});
    ms.push(now() - t);
    await new Promise((r) => setTimeout(r, 2));
  }
})();
await Promise.all([probe, ...conns.map(cycle)]);
const wall = (now() - t0) / 1000;
const cpu = (cpuOf(process.env.TUPPER_DAEMON_PID) - cpu0) / wall;
console.log(`\n${clients} clients, create -> run('true') -> kill for ${secs} s (load ${load0} before, ${loadavg()} after)`);
console.log(`cycles: ${cycles} in ${wall.toFixed(1)} s = ${(cycles / wall).toFixed(1)}/s; daemon ${(cpu * 100).toFixed(0)}% of a core`);
for (const [k, n] of errors) console.log(`  failed ${n}x: ${k}`);
console.log(`another client's sandbox.list meanwhile, ${ms.length} calls: p50 ${pct(ms, 0.5).toFixed(2)} ms, p99 ${pct(ms, 0.99).toFixed(2)} ms, max ${Math.max(...ms).toFixed(2)} ms`);
for (const c of conns) c.close();
other.close();
