// sbx.files against a real daemon: round trips (a 3 MiB binary file in
// chunks), several files at once, list, exists, getInfo, makeDir, rename,
// remove, typed errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { withSandbox } from './daemon.mjs';
import { Sandbox, NotFoundError, SandboxError, FileType, NotEnoughSpaceError } from '../dist/index.js';

let sbx;
withSandbox(Sandbox, (_daemon, s) => { sbx = s; });

test('text round trip, parents created; the box sees the file', async () => {
  const info = await sbx.files.write('/home/user/a/b/c.txt', 'héllo\nwörld\n');
  assert.deepEqual(info, { name: 'c.txt', type: 'file', path: '/home/user/a/b/c.txt' });
  assert.equal(await sbx.files.read('/home/user/a/b/c.txt'), 'héllo\nwörld\n');
  assert.equal((await sbx.commands.run('cat /home/user/a/b/c.txt')).stdout, 'héllo\nwörld\n');
});

test('a 3 MiB binary file round trips byte for byte', async () => {
  const data = randomBytes(3 * 1024 * 1024 + 17);
  await sbx.files.write('/home/user/big.bin', data);
  const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' });
  assert.ok(back instanceof Uint8Array);
  assert.equal(back.length, data.length);
  assert.ok(Buffer.from(back).equals(data));
  const sum = await sbx.commands.run('wc -c < /home/user/big.bin');
  assert.equal(sum.stdout.trim(), String(data.length));
  // overwriting with less truncates
  await sbx.files.write('/home/user/big.bin', new Uint8Array([1, 2, 3]));
  assert.deepEqual([...(await sbx.files.read('/home/user/big.bin', { format: 'bytes' }))], [1, 2, 3]);
  const blob = await sbx.files.read('/home/user/big.bin', { format: 'blob' });
  assert.equal(blob.size, 3);
});

test('an empty file', async () => {
  await sbx.files.write('/home/user/empty', '');
  assert.equal(await sbx.files.read('/home/user/empty'), '');
  assert.equal((await sbx.files.getInfo('/home/user/empty')).size, 0);
});

test('write(entries) writes several files', async () => {
  const out = await sbx.files.write([
    { path: '/home/user/multi/one.txt', data: '1' },
    { path: '/home/user/multi/two.bin', data: new Uint8Array([0, 255]) },
    { path: '/home/user/multi/three.txt', data: new TextEncoder().encode('3').buffer },
  ]);
  assert.deepEqual(out.map((w) => w.name), ['one.txt', 'two.bin', 'three.txt']);
  assert.equal(await sbx.files.read('/home/user/multi/one.txt'), '1');
  assert.deepEqual([...(await sbx.files.read('/home/user/multi/two.bin', { format: 'bytes' }))], [0, 255]);
  assert.equal(await sbx.files.read('/home/user/multi/three.txt'), '3');
});

test('list: entries sorted by name with type, size, mode', async () => {
  await sbx.files.makeDir('/home/user/ls/sub');
  await sbx.files.write('/home/user/ls/f.txt', 'abc');
  await sbx.commands.run('ln -s f.txt /home/user/ls/link');
  const entries = await sbx.files.list('/home/user/ls');
  assert.deepEqual(entries.map((e) => [e.name, e.type]), [
    ['f.txt', FileType.FILE],
    ['link', FileType.SYMLINK],
    ['sub', FileType.DIR],
  ]);
  const f = entries[0];
  assert.equal(f.path, '/home/user/ls/f.txt');
  assert.equal(f.size, 3);
  assert.equal(f.permissions, '-rw-r--r--');
  assert.ok(f.modifiedTime instanceof Date && Math.abs(f.modifiedTime.getTime() - Date.now()) < 600_000);
  await assert.rejects(sbx.files.list('/home/user/nothing-here'), NotFoundError);
});

