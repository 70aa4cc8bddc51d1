// bench/loop-idle's measurements (see bench/loop-idle).
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { Bare, now, loadavg, pct } from './rpc.mjs';

const want = Number(process.argv[2] ?? 5000);
const pid = process.env.TUPPER_DAEMON_PID;
const PAR = 8; // creates in flight
const STEP = want >= 2000 ? 500 : 100; // a row each STEP boxes
const MiB = 1024 * 1024;
const KiB = 1024;
const meminfoAll = () => {
  const m = {};
  for (const l of readFileSync('/proc/meminfo', 'utf8').split('\n')) {
    const x = l.match(/^(\w+):\s+(\d+)/);
    if (x) m[x[1]] = Number(x[2]) * 1024;
  }
  return m;
};
const meminfo = (k) => meminfoAll()[k];
const status = (p, k) => Number((readFileSync(`/proc/${p}/status`, 'utf8').match(new RegExp(`^${k}:\\s+(\\d+)`, 'm')) ?? [0, 0])[1]) * 1024;
const rss = () => status(pid, 'VmRSS');
const fds = () => readdirSync(`/proc/${pid}/fd`).length;
// kernel slab caches, bytes each (root only; {} where unreadable)
const slabs = () => {
  const o = {};
  try {
    for (const l of readFileSync('/proc/slabinfo', 'utf8').split('\n').slice(2)) {
      const f = l.split(/\s+/);
      if (f.length > 3) o[f[0]] = Number(f[2]) * Number(f[3]);
    }
  } catch { /* not root */ }
  return o;
};
const readNum = (f) => { try { return Number(readFileSync(f, 'utf8').trim()); } catch { return NaN; } };

// The daemon's fds grouped by what they are (sockets, pidfds, cgroup
// files, ...), for the per-box count.
function fdKinds() {
  const kinds = {};
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    let t;
    try { t = readlinkSync(`/proc/${pid}/fd/${fd}`); } catch { continue; }
    const k = t.startsWith('socket:') ? 'socket'
      : t.startsWith('anon_inode:') ? t
      : t.startsWith('pipe:') ? 'pipe'
      : t.startsWith('/sys/fs/cgroup/') ? 'cgroup file'
      : t.startsWith('/dev/') ? t : 'other file';
    kinds[k] = (kinds[k] ?? 0) + 1;
  }
  return kinds;
}

// What the boxes hold on the host: their processes (count, RSS, PSS) and
// what their memory cgroups were charged (v1's usage counts the kernel's
// memory too: mounts, namespaces, page tables), read from the box cgroups
// named tupper/<tag>-<id>.
function boxHoldings(ids) {
  const base = '/sys/fs/cgroup/memory/tupper';
  const pidsBase = '/sys/fs/cgroup/pids/tupper';
  let names = [];
  try { names = readdirSync(base); } catch { /* v2 or no memory hierarchy */ }
  const set = new Set(ids);
  const mine = names.filter((n) => set.has(n.slice(n.lastIndexOf('-') + 1)));
  let charged = 0, kmem = 0, procs = 0, prss = 0, ppss = 0, panon = 0, first = null, second = null, firstBox = null;
  for (const n of mine) {
    charged += readNum(`${base}/${n}/memory.usage_in_bytes`) || 0;
    kmem += readNum(`${base}/${n}/memory.kmem.usage_in_bytes`) || 0;
    let list = [];
    try { list = readFileSync(`${pidsBase}/${n}/cgroup.procs`, 'utf8').split('\n').filter(Boolean); } catch { /* none */ }
    try {
      // the box's processes, in its sub trees too
      for (const sub of readdirSync(`${pidsBase}/${n}`, { withFileTypes: true })) {
        if (sub.isDirectory()) list = list.concat(readFileSync(`${pidsBase}/${n}/${sub.name}/cgroup.procs`, 'utf8').split('\n').filter(Boolean));
      }
    } catch { /* gone */ }
    for (const p of list) {
      procs++;
      if (first === null) [first, firstBox] = [p, n];
      else if (second === null && n !== firstBox) second = p; // another box's

      prss += status(p, 'VmRSS');
      panon += status(p, 'RssAnon');
      try {
        ppss += Number((readFileSync(`/proc/${p}/smaps_rollup`, 'utf8').match(/^Pss:\s+(\d+)/m) ?? [0, 0])[1]) * 1024;
      } catch { /* gone */ }
    }
  }
  return { boxes: mine.length, charged, kmem, procs, prss, ppss, panon, first, second };
}

// The superblocks a box made (each one a shrinker that every memory cgroup
// keeps room for): the devices of the mounts its process `p` sees that
// neither the daemon's mount namespace nor another box's process `q` has,
// by file system type (one the boxes share, such as their /sys, is not a
// box's own).  Not counted: the kernel's internal mount of each IPC
// namespace's mqueue.
function ownSuperblocks(p, q) {
  const devs = (f) => {
    const m = new Map();
    for (const l of readFileSync(f, 'utf8').split('\n')) {
      const x = l.split(' - ');
      if (x.length === 2) m.set(x[0].split(' ')[2], x[1].split(' ')[0]);
    }
    return m;
  };
  try {
    const host = devs(`/proc/${pid}/mountinfo`);
    if (q) for (const d of devs(`/proc/${q}/mountinfo`).keys()) host.set(d, '');
    const types = [...devs(`/proc/${p}/mountinfo`)].filter(([d]) => !host.has(d)).map(([, t]) => t);
    return types.sort();
  } catch { return null; }
}

