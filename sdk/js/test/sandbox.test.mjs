// Sandbox lifecycle against a real daemon: create, info, list, timeouts,
// pause/resume, metrics, kill, typed errors.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { startDaemon } from './daemon.mjs';
import {
  Sandbox,
  SandboxError,
  NotFoundError,
  InvalidArgumentError,
  TimeoutError,
  CommandExitError,
} from '../dist/index.js';

let daemon;
let opts;
before(async () => {
  daemon = await startDaemon();
  opts = { socket: daemon.socket };
});
after(async () => {
  const r = await daemon.stop();
  assert.equal(r.code, 0, 'the daemon exits cleanly on SIGTERM');
});

test('the package loads with require() as well as import', () => {
  const sdk = createRequire(import.meta.url)('../dist/index.js');
  assert.equal(sdk.Sandbox, Sandbox);
  assert.equal(sdk.default, Sandbox);
});

test('create with envs, metadata, limits; getInfo; kill', async () => {
  const sbx = await Sandbox.create({ ...opts, envs: { GREETING: 'hi' }, metadata: { owner: 'sdk-test' }, limits: { pids: 64 } });
  assert.match(sbx.sandboxId, /^[a-z0-9][a-z0-9-]*$/);
  const info = await sbx.getInfo();
  assert.equal(info.sandboxId, sbx.sandboxId);
  assert.equal(info.templateId, 'default');
  assert.equal(info.state, 'running');
  assert.deepEqual(info.metadata, { owner: 'sdk-test' });
  assert.equal(info.limits.pids, 64);
  assert.equal(info.timeoutMs, 300_000, 'default lifetime: 5 minutes, as E2B');
  assert.ok(info.startedAt instanceof Date && info.endAt instanceof Date);
  assert.ok(info.endAt.getTime() - info.startedAt.getTime() >= 299_000);
  const r = await sbx.commands.run('echo $GREETING');
  assert.equal(r.stdout, 'hi\n');
  assert.equal(await sbx.isRunning(), true);
  assert.equal(await sbx.kill(), true);
  assert.equal(await Sandbox.kill(sbx.sandboxId, opts), false, 'already gone');
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, opts), NotFoundError);
});

test('create(template, opts) as E2B, and timeoutMs maps to the lifetime', async () => {
  const sbx = await Sandbox.create('default', { ...opts, timeoutMs: 120_000 });
  try {
    assert.equal((await sbx.getInfo()).timeoutMs, 120_000);
  } finally {
    await sbx.kill();
  }
});

test('setTimeout moves the deadline; 0 removes it', async () => {
  const sbx = await Sandbox.create(opts);
  try {
    await sbx.setTimeout(3_600_000);
    let info = await sbx.getInfo();
    assert.equal(info.timeoutMs, 3_600_000);
    assert.ok(info.endAt.getTime() - Date.now() > 3_500_000);
    await Sandbox.setTimeout(sbx.sandboxId, 0, opts);
    info = await sbx.getInfo();
    assert.equal(info.timeoutMs, 0);
    assert.equal(info.endAt, undefined);
    await assert.rejects(sbx.setTimeout(-1), InvalidArgumentError);
  } finally {
    await sbx.kill();
  }
});

test('a sandbox dies when its lifetime runs out', async () => {
  const sbx = await Sandbox.create({ ...opts, timeoutMs: 1500 });
  const h = await sbx.commands.run('sleep 30', { background: true });
  await assert.rejects(h.wait(), (e) => e instanceof TimeoutError && /gone/.test(e.message));
  assert.equal(await sbx.isRunning(), false);
});

test('Sandbox.kill of an unknown id is false', async () => {
  assert.equal(await Sandbox.kill('nosuchbox', opts), false);
});

