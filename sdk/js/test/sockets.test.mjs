// Which socket the SDK uses when given none (docs/install.md): the choice
// on fake environments, then a real client run as an unprivileged user
// that finds no socket of its own and reaches a daemon on a socket standing
// in for the system's (TUPPER_SYSTEM_SOCKET, the hook for tests).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { BIN, signal, track } from './daemon.mjs';
import { defaultSockets } from '../dist/index.js';
import { clientSocket } from '../dist/sockets.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const dist = path.resolve(here, '../dist/index.js');

test('the default sockets: its own, then the system one, for a user that is not root', () => {
  const env = { XDG_RUNTIME_DIR: '/run/user/1000' };
  assert.deepEqual(defaultSockets(1000, env), ['/run/user/1000/tupper.sock', '/run/tupper/tupper.sock']);
  assert.deepEqual(defaultSockets(1000, {}), ['/tmp/tupper-1000/tupper.sock', '/run/tupper/tupper.sock']);
  assert.deepEqual(defaultSockets(0, env), ['/run/tupper/tupper.sock']);
  const named = { TUPPER_SOCKET: '/a/b.sock', XDG_RUNTIME_DIR: '/r' };
  assert.deepEqual(defaultSockets(1000, named), ['/a/b.sock']);
  assert.deepEqual(defaultSockets(0, named), ['/a/b.sock']);
  assert.deepEqual(defaultSockets(1000, { TUPPER_SYSTEM_SOCKET: '/s/sys.sock', XDG_RUNTIME_DIR: '/r' }),
    ['/r/tupper.sock', '/s/sys.sock']);
  // neither there: the own one is tried, and the error will name both
  const none = clientSocket(1000, { XDG_RUNTIME_DIR: '/nonexistent/run', TUPPER_SYSTEM_SOCKET: '/nonexistent/s.sock' });
  assert.equal(none.path, '/nonexistent/run/tupper.sock');
  assert.equal(none.alsoTried, ' nor at /nonexistent/s.sock (ENOENT)');
});

const root = typeof process.getuid === 'function' && process.getuid() === 0;

let dir;
let socket;
let runtime = process.execPath;
let child;
let exited;
before(async () => {
  if (!root) return;
  // a dir an unprivileged user can pass through (a test's TMPDIR may not be)
  dir = fs.mkdtempSync('/tmp/tupper-sdk-sys-');
  fs.chmodSync(dir, 0o711);
  // the SDK as the other user can read it: the checkout may sit where it
  // cannot (a fresh machine clones into /root); dist needs no node_modules
  fs.cpSync(path.dirname(dist), path.join(dir, 'dist'), { recursive: true });
  // a runtime the other user can run: Bun and Deno come from npm into the
  // checkout (sdk/js/.runtimes), which it cannot reach (a fresh machine's
  // sits in /root); the system's node then runs the client (the path choice
  // itself is tested on every runtime above)
  if (!process.execPath.startsWith('/usr/') && fs.existsSync('/usr/bin/node')) runtime = '/usr/bin/node';
  fs.chmodSync(path.join(dir, 'dist'), 0o755);
  for (const f of fs.readdirSync(path.join(dir, 'dist'), { recursive: true })) {
    const p = path.join(dir, 'dist', String(f));
    fs.chmodSync(p, fs.statSync(p).isDirectory() ? 0o755 : 0o644);
  }
  socket = path.join(dir, 'tupper.sock');
  child = spawn(BIN, ['daemon', '--socket', socket, '--state-dir', path.join(dir, 'state'), '--log', path.join(dir, 'log')],
    { stdio: ['ignore', 'ignore', 'inherit'] });
  track(child, dir);
  exited = new Promise((resolve) => child.once('exit', (code, sig) => resolve({ code, sig })));
  const deadline = Date.now() + 90_000; // as test/daemon.mjs: a loaded machine is slow to start it
  for (;;) {
    const up = await new Promise((resolve) => {
      const s = net.createConnection({ path: socket });
      s.once('connect', () => { s.destroy(); resolve(true); });
      s.once('error', () => resolve(false));
    });
    if (up) break;
    if (Date.now() > deadline) throw new Error('the daemon did not start');
    await new Promise((r) => setTimeout(r, 20));
  }
});

after(async () => {
  if (!child) return;
  signal(child, 'SIGTERM'); // not child.kill(): daemon.mjs says why
  const e = await exited;
  fs.rmSync(dir, { recursive: true, force: true });
  assert.equal(e.code, 0);
});

// the client as uid/gid 65534, no supplementary groups: lists the sandboxes
// through the default socket; prints "ok" or the error
function asNobody(system) {
  // require, not import(): Deno's `-e` has no dynamic import
  const script = `(async () => { const { Sandbox } = require(${JSON.stringify(path.join(dir, 'dist', 'index.js'))});
    const page = Sandbox.list(); await page.nextItems(); console.log('ok');
  })().catch((e) => { console.log(String(e.message)); process.exit(3); });`;
  // setpriv (util-linux) drops to the other user, not spawnSync's uid/gid
  // options: the runtime running this file may be Bun or Deno, whose support
  // of those options differs from node's
  return spawnSync('/usr/bin/setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', runtime, '-e', script], {
    encoding: 'utf8', timeout: 60_000,
    env: { PATH: process.env.PATH, HOME: '/nonexistent', XDG_RUNTIME_DIR: '/nonexistent/run', TUPPER_SYSTEM_SOCKET: system },
  });
}

test('a user that is not root reaches the system daemon through the fallback', { skip: !root && 'needs root to run a client as another user' }, () => {
  fs.chmodSync(socket, 0o666); // as tupper.socket's 0660 root:tupper is to a member of the group
  let r = asNobody(socket);
  assert.equal(r.status, 0, `${r.error || ''} ${r.stdout}${r.stderr}`);
  assert.equal(r.stdout.trim(), 'ok');
  r = asNobody('/nonexistent/gone.sock');
  assert.equal(r.status, 3);
  assert.match(r.stdout, /at \/nonexistent\/run\/tupper\.sock \(ENOENT\) nor at \/nonexistent\/gone\.sock \(ENOENT\)/);
  fs.chmodSync(socket, 0o600);
  r = asNobody(socket);
  assert.equal(r.status, 3);
  assert.ok(r.stdout.includes(`at ${socket} (EACCES), nothing at /nonexistent/run/tupper.sock`), r.stdout);
});