const conns = await Promise.all(Array.from({ length: PAR }, () => Bare.open(process.env.TUPPER_SOCKET)));
// warm: the image laid out once
{
  const b = await conns[0].call('sandbox.create', { limits: { timeout: 0 } });
  await conns[0].call('sandbox.kill', { id: b.id });
}
await new Promise((r) => setTimeout(r, 1000));
const mem0 = meminfoAll();
const avail0 = mem0.MemAvailable;
const rss0 = rss();
const fds0 = fds();
const kinds0 = fdKinds();
const slab0 = slabs();
console.log(`before: MemAvailable ${(avail0 / MiB).toFixed(0)} MiB, daemon RSS ${(rss0 / MiB).toFixed(1)} MiB, ${fds0} fds (load ${loadavg()})`);
console.log('| boxes | host MiB used | per box MiB | daemon RSS MiB | daemon fds | s so far | creates/s (since the last row) | create p50 / p99 ms |');
console.log('|---:|---:|---:|---:|---:|---:|---:|---:|');
const ids = [];
let stop = null;
const t0 = now();
let tLast = t0;
let lat = [];
const row = () => {
  const used = avail0 - meminfo('MemAvailable');
  const t = now();
  const rate = lat.length / ((t - tLast) / 1000);
  console.log(`| ${ids.length} | ${(used / MiB).toFixed(0)} | ${(used / ids.length / MiB).toFixed(3)} | ${(rss() / MiB).toFixed(1)} | ${fds()} | ${((t - t0) / 1000).toFixed(0)} | ${rate.toFixed(1)} | ${lat.length ? `${pct(lat, 0.5).toFixed(0)} / ${pct(lat, 0.99).toFixed(0)}` : '-'} |`);
  tLast = t;
  lat = [];
};
let next = 0;
await Promise.all(conns.map(async (c) => {
  while (!stop && next < want) {
    next++;
    try {
      const a = now();
      ids.push((await c.call('sandbox.create', { limits: { timeout: 0 } })).id);
      lat.push(now() - a);
      if (ids.length % STEP === 0) row();
    } catch (e) {
      stop = stop ?? `create #${ids.length + 1} refused: ${e.message}`;
    }
  }
}));
await new Promise((r) => setTimeout(r, 2000)); // what the last creates left to settle
if (ids.length % STEP !== 0 || stop) row();
console.log(stop ? `stopped: ${stop}` : `all ${want} created`);

// Where the memory and the fds went, per box.
{
  const n = ids.length;
  const m = meminfoAll();
  const d = (k) => ((m[k] - mem0[k]) / n / KiB).toFixed(1);
  console.log(`\nper box (${n} boxes, load ${loadavg()}):`);
  console.log(`- host, /proc/meminfo deltas in KiB a box: MemAvailable -${((mem0.MemAvailable - m.MemAvailable) / n / KiB).toFixed(1)}, ` +
    `AnonPages ${d('AnonPages')}, Slab ${d('Slab')} (SUnreclaim ${d('SUnreclaim')}), KernelStack ${d('KernelStack')}, ` +
    `PageTables ${d('PageTables')}, Percpu ${d('Percpu')}, Shmem ${d('Shmem')}`);
  const h = boxHoldings(ids);
  if (h.boxes > 0) {
    console.log(`- box cgroups: ${h.boxes} found, charged ${(h.charged / h.boxes / KiB).toFixed(1)} KiB a box ` +
      `(kmem ${(h.kmem / h.boxes / KiB).toFixed(1)}); ${(h.procs / h.boxes).toFixed(2)} processes a box, ` +
      `RSS ${(h.prss / h.boxes / KiB).toFixed(1)} KiB (anonymous ${(h.panon / h.boxes / KiB).toFixed(1)}), ` +
      `PSS ${(h.ppss / h.boxes / KiB).toFixed(1)} KiB a box`);
    const sb = h.first ? ownSuperblocks(h.first, h.second) : null;
    if (sb) console.log(`- superblocks a box mounts: ${sb.length} (${sb.join(', ')}), and its IPC namespace's mqueue`);
  }
  const r = rss();
  console.log(`- daemon: RSS ${((r - rss0) / n / KiB).toFixed(1)} KiB a box (${(r / MiB).toFixed(1)} MiB in all), ` +
    `${((fds() - fds0) / n).toFixed(2)} fds a box`);
  const s1 = slabs();
  const grown = Object.keys(s1).map((k) => [k, (s1[k] - (slab0[k] ?? 0)) / n]).sort((a, b) => b[1] - a[1]).slice(0, Number(process.env.IDLE_SLABS ?? 10));
  if (grown.length) console.log(`- kernel slab caches that grew most, KiB a box: ${grown.map(([k, v]) => `${k} ${(v / KiB).toFixed(1)}`).join(', ')}`);
  const k1 = fdKinds();
  const parts = Object.keys(k1).sort().map((k) => `${k} ${(((k1[k] ?? 0) - (kinds0[k] ?? 0)) / n).toFixed(2)}`);
  console.log(`- daemon fds a box by kind: ${parts.join(', ')}`);
}

// IDLE_HOLD=S keeps the boxes S seconds more before removing them (to
// look at them by hand)
await new Promise((r) => setTimeout(r, Number(process.env.IDLE_HOLD ?? 0) * 1000));
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
