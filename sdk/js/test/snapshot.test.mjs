// Snapshots and fork through the TypeScript SDK, with E2B's names, against a
// real daemon (docs/snapshots.md).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startDaemon } from './daemon.mjs';
import { Sandbox, InvalidArgumentError, SandboxError } from '../dist/index.js';

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

test('createSnapshot, Sandbox.create from it (E2B form and snapshot option), listSnapshots, deleteSnapshot', async () => {
  const sbx = await Sandbox.create({ ...opts, envs: { WHO: 'parent' } });
  const made = [sbx];
  try {
    await sbx.files.write('state.txt', 'v1');
    const snap = await sbx.createSnapshot({ name: 'sdk-snap' });
    assert.match(snap.snapshotId, /^s[0-9a-f]{12}$/);
    assert.deepEqual(snap.names, ['sdk-snap']);
    await sbx.files.write('state.txt', 'v2');

    const a = await Sandbox.create(snap.snapshotId, opts); // E2B's form
    made.push(a);
    assert.equal(await a.files.read('state.txt'), 'v1');
    assert.equal((await a.commands.run('echo $WHO')).stdout, 'parent\n');
    const b = await Sandbox.create({ ...opts, snapshot: 'sdk-snap' });
    made.push(b);
    await b.files.write('state.txt', 'b');
    assert.equal(await a.files.read('state.txt'), 'v1');

    const pages = Sandbox.listSnapshots(opts);
    assert.equal(pages.hasNext, true);
    const list = await pages.nextItems();
    const mine = list.find((s) => s.snapshotId === snap.snapshotId);
    assert.ok(mine);
    assert.deepEqual([...mine.sandboxes].sort(), [a.sandboxId, b.sandboxId].sort());
    assert.equal(pages.hasNext, false);

    await assert.rejects(Sandbox.deleteSnapshot(snap.snapshotId, opts), (e) => e instanceof SandboxError && /in use/.test(e.message));
    await a.kill();
    await b.kill();
    assert.equal(await Sandbox.deleteSnapshot('sdk-snap', opts), true);
    assert.equal(await Sandbox.deleteSnapshot('sdk-snap', opts), false);
  } finally {
    for (const s of made) await s.kill().catch(() => undefined);
  }
});

test('Sandbox.fork and sbx.fork: each fork sees the files, writes on its own', async () => {
  const sbx = await Sandbox.create({ ...opts, limits: { pids: 100 } });
  const made = [sbx];
  try {
    await sbx.files.write('f.txt', 'parent');
    const forks = await Sandbox.fork(sbx.sandboxId, { ...opts, count: 2, timeoutMs: 60_000 });
    made.push(...forks);
    assert.equal(forks.length, 2);
    for (const [i, f] of forks.entries()) {
      assert.ok(f instanceof Sandbox);
      assert.equal(await f.files.read('f.txt'), 'parent');
      await f.files.write('f.txt', `fork ${i}`);
      assert.equal((await f.getInfo()).limits?.pids ?? 100, 100);
    }
    assert.equal(await forks[0].files.read('f.txt'), 'fork 0');
    assert.equal(await sbx.files.read('f.txt'), 'parent');
    const [again] = await sbx.fork();
    made.push(again);
    assert.equal(await again.files.read('f.txt'), 'parent');
  } finally {
    for (const s of made) await s.kill().catch(() => undefined);
    for (const s of await Sandbox.listSnapshots(opts).nextItems()) await Sandbox.deleteSnapshot(s.snapshotId, opts).catch(() => undefined);
  }
});

test('bad counts and names are refused clearly', async () => {
  const sbx = await Sandbox.create(opts);
  try {
    await assert.rejects(Sandbox.fork(sbx, { count: 0 }), InvalidArgumentError);
    await assert.rejects(Sandbox.fork(sbx, { count: 1_000_000 }), InvalidArgumentError);
    await assert.rejects(sbx.createSnapshot({ name: '../x' }), /snapshot name/);
    await assert.rejects(sbx.createSnapshot({ name: 'a/b' }), /snapshot name/);
    await assert.rejects(Sandbox.create({ ...opts, snapshot: 'nosuch' }), /no snapshot/);
  } finally {
    await sbx.kill();
  }
});

