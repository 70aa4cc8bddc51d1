// TupperFilesystem against a real box: Mastra's WorkspaceFilesystem
// contract, with Mastra's error classes for what is missing, in the way or
// refused by the box.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startDaemon } from '../../../js/test/daemon.mjs';
import { adapter, workspace } from './framework.mjs';

let daemon;
let sb;
let fsys;

before(async () => {
  daemon = await startDaemon();
  sb = new adapter.TupperSandbox({ socket: daemon.socket, policy: false });
  fsys = new adapter.TupperFilesystem({ sandbox: sb });
  await fsys.init();
});
after(async () => {
  try {
    await sb?._destroy();
  } finally {
    if (daemon) assert.equal((await daemon.stop()).code, 0);
  }
});

test('read, write, append; relative paths start at the home', async () => {
  assert.ok(fsys instanceof workspace.MastraFilesystem);
  assert.equal(fsys.basePath, '/home/user');
  await fsys.writeFile('w/a.txt', 'one\n');
  await fsys.appendFile('w/a.txt', Buffer.from('two\n'));
  assert.equal(await fsys.readFile('/home/user/w/a.txt', { encoding: 'utf8' }), 'one\ntwo\n');
  const raw = await fsys.readFile('w/a.txt');
  assert.ok(Buffer.isBuffer(raw));
  assert.equal(raw.toString(), 'one\ntwo\n');
  assert.equal(fsys.resolveAbsolutePath('w/../w/./a.txt'), '/home/user/w/a.txt');
  const st = await fsys.stat('w/a.txt');
  assert.deepEqual([st.type, st.size, st.path], ['file', 8, '/home/user/w/a.txt']);
  assert.equal((await fsys.stat('w')).type, 'directory');
  assert.equal(await fsys.exists('w/a.txt'), true);
  assert.equal(await fsys.exists('w/none'), false);
});

test("Mastra's errors for what is missing, in the way, or refused", async () => {
  await assert.rejects(fsys.readFile('nothing.txt'), workspace.FileNotFoundError);
  await assert.rejects(fsys.readFile('w'), workspace.IsDirectoryError);
  await assert.rejects(fsys.writeFile('w/a.txt', 'x', { overwrite: false }), workspace.FileExistsError);
  assert.equal(await fsys.readFile('w/a.txt', { encoding: 'utf8' }), 'one\ntwo\n');
  await assert.rejects(fsys.writeFile('no/such/dir/f', 'x', { recursive: false }), workspace.DirectoryNotFoundError);
  await assert.rejects(fsys.writeFile('/etc/passwd', 'evil'), workspace.PermissionError);
  await sb.instance.files.write('/home/user/root-only', 'secret', { user: 'root', mode: 0o600 });
  await sb.instance.commands.run(['chown', 'root:root', '/home/user/root-only'], { user: 'root' });
  await assert.rejects(fsys.readFile('root-only'), workspace.PermissionError);
  await sb.instance.files.remove('/home/user/root-only', { user: 'root' });
  await assert.rejects(fsys.deleteFile('w'), workspace.IsDirectoryError);
  await assert.rejects(fsys.deleteFile('gone'), workspace.FileNotFoundError);
  await fsys.deleteFile('gone', { force: true });
  await assert.rejects(fsys.rmdir('w'), workspace.DirectoryNotEmptyError);
  await assert.rejects(fsys.rmdir('w/a.txt'), workspace.NotDirectoryError);
  await assert.rejects(fsys.readdir('w/a.txt'), workspace.NotDirectoryError);
  await assert.rejects(fsys.readdir('nope'), workspace.DirectoryNotFoundError);
  await assert.rejects(fsys.mkdir('x/y'), workspace.DirectoryNotFoundError);
  await assert.rejects(fsys.mkdir('w'), workspace.FileExistsError);
  const old = new Date(0);
  await assert.rejects(fsys.writeFile('w/a.txt', 'x', { expectedMtime: old }), workspace.StaleFileError);
  const ro = new adapter.TupperFilesystem({ sandbox: sb, readOnly: true });
  await assert.rejects(ro.writeFile('w/ro', 'x'), workspace.PermissionError);
  assert.equal(await ro.exists('w/ro'), false);
});

test('mkdir, readdir (recursive, by extension), copy, move, delete, rmdir', async () => {
  await fsys.mkdir('t/src/deep', { recursive: true });
  await fsys.writeFile('t/src/main.ts', 'export {}\n');
  await fsys.writeFile('t/src/deep/util.ts', 'export const u = 1\n');
  await fsys.writeFile('t/README.md', '# t\n');
  await sb.executeCommand('ln -s src /home/user/t/link');
  const top = await fsys.readdir('t');
  assert.deepEqual(top.map((e) => `${e.name}:${e.type}${e.isSymlink ? ':link' : ''}`), ['README.md:file', 'link:directory:link', 'src:directory']);
  const all = await fsys.readdir('t', { recursive: true, extension: '.ts' });
  assert.deepEqual(all.map((e) => e.name).sort(), ['link', 'src', 'src/deep', 'src/deep/util.ts', 'src/main.ts']);
  await fsys.copyFile('t/src/main.ts', 't/copy.ts');
  assert.equal(await fsys.readFile('t/copy.ts', { encoding: 'utf8' }), 'export {}\n');
  await assert.rejects(fsys.copyFile('t/src', 't/src2'), workspace.IsDirectoryError);
  await fsys.copyFile('t/src', 't/src2', { recursive: true });
  assert.equal(await fsys.readFile('t/src2/deep/util.ts', { encoding: 'utf8' }), 'export const u = 1\n');
  await assert.rejects(fsys.copyFile('t/README.md', 't/copy.ts', { overwrite: false }), workspace.FileExistsError);
  await fsys.moveFile('t/copy.ts', 't/moved/into/new.ts');
  assert.equal(await fsys.exists('t/copy.ts'), false);
  assert.equal(await fsys.readFile('t/moved/into/new.ts', { encoding: 'utf8' }), 'export {}\n');
  await fsys.deleteFile('t/README.md');
  await fsys.rmdir('t/src2', { recursive: true });
  assert.deepEqual((await fsys.readdir('t')).map((e) => e.name), ['link', 'moved', 'src']);
});

test('over an @tupper/sdk Sandbox too', async () => {
  const direct = new adapter.TupperFilesystem({ sandbox: sb.instance, basePath: '/tmp' });
  await direct.writeFile('d.txt', 'direct');
  assert.equal(await sb.instance.files.read('/tmp/d.txt'), 'direct');
  assert.equal(direct.getInfo().metadata.basePath, '/tmp');
});
