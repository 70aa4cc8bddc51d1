// bench/loop's measurements (see bench/loop).  Bare JSON-RPC clients on the
// daemon's socket: the SDK's own costs are bench/sdk's business.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { Bare, now, pct, cpuOf } from './rpc.mjs';

const races = Number(process.argv[2] ?? 1000);
const piped = Number(process.argv[3] ?? 200);
const stateDir = process.argv[4];
const daemonCpu = () => cpuOf(process.env.TUPPER_DAEMON_PID);

// the other client: sandbox.list calls one after another until stop()
function prober(c) {
  const ms = [];
  let going = true;
  const done = (async () => {
    while (going) {
      const t = now();
      await c.call('sandbox.list', {});
      ms.push(now() - t);
      await new Promise((r) => setTimeout(r, 2));
    }
  })();
  return { ms, stop: async () => { going = false; await done; return ms; } };
}

const load = await Bare.open(process.env.TUPPER_SOCKET);
const other = await Bare.open(process.env.TUPPER_SOCKET);
const box = await load.call('sandbox.create', { limits: { timeout: 0 } });
const sandbox = box.id;
const rows = [];
try {
  for (let i = 0; i < 20; i++) await load.call('process.start', { sandbox, argv: ['/bin/true'] });
  // quiet: the other client alone, for about as many calls as the storm gives it
  {
    const p = prober(other);
    await new Promise((r) => setTimeout(r, 3000));
    rows.push(['quiet', await p.stop(), 0]);
  }
  // start + kill races, 8 in flight at a time
  {
    const p = prober(other);
    const t = now();
    let next = 0, failed = 0;
    const worker = async () => {
      while (next < races) {
        next++;
        try {
          const { pid } = await load.call('process.start', { sandbox, argv: ['/bin/sleep', '30'] });
          await load.call('process.signal', { sandbox, pid, signal: 9 });
        } catch { failed++; }
      }
    };
    await Promise.all(Array.from({ length: 8 }, worker));
    const secs = (now() - t) / 1000;
    rows.push([`${races} start+kill races (${(races / secs).toFixed(0)}/s${failed ? `, ${failed} refused` : ''})`, await p.stop(), secs]);
  }
  // N starts sent at once
  {
    const p = prober(other);
    await new Promise((r) => setTimeout(r, 50));
    const t = now();
    const rs = await Promise.allSettled(Array.from({ length: piped }, () =>
      load.call('process.start', { sandbox, argv: ['/bin/true'] })));
    const secs = (now() - t) / 1000;
    const refused = rs.filter((r) => r.status === 'rejected').length;
    rows.push([`${piped} pipelined starts (${refused} refused)`, await p.stop(), secs]);
  }
  // pause and resume, one after another for 3 s, of a box whose shells
  // vfork in a loop (dash runs each command through vfork()): a v1 freeze
  // waits while a task is caught inside the call (issue 14)
  {
    const vbox = await load.call('sandbox.create', { limits: { timeout: 0 } });
    try {
      for (let i = 0; i < 2; i++) {
        await load.call('process.start', { sandbox: vbox.id, argv: ['/bin/sh', '-c', 'while :; do /bin/true; done'] });
      }
      const pauses = [];
      const p = prober(other);
      const t = now();
      while (now() - t < 3000) {
        const t0 = now();
        await load.call('sandbox.pause', { id: vbox.id });
        pauses.push(now() - t0);
        await load.call('sandbox.resume', { id: vbox.id });
      }
      const secs = (now() - t) / 1000;
      rows.push([`${pauses.length} pauses of a vforking box (pause p50 ${pct(pauses, 0.5).toFixed(1)} ms, max ${Math.max(...pauses).toFixed(0)} ms)`, await p.stop(), secs]);
    } finally {
      await load.call('sandbox.kill', { id: vbox.id }).catch(() => {});
    }
  }
  // a DNS flood from the box: the host's python3 in the box's network
  // namespace sends UDP queries to the box's resolver as fast as it can
  if (stateDir) {
    const nbox = await load.call('sandbox.create', { limits: { timeout: 0 }, network: { allow: ['flood.test'] } });
    try {
      const rec = JSON.parse(readFileSync(`${stateDir}/boxes/${nbox.id}.json`, 'utf8'));
      const py = `
import socket, time, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)
q = lambda i: struct.pack('>HHHHHH', i & 0xffff, 0x100, 1, 0, 0, 0) + b'\\x05flood\\x04test\\x00\\x00\\x01\\x00\\x01'
sent = got = 0; end = time.time() + 4
while time.time() < end:
    try: s.sendto(q(sent), ('127.0.0.1', 53)); sent += 1
    except BlockingIOError: pass
    try:
        while True: s.recv(512); got += 1
    except BlockingIOError: pass
print(sent, got)
`;
      const p = prober(other);
      await new Promise((r) => setTimeout(r, 50));
      const t = now();
      const cpu0 = daemonCpu();
      const out = await new Promise((resolve) => {
        const c = spawn('nsenter', [`--net=/proc/${rec.pid}/ns/net`, 'python3', '-c', py]);
        let o = '';
        c.stdout.on('data', (d) => { o += d; });
        c.on('close', () => resolve(o.trim()));
      });
      const secs = (now() - t) / 1000;
      const cpu = (daemonCpu() - cpu0) / secs;
      const [sent, got] = out.split(' ').map(Number);
      rows.push([`DNS flood from a box (${(sent / secs).toFixed(0)} queries/s sent, ${(got / secs).toFixed(0)}/s answered, daemon ${(cpu * 100).toFixed(0)}% of a core)`, await p.stop(), secs]);
    } finally {
      await load.call('sandbox.kill', { id: nbox.id }).catch(() => {});
    }
  }
  // one client alone: process.start of /bin/true to its process.exit, the
  // floor under the SDK's commands.run('true') (bench/sdk)
  {
    const ms = [];
    for (let i = 0; i < 200; i++) {
      const t = now();
      await other.run(sandbox, { argv: ['/bin/true'] });
      ms.push(now() - t);
    }
    console.log(`\none client alone: process.start of /bin/true to its process.exit, 200 runs: p50 ${pct(ms, 0.5).toFixed(2)} ms, p99 ${pct(ms, 0.99).toFixed(2)} ms`);
  }
  const q50 = pct(rows[0][1], 0.5);
  console.log(`\nanother client's sandbox.list while one client loads the daemon`);
  console.log('| phase | calls | p50 ms | p99 ms | max ms | p50 ratio to quiet |');
  console.log('|---|---:|---:|---:|---:|---:|');
  for (const [name, ms] of rows) {
    console.log(`| ${name} | ${ms.length} | ${pct(ms, 0.5).toFixed(2)} | ${pct(ms, 0.99).toFixed(2)} | ${Math.max(...ms).toFixed(2)} | ${(pct(ms, 0.5) / q50).toFixed(2)}x |`);
  }
} finally {
  await load.call('sandbox.kill', { id: sandbox }).catch(() => {});
  load.close();
  other.close();
}
