// What the framework adapters (sdk/adapters) need of the SDK, against a real
// daemon: argv commands, AbortSignal, an output cap, files.write's mode,
// files.append and files.copy.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { withSandbox } from './daemon.mjs';
import { Sandbox, AbortError, CommandExitError, InvalidArgumentError, NotFoundError, SandboxError } from '../dist/index.js';

let sbx;
withSandbox(Sandbox, (_d, s) => { sbx = s; });

test('an argv array runs without a shell: arguments arrive as they are', async () => {
  const r = await sbx.commands.run(['printf', '[%s]\\n', 'a b', '$HOME', "'q'", ';', 'echo x'], { user: 'root' });
  assert.equal(r.stdout, "[a b]\n[$HOME]\n['q']\n[;]\n[echo x]\n");
  // PATH lookup, cwd and envs as for a string
  const e = await sbx.commands.run(['sh', '-c', 'pwd; echo $V'], { cwd: '/tmp', envs: { V: 'v' } });
  assert.equal(e.stdout, '/tmp\nv\n');
  // the string form is still /bin/sh -c
  assert.equal((await sbx.commands.run('echo $((1+2))')).stdout, '3\n');
  await assert.rejects(sbx.commands.run(['false']), (x) => x instanceof CommandExitError && x.exitCode === 1);
});

test('a bad argv is refused before anything starts', async () => {
  await assert.rejects(sbx.commands.run([]), InvalidArgumentError);
  await assert.rejects(sbx.commands.run(['']), InvalidArgumentError);
  await assert.rejects(sbx.commands.run(['echo', 3]), InvalidArgumentError);
  await assert.rejects(sbx.commands.run(['echo', 'a\0b']), InvalidArgumentError);
  // a program that is not there is the daemon's start error, not an exit
  await assert.rejects(sbx.commands.run(['no-such-program-here']), (x) => x instanceof SandboxError && !(x instanceof CommandExitError));
});

test('aborting a running command kills its tree and rejects with AbortError', async () => {
  const ac = new AbortController();
  const started = Date.now();
  const p = sbx.commands.run('echo before; sleep 30 & sleep 30; echo after', { signal: ac.signal, onStdout: () => ac.abort(new Error('enough')) });
  await assert.rejects(p, (e) => {
    assert.ok(e instanceof AbortError, String(e));
    assert.ok(e instanceof SandboxError);
    assert.equal(e.result.stdout, 'before\n');
    assert.equal(e.cause.message, 'enough');
    return true;
  });
  assert.ok(Date.now() - started < 10_000);
  const left = await sbx.commands.list();
  assert.deepEqual(left.filter((x) => x.args.join(' ').includes('sleep 30')), []);
  const ps = await sbx.commands.run('ps -o args | grep -c "^sleep 30" || true', { user: 'root' });
  assert.equal(ps.stdout.trim(), '0', 'the background sleep of the tree is gone too');
});

test('an AbortSignal already aborted starts nothing; one aborted later stops a background handle', async () => {
  const ac = new AbortController();
  ac.abort();
  await assert.rejects(sbx.commands.run('touch /tmp/should-not-exist', { signal: ac.signal }), AbortError);
  assert.equal(await sbx.files.exists('/tmp/should-not-exist'), false);

  const bg = new AbortController();
  const h = await sbx.commands.run('sleep 30', { background: true, signal: bg.signal });
  bg.abort();
  await assert.rejects(h.wait(), AbortError);
  // aborting after the end changes nothing
  const done = new AbortController();
  const r = await sbx.commands.run('echo ok', { signal: done.signal });
  done.abort();
  assert.equal(r.stdout, 'ok\n');
  await assert.rejects(sbx.commands.run('true', { signal: 'nope' }), InvalidArgumentError);
});

test('maxOutputBytes keeps the newest bytes of each stream and says what it dropped', async () => {
  const chunks = [];
  const r = await sbx.commands.run('seq 1 20000; echo tail >&2', { maxOutputBytes: 100, onStdout: (d) => chunks.push(d) });
  const all = chunks.join('');
  assert.ok(all.startsWith('1\n2\n'), 'callbacks still get everything');
  assert.equal(Buffer.byteLength(r.stdout), 100);
  assert.ok(all.endsWith(r.stdout) && r.stdout.endsWith('19999\n20000\n'));
  assert.equal(r.truncated, true);
  assert.equal(r.stdoutDroppedBytes, Buffer.byteLength(all) - 100);
  assert.equal(r.stderr, 'tail\n');
  assert.equal(r.stderrDroppedBytes, 0);
  // under the cap nothing is dropped; without it the fields are absent
  const small = await sbx.commands.run('echo hi', { maxOutputBytes: 100 });
  assert.deepEqual([small.stdout, small.truncated, small.stdoutDroppedBytes], ['hi\n', false, 0]);
  assert.equal('truncated' in (await sbx.commands.run('echo hi')), false);
  // a cut never splits a character: 'é' is 2 bytes
  const u = await sbx.commands.run("printf 'aéééé'", { maxOutputBytes: 4 });
  assert.equal(u.stdout, 'éé');
  const none = await sbx.commands.run('echo gone', { maxOutputBytes: 0 });
  assert.deepEqual([none.stdout, none.truncated], ['', true]);
  // the handle's output is capped too, and a failing run's error carries it
  await assert.rejects(sbx.commands.run('seq 1 1000; exit 4', { maxOutputBytes: 9 }), (e) =>
    e instanceof CommandExitError && e.stdout === '999\n1000\n' && e.result.truncated === true);
  for (const bad of [-1, 1.5, 'x', NaN]) await assert.rejects(sbx.commands.run('true', { maxOutputBytes: bad }), InvalidArgumentError);
});

