// TupperSandbox against a real tupper daemon: Mastra's WorkspaceSandbox
// contract as MastraSandbox drives it: lifecycle, executeCommand (argv,
// env, cwd, timeout, streaming, abort, retained output), processes, ports,
// info, writeFiles, snapshot.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startDaemon } from '../../../js/test/daemon.mjs';
import { adapter, workspace, loaded } from './framework.mjs';
import { Sandbox } from '../../../js/dist/index.js';

const { TupperSandbox } = adapter;
let daemon;
let sb;

before(async () => {
  daemon = await startDaemon();
  sb = new TupperSandbox({ socket: daemon.socket, policy: false, limits: { memory: '256M', cpus: 1 }, env: { OVERLAY: 'yes' } });
  await sb._start();
});
after(async () => {
  try {
    await sb?._destroy();
  } finally {
    if (daemon) assert.equal((await daemon.stop()).code, 0);
  }
});

test(`a Mastra sandbox on MastraSandbox (@mastra/core ${loaded.version}, ${loaded.which})`, () => {
  assert.ok(sb instanceof workspace.MastraSandbox);
  assert.equal(sb.status, 'running');
  assert.equal(sb.provider, 'tupper');
  assert.match(sb.sandboxId, /./);
  if (loaded.which === 'lowest') assert.equal(loaded.version, '1.40.0');
});

test('executeCommand: a shell line, or argv without a shell when args are given', async () => {
  const r = await sb.executeCommand('echo $OVERLAY; pwd; exit 3');
  assert.equal(r.success, false);
  assert.equal(r.exitCode, 3);
  assert.equal(r.stdout, 'yes\n/home/user\n');
  const a = await sb.executeCommand('printf', ['[%s]\\n', 'a b', '$HOME', ';rm -rf /'], { cwd: '/tmp', env: { E: '1' } });
  assert.equal(a.success, true);
  assert.equal(a.stdout, '[a b]\n[$HOME]\n[;rm -rf /]\n');
  assert.deepEqual(a.args, ['[%s]\\n', 'a b', '$HOME', ';rm -rf /']);
  const e = await sb.executeCommand('sh', ['-c', 'pwd; echo $E'], { cwd: '/tmp', env: { E: '1' } });
  assert.equal(e.stdout, '/tmp\n1\n');
  await assert.rejects(sb.executeCommand('no-such-program', ['x']), workspace.SandboxExecutionError);
  await assert.rejects(sb.executeCommand('echo', { cwd: '/' }), /args must be an array/);
});

test('executeCommand: streaming callbacks, retained-output cap', async () => {
  const out = [];
  const r = await sb.executeCommand('seq 1 5000; echo e >&2', [], { onStdout: (d) => out.push(d), maxRetainedBytes: 10 });
  assert.ok(out.join('').startsWith('1\n2\n3\n'));
  assert.equal(r.stdout, '4999\n5000\n');
  assert.equal(r.stdoutTruncated, true);
  assert.equal(r.stdoutDroppedBytes, out.join('').length - 10);
  assert.equal(r.stderr, 'e\n');
  assert.equal(r.stderrTruncated, false);
});

test('executeCommand: a timeout and an abort kill the command', async () => {
  const t0 = Date.now();
  await assert.rejects(sb.executeCommand('sleep 30', [], { timeout: 300 }), workspace.SandboxTimeoutError);
  const ac = new AbortController();
  setTimeout(() => ac.abort(), 200);
  await assert.rejects(sb.executeCommand('sleep 30', [], { abortSignal: ac.signal }), workspace.SandboxAbortError);
  assert.ok(Date.now() - t0 < 10_000);
  const left = await sb.instance.commands.list();
  assert.deepEqual(left.filter((p) => p.args.join(' ').includes('sleep 30')), []);
});

test('processes: spawn with stdin, list, get, kill', async () => {
  const cat = await sb.processes.spawn('cat');
  assert.match(cat.pid, /^\d+$/);
  await cat.sendStdin('hello\n');
  await cat.closeStdin();
  const r = await cat.wait();
  assert.equal(r.exitCode, 0);
  assert.equal(r.stdout, 'hello\n');
  const sleeper = await sb.processes.spawn('sleep 60', { stdinMode: 'ignore' });
  const listed = await sb.processes.list();
  assert.ok(listed.some((p) => p.pid === sleeper.pid && p.running));
  assert.equal(await sb.processes.get(sleeper.pid), sleeper);
  assert.equal(await sleeper.kill(), true);
  const k = await sleeper.wait();
  assert.equal(k.killed, true);
  assert.equal(k.success, false);
  assert.equal(await sb.processes.get('99999'), undefined);
  assert.equal(await sb.processes.get('not-a-pid'), undefined);
  // a process started by another client is found, and attached to with its recent output
  const other = await Sandbox.connect(sb.sandboxId, { socket: daemon.socket });
  const h = await other.commands.run('echo from-elsewhere; sleep 60', { background: true });
  await new Promise((res) => setTimeout(res, 300));
  assert.ok((await sb.processes.list()).some((p) => p.pid === String(h.pid) && p.command.includes('sleep 60')));
  const attached = await sb.processes.get(String(h.pid));
  assert.equal(attached.stdout, 'from-elsewhere\n');
  assert.equal(await attached.kill(), true);
  await assert.rejects(h.wait());
});