test('MCP: sandbox_snapshot, sandbox_restore, sandbox_fork, snapshot_list, snapshot_delete', async () => {
  const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
  const { StdioClientTransport } = await import('@modelcontextprotocol/sdk/client/stdio.js');
  const path = await import('node:path');
  const { fileURLToPath } = await import('node:url');
  const entry = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'cli-mcp.js');
  const c = new Client({ name: 'tupper-snapshot-test', version: '0.0.0' });
  await c.connect(new StdioClientTransport({ command: process.execPath, args: [entry, '--socket', daemon.socket], stderr: 'pipe',
    env: { PATH: process.env.PATH } }));
  const call = async (name, args) => {
    const r = await c.callTool({ name, arguments: args });
    if (r.isError) throw new Error(`${name}: ${r.content[0].text}`);
    return r.structuredContent;
  };
  let snapId;
  try {
    const { sandboxId } = await call('sandbox_create', {});
    await call('run_command', { sandboxId, cmd: 'echo mcp > /tmp/m.txt' });
    const snap = await call('sandbox_snapshot', { sandboxId, name: 'mcp-snap' });
    snapId = snap.snapshotId;
    assert.equal(snap.sandboxId, sandboxId);
    const restored = await call('sandbox_restore', { snapshot: 'mcp-snap' });
    assert.equal((await call('run_command', { sandboxId: restored.sandboxId, cmd: 'cat /tmp/m.txt' })).stdout, 'mcp\n');
    const forked = await call('sandbox_fork', { sandboxId, count: 2 });
    assert.equal(forked.sandboxIds.length, 2);
    for (const id of forked.sandboxIds) assert.equal((await call('run_command', { sandboxId: id, cmd: 'cat /tmp/m.txt' })).stdout, 'mcp\n');
    const list = (await call('snapshot_list', {})).snapshots;
    assert.ok(list.some((s) => s.snapshotId === snapId && s.sandboxes.includes(restored.sandboxId)));
    await assert.rejects(call('snapshot_delete', { snapshot: 'mcp-snap' }), /in use/);
    await assert.rejects(call('sandbox_fork', { sandboxId, count: 0 }), /./);
    await assert.rejects(call('sandbox_snapshot', { sandboxId, name: '../x' }), /./);
    await call('sandbox_kill', { sandboxId: restored.sandboxId });
    assert.deepEqual(await call('snapshot_delete', { snapshot: 'mcp-snap' }), { snapshot: 'mcp-snap', deleted: true });
  } finally {
    await c.close();
    // the session's sandboxes go with it; then its snapshots can go too
    for (let i = 0; i < 100; i++) {
      if ((await Sandbox.list(opts).nextItems()).length === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    for (const s of await Sandbox.listSnapshots(opts).nextItems()) await Sandbox.deleteSnapshot(s.snapshotId, opts).catch(() => undefined);
  }
});

test('HTTP: POST /sandboxes/{id}/snapshots, POST /sandboxes with snapshot, fork, GET /snapshots, DELETE /snapshots/{snapshot}', async () => {
  const { listenHttp } = await import('../dist/http.js');
  const api = await listenHttp({ socket: daemon.socket, listen: '127.0.0.1:0' });
  const req = async (method, path, body) => {
    const r = await fetch(api.url + path, { method, headers: { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
    return { status: r.status, body: await r.json() };
  };
  const made = [];
  try {
    let r = await req('POST', '/sandboxes', {});
    assert.equal(r.status, 201);
    const id = r.body.sandboxId;
    made.push(id);
    await Sandbox.connect(id, opts).then(async (s) => { await s.files.write('/tmp/h.txt', 'http'); });
    r = await req('POST', `/sandboxes/${id}/snapshots`, { name: 'http-snap' });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    const snapId = r.body.snapshotId;
    r = await req('POST', `/sandboxes/${id}/snapshots`, { name: 'a/b' });
    assert.equal(r.status, 409);
    assert.match(r.body.error.message, /snapshot name/);
    r = await req('POST', '/sandboxes', { snapshot: 'http-snap' });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    made.push(r.body.sandboxId);
    assert.equal(await (await Sandbox.connect(r.body.sandboxId, opts)).files.read('/tmp/h.txt'), 'http');
    r = await req('POST', `/sandboxes/${id}/fork`, { count: 2 });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    assert.equal(r.body.sandboxes.length, 2);
    for (const s of r.body.sandboxes) made.push(s.sandboxId);
    r = await req('POST', `/sandboxes/${id}/fork`, { count: 0 });
    assert.equal(r.status, 400);
    r = await req('GET', '/snapshots');
    assert.equal(r.status, 200);
    assert.ok(r.body.snapshots.some((s) => s.snapshotId === snapId));
    r = await req('DELETE', '/snapshots/http-snap');
    assert.equal(r.status, 409);
    r = await req('DELETE', '/snapshots/nosuch');
    assert.equal(r.status, 404);
  } finally {
    for (const id of made) await Sandbox.kill(id, opts).catch(() => false);
    for (const s of await Sandbox.listSnapshots(opts).nextItems()) await Sandbox.deleteSnapshot(s.snapshotId, opts).catch(() => undefined);
    await api.close();
  }
});
