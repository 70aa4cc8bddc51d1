// bench/loop-idle's measurements (see bench/loop-idle).
import { readFileSync, readdirSync } from 'node:fs';
import { Bare, now, loadavg } from './rpc.mjs';

const want = Number(process.argv[2] ?? 5000);
const pid = process.env.TUPPER_DAEMON_PID;
const PAR = 8; // creates in flight
const meminfo = (k) => Number(readFileSync('/proc/meminfo', 'utf8').match(new RegExp(`^${k}:\\s+(\\d+)`, 'm'))[1]) * 1024;
const rss = () => Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+)/m)[1]) * 1024;
const fds = () => readdirSync(`/proc/${pid}/fd`).length;
const MiB = 1024 * 1024;

const conns = await Promise.all(Array.from({ length: PAR }, () => Bare.open(process.env.TUPPER_SOCKET)));
// warm: the image laid out once
{
  const b = await conns[0].call('sandbox.create', { limits: { timeout: 0 } });
  await conns[0].call('sandbox.kill', { id: b.id });
}
await new Promise((r) => setTimeout(r, 1000));
const avail0 = meminfo('MemAvailable');
const rss0 = rss();
const fds0 = fds();
console.log(`before: MemAvailable ${(avail0 / MiB).toFixed(0)} MiB, daemon RSS ${(rss0 / MiB).toFixed(1)} MiB, ${fds0} fds (load ${loadavg()})`);
console.log('| boxes | host MiB used | per box MiB | daemon RSS MiB | daemon fds | s so far |');
console.log('|---:|---:|---:|---:|---:|---:|');
const ids = [];
let stop = null;
const t0 = now();
const row = () => {
  const used = avail0 - meminfo('MemAvailable');
  console.log(`| ${ids.length} | ${(used / MiB).toFixed(0)} | ${(used / ids.length / MiB).toFixed(3)} | ${(rss() / MiB).toFixed(1)} | ${fds()} | ${((now() - t0) / 1000).toFixed(0)} |`);
};
let next = 0;
await Promise.all(conns.map(async (c) => {
  while (!stop && next < want) {
    next++;
    try {
      ids.push((await c.call('sandbox.create', { limits: { timeout: 0 } })).id);
      if (ids.length % 500 === 0) row();
    } catch (e) {
      stop = stop ?? `create #${ids.length + 1} refused: ${e.message}`;
    }
  }
}));
await new Promise((r) => setTimeout(r, 2000)); // what the last creates left to settle
if (ids.length % 500 !== 0 || stop) row();
console.log(stop ? `stopped: ${stop}` : `all ${want} created`);
const t1 = now();
let k = 0;
await Promise.all(conns.map(async (c) => {
  while (k < ids.length) {
    const id = ids[k++];
    await c.call('sandbox.kill', { id }).catch(() => {});
  }
}));
console.log(`removed ${ids.length} in ${((now() - t1) / 1000).toFixed(0)} s`);
for (const c of conns) c.close();
