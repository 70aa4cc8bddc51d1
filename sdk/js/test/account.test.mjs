// E2B's default account against a real daemon: commands and files act as
// `user` in /home/user on an image with that account (the default busybox
// image has it, as E2B's base image does), as root in / on one without;
// `user: 'root'` where root is meant; what the box's permissions refuse is
// a PermissionError; accounts the box does not have, or describes in a
// hostile way, are refused with clear errors.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startDaemon } from './daemon.mjs';
import {
  Sandbox,
  SandboxError,
  NotFoundError,
  InvalidArgumentError,
  PermissionError,
  FilesystemEventType,
} from '../dist/index.js';

let daemon;
let opts;
let sbx;
before(async () => {
  daemon = await startDaemon();
  const backend = process.env.TUPPER_TEST_BACKEND;
  opts = { socket: daemon.socket, policy: false, ...(backend ? { backend } : {}) };
  sbx = await Sandbox.create(opts);
});
after(async () => {
  try {
    await sbx?.kill();
  } finally {
    if (daemon) assert.equal((await daemon.stop()).code, 0);
  }
});

test('commands run as user, in /home/user, unless told otherwise', async () => {
  assert.equal(sbx.defaultUser, 'user');
  assert.equal(sbx.home, '/home/user');
  const info = await sbx.getInfo();
  assert.equal(info.defaultUser, 'user');
  assert.equal(info.home, '/home/user');
  const r = await sbx.commands.run('whoami; pwd; id -u; id -g; echo $HOME');
  assert.equal(r.stdout, 'user\n/home/user\n1000\n1000\n/home/user\n');
  // a relative cwd is taken from the home
  await sbx.commands.run('mkdir -p proj/src');
  assert.equal((await sbx.commands.run('pwd', { cwd: 'proj/src' })).stdout, '/home/user/proj/src\n');
  assert.equal((await sbx.commands.run('whoami; pwd', { user: 'root' })).stdout, 'root\n/root\n');
  assert.equal((await sbx.commands.run('pwd', { user: 'root', cwd: '/tmp' })).stdout, '/tmp\n');
  // the unprivileged account cannot change the system
  await assert.rejects(sbx.commands.run('touch /etc/x'), (e) => e.exitCode === 1 && /Permission denied/.test(e.stderr));
  // a terminal too
  let seen = '';
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { seen += Buffer.from(d).toString(); },
    cmd: ['/bin/sh', '-c', 'whoami; pwd'] });
  await h.wait();
  assert.match(seen, /user\r\n\/home\/user\r\n/);
  const bg = await sbx.commands.run('sleep 30', { background: true });
  assert.equal((await sbx.commands.list()).find((p) => p.pid === bg.pid).user, 'user');
  await bg.kill();
});

test('files: relative paths land in /home/user, owned by uid 1000', async () => {
  const w = await sbx.files.write('notes/today.txt', 'hello');
  // E2B's WriteInfo.path is absolute
  assert.equal(w.path, '/home/user/notes/today.txt');
  const st = await sbx.files.getInfo('/home/user/notes/today.txt');
  assert.deepEqual([st.uid, st.gid, st.path], [1000, 1000, '/home/user/notes/today.txt']);
  assert.equal((await sbx.files.getInfo('/home/user/notes')).uid, 1000);
  assert.equal(await sbx.files.read('notes/today.txt'), 'hello');
  assert.equal(await sbx.files.read('./notes/../notes/today.txt'), 'hello');
  assert.equal(await sbx.files.exists('notes/today.txt'), true);
  assert.equal((await sbx.commands.run('cat notes/today.txt; stat -c %U /home/user/notes/today.txt')).stdout, 'hellouser\n');
  // streamed reads and writes open the file as the account too
  const big = Buffer.alloc(3 * 1024 * 1024 + 5, 7);
  await sbx.files.write('big.bin', new Blob([big]));
  assert.equal((await sbx.files.getInfo('big.bin')).uid, 1000);
  let n = 0;
  for await (const c of await sbx.files.read('big.bin', { format: 'stream' })) n += c.length;
  assert.equal(n, big.length);
  await assert.rejects(sbx.files.read('/root/.profile', { format: 'stream' }), PermissionError);
});

test('writing /etc as the default account is a PermissionError; user: root may', async () => {
  await assert.rejects(sbx.files.write('/etc/x', 'no'), (e) => {
    assert.ok(e instanceof PermissionError, String(e));
    assert.ok(e instanceof SandboxError);
    assert.equal(e.errnoCode, 'EACCES');
    assert.match(e.message, /\/etc\/x.*Permission denied/);
    return true;
  });
  assert.equal(await sbx.files.exists('/etc/x'), false);
  await sbx.files.write('/etc/x', 'yes', { user: 'root' });
  const st = await sbx.files.getInfo('/etc/x');
  assert.deepEqual([st.uid, st.gid], [0, 0]);
  await assert.rejects(sbx.files.remove('/etc/x'), PermissionError);
  await assert.rejects(sbx.files.rename('/etc/x', 'x'), PermissionError);
  await assert.rejects(sbx.files.makeDir('/etc/newdir'), PermissionError);
  await assert.rejects(sbx.files.list('/root'), PermissionError);
  await assert.rejects(sbx.files.read('/root/anything'), PermissionError);
  assert.equal(await sbx.files.read('/etc/x', { user: 'root' }), 'yes');
  await sbx.files.remove('/etc/x', { user: 'root' });
  // explicit root: relative paths from root's home
  await sbx.files.write('r.txt', 'r', { user: 'root' });
  assert.equal((await sbx.files.getInfo('/root/r.txt', { user: 'root' })).uid, 0);
});