test('list: a paginator over the daemon list, filtered by metadata and state', async () => {
  const a = await Sandbox.create({ ...opts, metadata: { suite: 'list', n: '1' } });
  const b = await Sandbox.create({ ...opts, metadata: { suite: 'list', n: '2' } });
  const c = await Sandbox.create({ ...opts, metadata: { suite: 'list', n: '3' } });
  try {
    const all = await Sandbox.list(opts).nextItems();
    const ids = all.map((s) => s.sandboxId);
    for (const s of [a, b, c]) assert.ok(ids.includes(s.sandboxId));

    const p = Sandbox.list({ ...opts, query: { metadata: { suite: 'list' } }, limit: 2 });
    assert.equal(p.hasNext, true);
    const page1 = await p.nextItems();
    assert.equal(page1.length, 2);
    assert.equal(p.hasNext, true);
    assert.equal(typeof p.nextToken, 'string');
    const page2 = await p.nextItems();
    assert.equal(page2.length, 1);
    assert.equal(p.hasNext, false);
    // the daemon orders by created_at (seconds), then id
    assert.deepEqual([...page1, ...page2].map((s) => s.metadata.n).sort(), ['1', '2', '3']);
    await assert.rejects(p.nextItems(), /No more items to fetch/);

    const one = await Sandbox.list({ ...opts, query: { metadata: { suite: 'list', n: '2' } } }).nextItems();
    assert.deepEqual(one.map((s) => s.sandboxId), [b.sandboxId]);

    // start-time filters (the daemon keeps seconds)
    const started = (await a.getInfo()).startedAt;
    const since = await Sandbox.list({ ...opts, query: { metadata: { suite: 'list' }, startedAfter: started } }).nextItems();
    assert.equal(since.length, 3);
    const future = new Date(Date.now() + 3600_000);
    assert.equal((await Sandbox.list({ ...opts, query: { startedAfter: future } }).nextItems()).length, 0);
    assert.equal((await Sandbox.list({ ...opts, query: { metadata: { suite: 'list' }, startedBefore: started } }).nextItems()).length, 0);
    assert.equal((await Sandbox.list({ ...opts, query: { metadata: { suite: 'list' }, startedBefore: future } }).nextItems()).length, 3);

    await b.pause();
    const paused = await Sandbox.list({ ...opts, query: { state: ['paused'], metadata: { suite: 'list' } } }).nextItems();
    assert.deepEqual(paused.map((s) => s.sandboxId), [b.sandboxId]);
  } finally {
    for (const s of [a, b, c]) await s.kill();
  }
});

test('connect to an existing sandbox; unknown id is NotFoundError', async () => {
  const sbx = await Sandbox.create(opts);
  try {
    await sbx.files.write('note', 'from the first client');
    const again = await Sandbox.connect(sbx.sandboxId, opts);
    assert.equal(again.sandboxId, sbx.sandboxId);
    assert.equal(await again.files.read('/home/user/note'), 'from the first client');
    await assert.rejects(Sandbox.connect('nosuchbox', opts), NotFoundError);
  } finally {
    await sbx.kill();
  }
});

test('pause and resume; commands are refused while paused; connect resumes', async () => {
  const sbx = await Sandbox.create(opts);
  try {
    assert.equal(await sbx.pause(), true);
    assert.equal((await sbx.getInfo()).state, 'paused');
    assert.equal(await sbx.isRunning(), false);
    await assert.rejects(sbx.commands.run('true'), (e) => e instanceof SandboxError && e.code === -32001);
    assert.equal(await sbx.resume(), true);
    assert.equal((await sbx.commands.run('echo back')).stdout, 'back\n');
    await sbx.pause();
    const again = await Sandbox.connect(sbx.sandboxId, opts);
    assert.equal((await again.getInfo()).state, 'running', 'connect resumes a paused sandbox, as E2B');
  } finally {
    await sbx.kill();
  }
});

test('getMetrics: one sample of the cgroup counters', async () => {
  const sbx = await Sandbox.create({ ...opts, limits: { memory: '256M', cpus: 0.5 } });
  try {
    const [m] = await sbx.getMetrics();
    assert.ok(m.timestamp instanceof Date);
    assert.ok(m.memUsed > 0);
    assert.ok(m.pids >= 1);
    assert.equal(m.memTotal, 256 * 1024 * 1024);
    // E2B's cpuCount is whole cores: a 0.5 quota may use one
    assert.equal(m.cpuCount, 1);
  } finally {
    await sbx.kill();
  }
});

test('errors are typed', async () => {
  await assert.rejects(Sandbox.create({ ...opts, image: 'nosuchimage' }), SandboxError);
  // accel is sent: the linux backend has none to choose
  await assert.rejects(Sandbox.create({ ...opts, accel: 'tcg' }), (e) => e instanceof SandboxError && /'accel' is for microVMs/.test(e.message));
  await assert.rejects(Sandbox.create({ ...opts, limits: { pids: -1 } }), (e) => e instanceof InvalidArgumentError && e.code === -32602);
  await assert.rejects(Sandbox.create({ socket: daemon.dir + '/nothing.sock' }), (e) => e instanceof SandboxError && /cannot reach/.test(e.message));
  const e = new CommandExitError({ exitCode: 2, stdout: 'o', stderr: 'e', error: 'exit status 2' });
  assert.ok(e instanceof SandboxError && e instanceof Error);
  assert.equal(e.name, 'CommandExitError');
  assert.equal(new NotFoundError('x').name, 'NotFoundError');
  assert.equal(new TimeoutError('x').name, 'TimeoutError');
});