test('exists never throws', async () => {
  assert.equal(await sbx.files.exists('/etc'), true);
  assert.equal(await sbx.files.exists('/home/user/a/b/c.txt'), true);
  assert.equal(await sbx.files.exists('/no/such/thing'), false);
  assert.equal(await sbx.files.exists(''), false, 'even a path the daemon refuses');
});

test('names and link targets that are not UTF-8: U+FFFD in the text, exact bytes in the raw fields', async () => {
  await sbx.commands.run(`mkdir -p /home/user/raw && printf x > "/home/user/raw/a$(printf '\\377')" && ` +
    `ln -s "t$(printf '\\376')" /home/user/raw/link`);
  const entries = await sbx.files.list('/home/user/raw');
  const f = entries.find((e) => e.name !== 'link');
  assert.equal(f.name, 'a\uFFFD');
  assert.deepEqual([...f.nameRaw], [0x61, 0xff]);
  assert.deepEqual(Buffer.from(f.pathRaw).toString('latin1'), '/home/user/raw/a\xff');
  const l = await sbx.files.getInfo('/home/user/raw/link');
  assert.equal(l.symlinkTarget, 't\uFFFD');
  assert.deepEqual([...l.symlinkTargetRaw], [0x74, 0xfe]);
  assert.equal(l.nameRaw, undefined);
});

test('getInfo describes files, dirs and symlinks', async () => {
  const d = await sbx.files.getInfo('/home/user/ls');
  assert.equal(d.type, 'dir');
  assert.equal(d.name, 'ls');
  assert.equal(d.permissions, 'drwxr-xr-x');
  const l = await sbx.files.getInfo('/home/user/ls/link');
  assert.equal(l.type, 'symlink');
  assert.equal(l.symlinkTarget, 'f.txt');
  await assert.rejects(sbx.files.getInfo('/nope'), NotFoundError);
});

test('makeDir: true when made (parents too), false when it existed', async () => {
  assert.equal(await sbx.files.makeDir('/home/user/md/x/y'), true);
  assert.equal(await sbx.files.makeDir('/home/user/md/x/y'), false);
  assert.equal(await sbx.files.makeDir('/home/user/md'), false);
  assert.equal((await sbx.files.getInfo('/home/user/md/x/y')).type, 'dir');
});

test('rename moves and returns the new entry', async () => {
  await sbx.files.write('/home/user/mv/from.txt', 'moving');
  const e = await sbx.files.rename('/home/user/mv/from.txt', '/home/user/mv/to.txt');
  assert.equal(e.name, 'to.txt');
  assert.equal(e.type, 'file');
  assert.equal(await sbx.files.exists('/home/user/mv/from.txt'), false);
  assert.equal(await sbx.files.read('/home/user/mv/to.txt'), 'moving');
  await assert.rejects(sbx.files.rename('/home/user/mv/none', '/home/user/mv/x'), NotFoundError);
});

test('remove: a file, and a directory with everything in it', async () => {
  await sbx.files.write('/home/user/rm/deep/er/file', 'x');
  await sbx.files.write('/home/user/rm/top', 'x');
  await sbx.files.remove('/home/user/rm/top');
  assert.equal(await sbx.files.exists('/home/user/rm/top'), false);
  await sbx.files.remove('/home/user/rm');
  assert.equal(await sbx.files.exists('/home/user/rm'), false);
  // nothing there: nothing to do, as E2B's (its envd removes with RemoveAll)
  await sbx.files.remove('/home/user/rm');
  await sbx.files.remove('/home/user/no/such/dir/file');
  await sbx.files.write('/home/user/rmfile', 'x');
  await assert.rejects(sbx.files.remove('/home/user/rmfile/under'), (e) => e.errnoCode === 'ENOTDIR');
});

test('file errors are typed and carry the errno', async () => {
  await assert.rejects(sbx.files.read('/home/user/missing'), (e) => {
    assert.ok(e instanceof NotFoundError);
    assert.equal(e.code, -32002);
    assert.equal(e.errnoCode, 'ENOENT');
    return true;
  });
  await assert.rejects(sbx.files.read('/home/user'), (e) => e instanceof SandboxError && e.errnoCode === 'EISDIR');
  await assert.rejects(sbx.files.write('/home/user/a/b/c.txt/under-a-file', 'x'), SandboxError);
});