test('getPortUrl: a server in the box answers on the host loopback', async () => {
  await sb.instance.files.write('/home/user/www/index.html', 'served by the box\n');
  const server = await sb.processes.spawn('httpd -f -p 8080 -h /home/user/www', { stdinMode: 'ignore' });
  try {
    const url = await sb.networking.getPortUrl(8080);
    assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/);
    let body;
    for (let i = 0; i < 50 && body === undefined; i++) {
      try {
        body = await (await fetch(`${url}/index.html`)).text();
      } catch {
        await new Promise((res) => setTimeout(res, 100));
      }
    }
    assert.equal(body, 'served by the box\n');
    await assert.rejects(sb.networking.getPortUrl(70000));
  } finally {
    await server.kill();
  }
});

test('getInfo: the limits and what the box uses now', async () => {
  const info = await sb.getInfo();
  assert.equal(info.provider, 'tupper');
  assert.equal(info.status, 'running');
  assert.equal(info.resources.memoryMB, 256);
  assert.equal(info.resources.cpuCores, 1);
  assert.ok(info.resources.memoryUsedMB > 0);
  assert.ok(info.timeoutAt instanceof Date);
  assert.equal(info.metadata.sandboxId, sb.sandboxId);
});

test('writeFiles with modes; snapshot is a no-op without checkpoints', async () => {
  await sb.writeFiles([{ path: '/home/user/bin/run.sh', content: '#!/bin/sh\necho ran\n', mode: 0o755 }, { path: '/home/user/k', content: Buffer.from('key') , mode: 0o600 }]);
  assert.equal((await sb.executeCommand('/home/user/bin/run.sh')).stdout, 'ran\n');
  assert.equal((await sb.instance.files.getInfo('/home/user/k')).mode, 0o600);
  await assert.rejects(sb.writeFiles([{ path: '/home/user/bad', content: 'x', mode: 0o4755 }]));
  assert.equal(await sb.instance.files.exists('/home/user/bad'), false);
  await assert.rejects(sb.writeFiles([{ path: '/etc/nope', content: 'x' }]));
  assert.equal(sb.supportsCheckpoints, false);
  await sb.snapshot();
});

test('stop pauses the box and start resumes it; destroy kills only a box it made', async () => {
  await sb._stop();
  assert.equal(sb.status, 'stopped');
  assert.equal((await sb.instance.getInfo()).state, 'paused');
  await sb._start();
  assert.equal(sb.status, 'running');
  assert.equal((await sb.executeCommand('echo back')).stdout, 'back\n');
  const joined = new TupperSandbox({ socket: daemon.socket, sandboxId: sb.sandboxId });
  assert.equal((await joined.executeCommand('cat /home/user/k')).stdout, 'key');
  await joined._destroy();
  assert.equal(await sb.instance.isRunning(), true);
});

test('clone: a sibling with the same options makes its own box on start', async () => {
  const twin = sb.clone({ id: 'twin', env: { TWIN: '1' } });
  assert.equal(twin.id, 'twin');
  assert.equal(twin.sandboxId, undefined, 'no I/O before start');
  try {
    const r = await twin.executeCommand('echo $OVERLAY-$TWIN; cat /sys/fs/cgroup/memory.max 2>/dev/null || true');
    assert.equal(r.stdout.split('\n')[0], 'yes-1');
    assert.notEqual(twin.sandboxId, sb.sandboxId);
    assert.equal((await twin.getInfo()).resources.memoryMB, 256);
  } finally {
    await twin._destroy();
  }
  assert.equal(await sb.instance.isRunning(), true);
});

test("setEnv: Mastra's runtime env overlay reaches later commands and processes", async (t) => {
  if (typeof sb.setEnv !== 'function') return t.skip(`@mastra/core ${loaded.version} has no setEnv`);
  sb.setEnv((env) => ({ ...env, LATER: 'x', OVERLAY: undefined }));
  try {
    assert.equal((await sb.executeCommand('echo $LATER-${OVERLAY:-unset}')).stdout, 'x-unset\n');
    const p = await sb.processes.spawn('echo $LATER', { stdinMode: 'ignore' });
    assert.equal((await p.wait()).stdout, 'x\n');
  } finally {
    sb.setEnv((env) => ({ ...env, LATER: undefined, OVERLAY: 'yes' }));
  }
});