test('makeDir, rename, remove, list and watchDir act as the account', async () => {
  assert.equal(await sbx.files.makeDir('d/e'), true);
  assert.equal((await sbx.files.getInfo('/home/user/d/e')).uid, 1000);
  await sbx.files.write('d/e/f.txt', 'f');
  const moved = await sbx.files.rename('d/e/f.txt', 'd/g.txt');
  assert.equal(moved.path, '/home/user/d/g.txt');
  assert.deepEqual((await sbx.files.list('d')).map((e) => [e.name, e.path]), [['e', '/home/user/d/e'], ['g.txt', '/home/user/d/g.txt']]);
  const events = [];
  let wake = () => {};
  const w = await sbx.files.watchDir('d', (e) => { events.push(`${e.type} ${e.name}`); wake(); }, { recursive: true });
  await sbx.files.write('d/e/new.txt', 'x');
  const deadline = Date.now() + 10_000;
  while (!events.includes(`${FilesystemEventType.CREATE} e/new.txt`)) {
    if (Date.now() > deadline) throw new Error(`no create event: ${JSON.stringify(events)}`);
    await new Promise((r) => { wake = r; setTimeout(r, 200); });
  }
  await w.stop();
  await assert.rejects(sbx.files.watchDir('/root', () => {}), PermissionError);
  await sbx.files.remove('d');
  assert.equal(await sbx.files.exists('/home/user/d'), false);
  // the account's own sticky /tmp rules: it cannot remove root's file there
  await sbx.files.write('/tmp/roots', 'x', { user: 'root' });
  await assert.rejects(sbx.files.remove('/tmp/roots'), PermissionError);
  await sbx.files.remove('/tmp/roots', { user: 'root' });
});

test('a sandbox given a working directory starts commands there', async () => {
  const s = await Sandbox.create({ ...opts, cwd: '/tmp' });
  try {
    assert.equal((await s.commands.run('whoami; pwd')).stdout, 'user\n/tmp\n');
    // files still take relative paths from the home
    await s.files.write('h.txt', 'h');
    assert.equal(await s.files.exists('/home/user/h.txt'), true);
    assert.equal((await s.commands.run('pwd', { user: 'root' })).stdout, '/root\n');
  } finally {
    await s.kill();
  }
});

test('an image without a `user` account: root, in /', async () => {
  // a recipe whose setup removes the account: its layer is the image
  // (on the linux backend whatever TUPPER_TEST_BACKEND says: the account logic is the daemon's,
  // and a microVM would first build a root image of the recipe's layer)
  const s = await Sandbox.create({
    ...opts,
    backend: 'linux',
    recipe: { name: 'nouser.lua', source: 'return recipe "nouser" { setup = function(box) box:run("sed -i /^user:/d /etc/passwd") end }' },
  });
  try {
    assert.equal(s.defaultUser, 'root');
    assert.equal(s.home, '/');
    assert.equal((await s.commands.run('whoami; pwd')).stdout, 'root\n/\n');
    await s.files.write('rel.txt', 'x');
    const st = await s.files.getInfo('/rel.txt');
    assert.equal(st.uid, 0);
    assert.equal((await s.commands.run('pwd', { cwd: 'tmp' })).stdout, '/tmp\n');
    await assert.rejects(s.files.write('x', 'x', { user: 'user' }), NotFoundError);
    await assert.rejects(s.commands.run('true', { user: 'user' }), NotFoundError);
  } finally {
    await s.kill();
  }
});

test('accounts the box does not have, or describes in a hostile way, are refused', async () => {
  const s = await Sandbox.create(opts);
  try {
    await assert.rejects(s.files.write('x', 'x', { user: 'ghost' }), (e) => e instanceof NotFoundError && /ghost.*not in the box's \/etc\/passwd/.test(e.message));
    await assert.rejects(s.commands.run('true', { user: 'ghost' }), NotFoundError);
    await assert.rejects(s.files.write('x', 'x', { user: 'bad name' }), InvalidArgumentError);
    await assert.rejects(s.files.read('x', { user: 'x'.repeat(33) }), InvalidArgumentError);
    const passwd = (line) => s.files.write('/etc/passwd', `root:x:0:0:root:/root:/bin/sh\n${line}\n`, { user: 'root' });
    const refused = async (want) => {
      // the default account is looked up at each call: the changed file counts
      await assert.rejects(s.files.write('x', 'x'), (e) => e instanceof SandboxError && want.test(e.message));
      await assert.rejects(s.commands.run('true'), (e) => e instanceof SandboxError && want.test(e.message));
    };
    await passwd('user:x:0:0:user:/home/user:/bin/sh');
    await refused(/user 'user' has uid 0 in the box's \/etc\/passwd/);
    await passwd('user:x:1000:1000:user:../../:/bin/sh');
    await refused(/home in the box's \/etc\/passwd is not a clean absolute path/);
    await passwd('user:x:99999:1000:user:/home/user:/bin/sh');
    await refused(/not a number in 0\.\.65535/);
    await s.files.write('/etc/passwd', '#'.repeat(1100 * 1024) + '\nuser:x:1000:1000::/home/user:/bin/sh\n', { user: 'root' });
    await refused(/\/etc\/passwd is over 1048576 bytes/);
    // garbage around a good line is skipped
    await passwd('garbage\n::::\nuser:x:1000:1000:user:/home/user:/bin/sh');
    assert.equal((await s.commands.run('whoami')).stdout, 'user\n');
  } finally {
    await s.kill();
  }
});