test('read as a stream: chunks as they are read, byte-exact', async () => {
  const data = randomBytes(5 * 1024 * 1024 + 3);
  await sbx.files.write('/home/user/s.bin', data);
  const stream = await sbx.files.read('/home/user/s.bin', { format: 'stream' });
  const parts = [];
  for await (const c of stream) parts.push(Buffer.from(c));
  assert.ok(parts.length >= 6, `read in chunks (${parts.length})`);
  assert.ok(parts.every((p) => p.length <= 1024 * 1024));
  assert.ok(Buffer.concat(parts).equals(data));
  await assert.rejects(sbx.files.read('/home/user/nothing', { format: 'stream' }), NotFoundError);
  const empty = await sbx.files.read('/home/user/empty', { format: 'stream' });
  let n = 0;
  for await (const c of empty) n += c.length;
  assert.equal(n, 0);
});

test('write from a ReadableStream and a Node stream, with odd chunk sizes', async () => {
  const data = randomBytes(3 * 1024 * 1024 + 999);
  let off = 0;
  let pulls = 0;
  const rs = new ReadableStream({
    pull(ctrl) {
      pulls++;
      if (off >= data.length) return ctrl.close();
      const n = 70_000 + (off % 13);
      ctrl.enqueue(new Uint8Array(data.subarray(off, off + n)));
      off += n;
    },
  }, { highWaterMark: 1 });
  await sbx.files.write('/home/user/from-stream.bin', rs);
  assert.ok(pulls > 40, 'pulled chunk by chunk');
  assert.ok(Buffer.from(await sbx.files.read('/home/user/from-stream.bin', { format: 'bytes' })).equals(data));
  const { Readable } = await import('node:stream');
  await sbx.files.write('/home/user/from-node.txt', Readable.from(['a', 'b', Buffer.from('c')]));
  assert.equal(await sbx.files.read('/home/user/from-node.txt'), 'abc');
  await sbx.files.write('/home/user/from-empty', new ReadableStream({ start(c) { c.close(); } }));
  assert.equal((await sbx.files.getInfo('/home/user/from-empty')).size, 0);
});

test('a 100 MiB binary file, written and read back byte-exact (streaming both ways)', async () => {
  const size = 100 * 1024 * 1024;
  const { createHash } = await import('node:crypto');
  // generated chunk by chunk: no 100 MiB buffer on this side either
  const block = randomBytes(1024 * 1024 + 7);
  const want = createHash('sha256');
  let sent = 0;
  const src = new ReadableStream({
    pull(ctrl) {
      if (sent >= size) return ctrl.close();
      const n = Math.min(block.length, size - sent);
      const c = new Uint8Array(block.subarray(0, n));
      c[0] = sent & 255; // no two chunks alike
      want.update(c);
      ctrl.enqueue(c);
      sent += n;
    },
  }, { highWaterMark: 1 });
  await sbx.files.write('/tmp/huge.bin', src);
  assert.equal((await sbx.files.getInfo('/tmp/huge.bin')).size, size);
  const got = createHash('sha256');
  let n = 0;
  for await (const c of await sbx.files.read('/tmp/huge.bin', { format: 'stream' })) {
    got.update(c);
    n += c.length;
  }
  assert.equal(n, size);
  assert.equal(got.digest('hex'), want.digest('hex'));
  await sbx.files.remove('/tmp/huge.bin');
});

test('a full disk is NotEnoughSpaceError (the box\'s 64 MiB /dev/shm)', async () => {
  await assert.rejects(sbx.files.write('/dev/shm/fill', new Uint8Array(70 * 1024 * 1024)), (e) => {
    assert.ok(e instanceof NotEnoughSpaceError, String(e));
    assert.equal(e.errnoCode, 'ENOSPC');
    return true;
  });
  await sbx.files.remove('/dev/shm/fill');
});
