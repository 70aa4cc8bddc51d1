// bench/list-cost's measurement (see bench/list-cost): N idle boxes, then
// CALLS sandbox.list calls one after another.
import { readFileSync } from 'node:fs';
import { Bare, now, cpuOf, loadavg } from './rpc.mjs';

const n = Number(process.argv[2] ?? 1000);
const calls = Number(process.argv[3] ?? 200);
const label = process.argv[4] ?? '';
const pid = process.env.TUPPER_DAEMON_PID;
const c = await Bare.open(process.env.TUPPER_SOCKET);
for (let i = 0; i < n; i++) await c.call('sandbox.create', {});
for (let i = 0; i < 10; i++) await c.call('sandbox.list', {});
const load = loadavg();
const cpu0 = cpuOf(pid);
const t0 = now();
let listed = 0;
for (let i = 0; i < calls; i++) listed = (await c.call('sandbox.list', {})).sandboxes.length;
const wall = (now() - t0) / calls;
const cpu = (cpuOf(pid) - cpu0) * 1000 / calls;
const rss = Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) / 1024;
console.log(`${label}: ${listed} boxes, ${calls} lists (load ${load}): ${wall.toFixed(2)} ms a call, daemon CPU ${cpu.toFixed(2)} ms a call; daemon RSS ${rss.toFixed(1)} MiB`);
c.close();
