// The backend against a real tupper daemon and sandbox: deepagents'
// SandboxBackendProtocolV2 as BaseSandbox builds it on execute, uploadFiles
// and downloadFiles, with its error kinds; the factory's options.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startDaemon } from '../../../js/test/daemon.mjs';
import { adapter, deepagents, loaded } from './framework.mjs';
import { Sandbox, NotFoundError } from '../../../js/dist/index.js';

const { TupperSandbox, createTupperBackend } = adapter;
let daemon;
let be;

before(async () => {
  daemon = await startDaemon();
  be = await createTupperBackend({ socket: daemon.socket, limits: { memory: '256M', pids: 128 }, network: 'none', policy: false, maxOutputBytes: 4096 });
});
after(async () => {
  try {
    await be?.close();
  } finally {
    if (daemon) assert.equal((await daemon.stop()).code, 0);
  }
});

test(`it is a deepagents sandbox backend (deepagents ${loaded.version}, ${loaded.which})`, () => {
  assert.ok(be instanceof deepagents.BaseSandbox);
  assert.ok(deepagents.isSandboxBackend(be));
  assert.equal(be.id, be.sandbox.sandboxId);
  if (loaded.which === 'lowest') assert.equal(loaded.version, '1.12.0');
});

test('execute: combined output in order, the exit code, truncation to the newest bytes', async () => {
  const r = await be.execute('echo out; sleep 0.1; echo err >&2; sleep 0.1; echo again; exit 3');
  assert.deepEqual(r, { output: 'out\nerr\nagain\n', exitCode: 3, truncated: false });
  const ok = await be.execute('id -un; pwd');
  assert.deepEqual(ok, { output: 'user\n/home/user\n', exitCode: 0, truncated: false });
  const big = await be.execute('seq 1 100000');
  assert.equal(big.truncated, true);
  assert.equal(Buffer.byteLength(big.output), 4096);
  assert.ok(big.output.endsWith('99999\n100000\n'));
  const missing = await be.execute('no-such-program');
  assert.equal(missing.exitCode, 127);
});

test('execute: a command past its timeout is killed and says so', async () => {
  const quick = TupperSandbox.fromSandbox(be.sandbox, { executeTimeoutMs: 500 });
  const t0 = Date.now();
  const r = await quick.execute('echo started; sleep 30');
  assert.ok(Date.now() - t0 < 10_000);
  assert.equal(r.exitCode, null);
  assert.match(r.output, /^started\n[\s\S]*timeoutMs/);
  await quick.close(); // not its sandbox: still running
  assert.equal(await be.sandbox.isRunning(), true);
});

test('uploadFiles and downloadFiles: bytes both ways, each file on its own, with deepagents error kinds', async () => {
  const bin = new Uint8Array([0, 255, 10, 13, 128]);
  await be.sandbox.files.write('/home/user/secret', 'root only', { user: 'root', mode: 0o600 });
  await be.sandbox.commands.run(['chown', 'root:root', '/home/user/secret'], { user: 'root' });
  const up = await be.uploadFiles([
    ['/home/user/d/a.bin', bin],
    ['relative.txt', bin],
    ['/etc/passwd', new TextEncoder().encode('evil')],
    ['/home/user/d/a.bin/under-a-file', bin],
    ['/home/user/d', bin],
  ]);
  assert.deepEqual(up.map((x) => x.error), [null, 'invalid_path', 'permission_denied', 'invalid_path', 'is_directory']);
  assert.ok(!(await be.sandbox.files.read('/etc/passwd')).includes('evil'));
  const down = await be.downloadFiles(['/home/user/d/a.bin', '/home/user/nothing', '/home/user/d', '/home/user/secret', 'rel']);
  assert.deepEqual(down.map((x) => x.error), [null, 'file_not_found', 'is_directory', 'permission_denied', 'invalid_path']);
  assert.deepEqual([...down[0].content], [...bin]);
  assert.equal(down[1].content, null);
});

test("BaseSandbox's file operations work on the box's busybox tools", async () => {
  await be.write('/home/user/p/src/main.py', 'import os\n# TODO one\nprint(1)\n');
  await be.write('/home/user/p/notes.md', 'TODO two\n');
  const ls = await be.ls('/home/user/p');
  assert.deepEqual(ls.files.map((f) => f.path).sort(), ['/home/user/p/notes.md', '/home/user/p/src/']);
  const read = await be.read('/home/user/p/src/main.py', 1, 1);
  assert.match(JSON.stringify(read.content), /TODO one/);
  const g = await be.grep('TODO', '/home/user/p');
  assert.deepEqual(g.matches.map((m) => `${m.path}:${m.line}`).sort(), ['/home/user/p/notes.md:1', '/home/user/p/src/main.py:2']);
  const glob = await be.glob('**/*.py', '/home/user/p');
  assert.deepEqual(glob.files.map((f) => f.path), ['src/main.py']);
  const ed = await be.edit('/home/user/p/notes.md', 'TODO', 'DONE');
  assert.equal(ed.error, undefined);
  assert.equal(await be.sandbox.files.read('/home/user/p/notes.md'), 'DONE two\n');
  assert.match(String((await be.read('/home/user/p/none.txt')).error), /not found/);
});

test('the factory connects to a running sandbox by id, and close() leaves that one running', async () => {
  const again = await createTupperBackend({ socket: daemon.socket, sandboxId: be.id });
  assert.equal(again.id, be.id);
  assert.equal((await again.execute('cat /home/user/p/notes.md')).output, 'DONE two\n');
  await again.close();
  assert.equal(await be.sandbox.isRunning(), true);
  // limits reached the box
  const mem = await be.execute('cat /sys/fs/cgroup/memory.max 2>/dev/null || echo none');
  if (mem.output.trim() !== 'none') assert.equal(mem.output.trim(), String(256 * 1024 * 1024));
});

test('the factory makes a box from a recipe, with its limits and network, and close() kills it', async () => {
  const source = 'return recipe "adapter-test" { image = "default", env = { FROM_RECIPE = "yes" }, workdir = "/tmp" }';
  const r = await createTupperBackend({ socket: daemon.socket, policy: false, recipe: { source, name: 'adapter-test' }, limits: { pids: 64 }, network: 'none' });
  let closed = false;
  try {
    assert.equal((await r.execute('echo $FROM_RECIPE; pwd')).output, 'yes\n/tmp\n');
    const info = await r.sandbox.getInfo();
    assert.equal(info.limits.pids, 64);
    // no network: a name does not resolve to the outside
    const net = await r.execute('wget -q -T 2 -O- http://example.com/ 2>&1; echo rc=$?');
    assert.match(net.output, /rc=[1-9]/);
    await r.close();
    closed = true;
    await assert.rejects(Sandbox.getInfo(r.id, { socket: daemon.socket }), NotFoundError);
  } finally {
    if (!closed) await r.close();
  }
});
