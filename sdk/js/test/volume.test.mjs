// Volumes with E2B's names (docs/volumes.md): Volume.create/connect/list/
// getInfo/destroy against a real daemon, Sandbox.create({ volumeMounts })
// with a Volume and with a name, data kept after the box dies, the file
// methods without a sandbox (in a short-lived box) and while one mounts
// it, destroy refused while mounted, bad names and paths refused.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { startDaemon } from './daemon.mjs';
import { Sandbox, Volume, VolumeFileType, InvalidArgumentError, NotFoundError, RateLimitError } from '../dist/index.js';

let daemon;
let opts;
before(async () => {
  daemon = await startDaemon();
  opts = { socket: daemon.socket };
});
after(async () => {
  try {
    assert.deepEqual(await Sandbox.list(opts).nextItems(), []);
    assert.deepEqual(await Volume.list(opts), []);
  } finally {
    const st = await daemon.stop();
    assert.equal(st.code, 0);
  }
});

test('Volume.create, list, getInfo, connect, destroy', async () => {
  const vol = await Volume.create('sdk-data', { ...opts, size: '32M' });
  try {
    assert.equal(vol.name, 'sdk-data');
    assert.match(vol.volumeId, /^vol-[0-9a-f]{16}$/);
    assert.equal(vol.token, '');
    const list = await Volume.list(opts);
    assert.deepEqual(list.map((v) => v.name), ['sdk-data']);
    assert.equal(list[0].size, 32 * 1024 * 1024);
    const info = await Volume.getInfo(vol.volumeId, opts);
    assert.equal(info.name, 'sdk-data');
    assert.deepEqual(info.mountedBy, []);
    const again = await Volume.connect(vol.volumeId, opts);
    assert.equal(again.name, 'sdk-data');
    await assert.rejects(Volume.create('sdk-data', opts), /exists already/);
    await assert.rejects(Volume.connect('nope', opts), NotFoundError);
    for (const bad of ['..', 'a/b', 'a\0b', 'a\nb']) {
      await assert.rejects(Volume.create(bad, opts), InvalidArgumentError, JSON.stringify(bad));
    }
  } finally {
    assert.equal(await Volume.destroy(vol.volumeId, opts), true);
  }
  assert.equal(await Volume.destroy('sdk-data', opts), false);
});

test('volumeMounts: what a sandbox wrote is there for the next one and for the file methods', async () => {
  const vol = await Volume.create('sdk-mount', { ...opts, size: '32M' });
  try {
    const sbx = await Sandbox.create({ ...opts, volumeMounts: { '/mnt/data': vol } });
    try {
      // E2B's default account writes there
      const r = await sbx.commands.run('id -un; echo hello > /mnt/data/hello.txt && mkdir -p /mnt/data/sub');
      assert.equal(r.stdout, 'user\n');
      assert.deepEqual((await sbx.getInfo()).volumeMounts, [{ name: 'sdk-mount', path: '/mnt/data' }]);
      const info = await Volume.getInfo('sdk-mount', opts);
      assert.deepEqual(info.mountedBy, [{ sandboxId: sbx.sandboxId, path: '/mnt/data' }]);
      // destroy refused while mounted, the sandbox named
      await assert.rejects(Volume.destroy(vol.volumeId, opts), (e) => e instanceof RateLimitError && e.message.includes(sbx.sandboxId));
      // a second sandbox may not mount it meanwhile
      await assert.rejects(Sandbox.create({ ...opts, volumeMounts: { '/v': 'sdk-mount' } }), new RegExp(`mounted by sandbox ${sbx.sandboxId}`));
      // file methods while mounted go through that sandbox
      assert.equal(await vol.readFile('/hello.txt'), 'hello\n');
      await vol.writeFile('/from-sdk.txt', 'written while mounted');
      assert.equal(await sbx.files.read('/mnt/data/from-sdk.txt'), 'written while mounted');
    } finally {
      await sbx.kill();
    }
    // no sandbox mounts it now: the file methods run in a short-lived box
    assert.equal(await vol.readFile('hello.txt'), 'hello\n');
    assert.equal(await vol.readFile('/from-sdk.txt'), 'written while mounted');
    const stat = await vol.writeFile('/dir/deep/f.bin', new Uint8Array([0, 1, 2, 255]).buffer, { mode: 0o600, uid: 1000, gid: 1000 });
    assert.equal(stat.path, '/dir/deep/f.bin');
    assert.equal(stat.type, VolumeFileType.FILE);
    assert.equal(stat.size, 4);
    assert.equal(stat.mode & 0o777, 0o600);
    assert.equal(stat.uid, 1000);
    assert.deepEqual([...(await vol.readFile('/dir/deep/f.bin', { format: 'bytes' }))], [0, 1, 2, 255]);
    const names = (await vol.list('/')).map((e) => e.name).sort();
    assert.ok(names.includes('hello.txt') && names.includes('sub') && names.includes('dir'), names.join(','));
    assert.equal((await vol.getInfo('/sub')).type, VolumeFileType.DIRECTORY);
    assert.equal(await vol.exists('/sub'), true);
    assert.equal(await vol.exists('/missing'), false);
    await assert.rejects(vol.makeDir('/no/such/parent'), NotFoundError);
    assert.equal((await vol.makeDir('/made/with/parents', { force: true })).type, VolumeFileType.DIRECTORY);
    const upd = await vol.updateMetadata('/hello.txt', { mode: 0o640 });
    assert.equal(upd.mode & 0o777, 0o640);
    await vol.remove('/dir');
    assert.equal(await vol.exists('/dir'), false);
    await assert.rejects(vol.readFile('/../etc/passwd'), /'\.\.' component/);
    await assert.rejects(vol.remove('/'), InvalidArgumentError);
    // the next sandbox, by name, sees all of it
    const sbx2 = await Sandbox.create({ ...opts, volumeMounts: { '/srv': 'sdk-mount' } });
    try {
      assert.equal(await sbx2.files.read('/srv/hello.txt'), 'hello\n');
      assert.equal((await sbx2.commands.run('stat -c %U /srv/hello.txt')).stdout, 'user\n');
      assert.equal(await sbx2.files.exists('/srv/made/with/parents'), true);
    } finally {
      await sbx2.kill();
    }
    // no helper box is left behind
    assert.deepEqual(await Sandbox.list(opts).nextItems(), []);
  } finally {
    await Volume.destroy(vol.volumeId, opts);
  }
  assert.equal(fs.existsSync(`${daemon.dir}/state/volumes/sdk-mount`), false);
});