test('files.write with mode gives the file exactly that mode, new or replaced', async () => {
  await sbx.files.write('/tmp/m/secret', 'one', { mode: 0o600 });
  let info = await sbx.files.getInfo('/tmp/m/secret');
  assert.equal(info.mode, 0o600);
  assert.equal(await sbx.files.read('/tmp/m/secret'), 'one');
  await sbx.files.write('/tmp/m/secret', 'two, longer', { mode: 0o755 });
  info = await sbx.files.getInfo('/tmp/m/secret');
  assert.equal(info.mode, 0o755);
  assert.equal(await sbx.files.read('/tmp/m/secret'), 'two, longer');
  // no temp file is left beside it
  assert.deepEqual((await sbx.files.list('/tmp/m')).map((e) => e.name), ['secret']);
  const x = await sbx.commands.run(['/tmp/m/secret'], { user: 'root' }).catch((e) => e);
  assert.ok(!(x instanceof SandboxError && x.errnoCode === 'EACCES'), 'the executable bit is set');
  for (const bad of [-1, 0o10000, 1.5, '644']) {
    await assert.rejects(sbx.files.write('/tmp/m/bad', 'x', { mode: bad }), InvalidArgumentError);
  }
  assert.equal(await sbx.files.exists('/tmp/m/bad'), false);
  // a write the box refuses leaves nothing behind either
  await assert.rejects(sbx.files.write('/etc/refused', 'x', { mode: 0o644 }), SandboxError);
  assert.equal((await sbx.files.list('/etc', { user: 'root' })).some((e) => e.name.includes('refused')), false);
});

test('files.append adds to the end, making the file when missing', async () => {
  await sbx.files.append('/tmp/a/log', 'one\n');
  await sbx.files.append('/tmp/a/log', new TextEncoder().encode('two\n'));
  assert.equal(await sbx.files.read('/tmp/a/log'), 'one\ntwo\n');
  const big = 'y'.repeat((1 << 20) + 5);
  await sbx.files.append('/tmp/a/log', big);
  assert.equal((await sbx.files.getInfo('/tmp/a/log')).size, 8 + big.length);
  await assert.rejects(sbx.files.append('/etc/passwd', 'evil::0:0::/:/bin/sh\n'), SandboxError);
  assert.ok(!(await sbx.files.read('/etc/passwd', { user: 'root' })).includes('evil'));
});

test('files.copy copies a file with its mode, and a directory tree', async () => {
  await sbx.files.write('/tmp/c/src/run.sh', '#!/bin/sh\necho hi\n', { mode: 0o750 });
  await sbx.files.write('/tmp/c/src/sub/data.bin', new Uint8Array([0, 1, 2, 255]));
  const one = await sbx.files.copy('/tmp/c/src/run.sh', '/tmp/c/run-copy.sh');
  assert.equal(one.mode, 0o750);
  assert.equal(await sbx.files.read('/tmp/c/run-copy.sh'), '#!/bin/sh\necho hi\n');
  const tree = await sbx.files.copy('/tmp/c/src', '/tmp/c/dst');
  assert.equal(tree.type, 'dir');
  assert.deepEqual([...(await sbx.files.read('/tmp/c/dst/sub/data.bin', { format: 'bytes' }))], [0, 1, 2, 255]);
  assert.equal((await sbx.files.getInfo('/tmp/c/dst/run.sh')).mode, 0o750);
  // the source is untouched
  assert.equal(await sbx.files.read('/tmp/c/src/run.sh'), '#!/bin/sh\necho hi\n');
  // a large file streams across
  await sbx.commands.run('head -c 3000000 /dev/urandom > /tmp/c/big');
  await sbx.files.copy('/tmp/c/big', '/tmp/c/big2');
  const sums = await sbx.commands.run('md5sum /tmp/c/big /tmp/c/big2');
  const [a, b] = sums.stdout.trim().split('\n').map((l) => l.split(/\s+/)[0]);
  assert.equal(a, b);
});

test('files.copy refuses what it cannot do', async () => {
  await sbx.files.write('/tmp/r/f', 'keep');
  await sbx.files.write('/tmp/r/g', 'other');
  await assert.rejects(sbx.files.copy('/tmp/r/nothing', '/tmp/r/x'), NotFoundError);
  await assert.rejects(sbx.files.copy('/tmp/r/g', '/tmp/r/f', { overwrite: false }), InvalidArgumentError);
  assert.equal(await sbx.files.read('/tmp/r/f'), 'keep');
  await assert.rejects(sbx.files.copy('/tmp/r', '/tmp/r/inner'), /into itself/);
  assert.equal(await sbx.files.exists('/tmp/r/inner'), false);
  await sbx.commands.run('ln -s /etc/passwd /tmp/r/link');
  await assert.rejects(sbx.files.copy('/tmp/r/link', '/tmp/r/l2'), /symlink/);
  await assert.rejects(sbx.files.copy('/tmp/r/f', '/etc/f'), SandboxError);
  await assert.rejects(sbx.files.copy('', '/tmp/x'), InvalidArgumentError);
});
