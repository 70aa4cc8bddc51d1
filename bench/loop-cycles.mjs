// bench/loop-cycles's measurements (see bench/loop-cycles): cycles/s, the
// daemon's CPU a cycle, each call's p50/p99 and the other client's list.
import { readFileSync } from 'node:fs';
import { Bare, now, pct, cpuOf, loadavg } from './rpc.mjs';

// the CPU time of a process's reaped children, in seconds (cutime + cstime
// of /proc/PID/stat): the daemon's are the boxes' PID 1s, and with them
// what each reaped (the box's processes)
const childCpuOf = (pid) => {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const v = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return (Number(v[13]) + Number(v[14])) / 100;
};

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
// the loop thread's alone (the daemon's main thread: Lua, JSON, libuv and
// the system calls made on the loop), without the thread pool's
const loopOf = (pid) => cpuOf(`${pid}/task/${pid}`);
const loop0 = loopOf(process.env.TUPPER_DAEMON_PID);
const kids0 = childCpuOf(process.env.TUPPER_DAEMON_PID);
const t0 = now();
const end = t0 + secs * 1000;
let cycles = 0;
const errors = new Map();
// each call's time, as the looping clients see it
const took = { create: [], run: [], kill: [] };
const cycle = async (c) => {
  while (now() < end) {
    let id;
    try {
      let t = now();
      id = (await c.call('sandbox.create', {})).id;
      took.create.push(now() - t);
      t = now();
      const x = await c.run(id, { argv: ['/bin/true'] });
      took.run.push(now() - t);
      if (x.exit_code !== 0) throw new Error(`exit ${x.exit_code}`);
      cycles++;
    } catch (e) {
      const k = String(e.message).slice(0, 80);
      errors.set(k, (errors.get(k) ?? 0) + 1);
    } finally {
      if (id) {
        const t = now();
        await c.call('sandbox.kill', { id }).then(() => took.kill.push(now() - t), () => {});
      }
    }
  }
};
const ms = [];
// LIST=0: no other client (the daemon's CPU a cycle without the lists')
const listing = process.env.LIST !== '0';
const probe = (async () => {
  while (listing && now() < end) {
    const t = now();
    await other.call('sandbox.list', {});
    ms.push(now() - t);
    await new Promise((r) => setTimeout(r, 2));
  }
})();
await Promise.all([probe, ...conns.map(cycle)]);
const wall = (now() - t0) / 1000;
const cpuSecs = cpuOf(process.env.TUPPER_DAEMON_PID) - cpu0;
const loopSecs = loopOf(process.env.TUPPER_DAEMON_PID) - loop0;
const kidsSecs = childCpuOf(process.env.TUPPER_DAEMON_PID) - kids0;
const cpu = cpuSecs / wall;
console.log(`\n${clients} clients, create -> run('true') -> kill for ${secs} s (load ${load0} before, ${loadavg()} after)`);
console.log(`cycles: ${cycles} in ${wall.toFixed(1)} s = ${(cycles / wall).toFixed(1)}/s; daemon ${(cpu * 100).toFixed(0)}% of a core`);
if (cycles > 0) {
  console.log(`CPU per cycle: daemon ${(cpuSecs * 1000 / cycles).toFixed(2)} ms (its threads) + boxes ${(kidsSecs * 1000 / cycles).toFixed(2)} ms (reaped PID 1s and theirs); kernel threads not counted`);
  console.log(`  of the daemon's: its loop thread ${(loopSecs * 1000 / cycles).toFixed(2)} ms (Lua, JSON, libuv; the list's calls too)`);
}
console.log(`the loop's calls, p50 / p99 ms: ${Object.entries(took).map(([k, v]) =>
  `${k} ${pct(v, 0.5).toFixed(1)} / ${pct(v, 0.99).toFixed(1)}`).join(', ')}`);
for (const [k, n] of errors) console.log(`  failed ${n}x: ${k}`);
if (listing) console.log(`another client's sandbox.list meanwhile, ${ms.length} calls: p50 ${pct(ms, 0.5).toFixed(2)} ms, p99 ${pct(ms, 0.99).toFixed(2)} ms, max ${Math.max(...ms).toFixed(2)} ms`);
for (const c of conns) c.close();
other.close();
