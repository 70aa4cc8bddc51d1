// Templates are recipes: E2B's Template builder becomes a tupper recipe,
// Template.build registers it with a real daemon and builds its layer, and
// Sandbox.create(name) starts from it, its start command running at every
// create and the create waiting for its ready check.  Sandbox.create('base')
// is the shipped Python recipe (seen by a policy, so nothing is built).
// The embedded busybox image keeps it fast and offline.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { BIN, signal, startDaemon, track } from './daemon.mjs';
import {
  Sandbox,
  SandboxError,
  InvalidArgumentError,
  Template,
  waitForPort,
  waitForFile,
  waitForURL,
  waitForProcess,
  waitForTimeout,
} from '../dist/index.js';

let daemon;
let opts;
let ctx;
before(async () => {
  daemon = await startDaemon();
  opts = { socket: daemon.socket };
  ctx = path.join(daemon.dir, 'ctx');
  fs.mkdirSync(path.join(ctx, 'app', 'lib'), { recursive: true });
  fs.writeFileSync(path.join(ctx, 'app', 'serve.sh'), '#!/bin/sh\necho "$GREETING from $(pwd)" > /tmp/hello\nexec nc -l -p 8080\n');
  fs.writeFileSync(path.join(ctx, 'app', 'lib', 'data.bin'), Buffer.from([0, 1, 2, 0x22, 0x5c, 10, 13, 255]));
});
after(async () => {
  try {
    assert.deepEqual(await Sandbox.list(opts).nextItems(), []);
  } finally {
    assert.equal((await daemon.stop()).code, 0);
  }
});

test('a Template builds, registers and creates; its start command runs at every create, the create waits for it', async () => {
  const t = Template({ fileContextPath: ctx })
    .fromImage('default')
    .setEnvs({ GREETING: 'hello' })
    .setWorkdir('/app')
    .copy('app/', '/app/')
    .runCmd('chmod 755 serve.sh && echo built > /app/built && echo "step output: $(pwd)"')
    .setStartCmd('./serve.sh', waitForPort(8080));
  const logs = [];
  const info = await Template.build(t, 'busy-app:v1', { ...opts, onBuildLogs: (e) => logs.push(e.message) });
  assert.equal(info.name, 'busy-app:v1');
  assert.match(info.buildId, /^[0-9a-f]{64}$/);
  assert.ok(logs.some((l) => /Layer [0-9a-f]{64} built/.test(l)), logs.join('\n'));
  // the setup's own output, line by line, as it ran
  assert.ok(logs.includes('step output: /app'), logs.join('\n'));
  assert.ok(await Template.exists('busy-app:v1', opts));
  for (let i = 0; i < 2; i++) {
    const sbx = await Sandbox.create('busy-app:v1', opts);
    try {
      // ready when the create returned: listening, and its file written
      const r = await sbx.commands.run('cat /tmp/hello /app/built; cat /proc/net/tcp /proc/net/tcp6 | grep -c ":1F90 .* 0A "');
      assert.equal(r.stdout, 'hello from /app\nbuilt\n1\n');
      const bin = await sbx.files.read('/app/lib/data.bin', { format: 'bytes' });
      assert.deepEqual([...bin], [0, 1, 2, 0x22, 0x5c, 10, 13, 255]);
      const procs = await sbx.commands.list();
      assert.ok(procs.some((p) => p.cmd === '/bin/sh' && p.args.join(' ').includes('./serve.sh')), JSON.stringify(procs));
    } finally {
      await sbx.kill();
    }
  }
  // a second build of the same template finds its layer
  const logs2 = [];
  await Template.build(t, { ...opts, alias: 'busy-app:v1', onBuildLogs: (e) => logs2.push(e.message) });
  assert.ok(logs2.some((l) => /Layer [0-9a-f]{64} cached/.test(l)), logs2.join('\n'));
});

test('waitForFile, and a ready check that never passes fails the create in bounded time', async () => {
  await Template.build(
    Template().fromImage('default').setStartCmd('sleep 0.5; touch /tmp/up; exec sleep 1000', waitForFile('/tmp/up')),
    'file-ready',
    opts,
  );
  const sbx = await Sandbox.create('file-ready', opts);
  try {
    assert.equal((await sbx.commands.run('ls /tmp/up')).stdout, '/tmp/up\n');
  } finally {
    await sbx.kill();
  }
  await Template.build(
    Template().fromImage('default').setStartCmd('echo starting; exec sleep 1000', waitForPort(9), { timeoutMs: 1000 }),
    'never-ready',
    opts,
  );
  const t0 = Date.now();
  await assert.rejects(Sandbox.create('never-ready', opts), (e) => {
    assert.ok(e instanceof SandboxError, String(e));
    assert.match(e.message, /ready check .* did not pass within 1 s/);
    assert.match(e.message, /starting/);
    return true;
  });
  assert.ok(Date.now() - t0 < 15_000);
  assert.deepEqual(await Sandbox.list(opts).nextItems(), []);
  assert.equal(await Template.remove('never-ready', opts), true);
  assert.equal(await Template.remove('never-ready', opts), false);
});

test("Sandbox.create('base') is the shipped Python recipe, not a pull", async () => {
  // the policy sees the recipe's Debian image and refuses it: nothing built or pulled
  const policy = { source: 'return policy { on_create = function(s) return false, "saw " .. tostring(s.image) end }' };
  await assert.rejects(Sandbox.create('base', { ...opts, policy }), (e) => {
    assert.match(e.message, /saw debian:bookworm/);
    return true;
  });
  // a recipe file is read here; a missing one is refused before the daemon
  const file = path.join(daemon.dir, 'r.lua');
  fs.writeFileSync(file, 'return recipe "from-file" { env = { X = "1" } }');
  const sbx = await Sandbox.create(file, opts);
  try {
    assert.equal((await sbx.getInfo()).recipe.name, 'from-file');
    assert.equal((await sbx.commands.run('echo $X')).stdout, '1\n');
  } finally {
    await sbx.kill();
  }
  await assert.rejects(Sandbox.create('./missing.lua', opts), InvalidArgumentError);
});

test('bad names and bad builder input are refused', async () => {
  for (const name of ['a/b', '../x', 'a..b', '.x', 'x\ny', 'a b', 'x'.repeat(129)]) {
    await assert.rejects(Template.build(Template().fromImage('default'), name, opts), (e) => e instanceof SandboxError, name);
  }
  assert.throws(() => Template().fromImage('default', { username: 'u', password: 'p' }), InvalidArgumentError);
  assert.throws(() => waitForPort(0), InvalidArgumentError);
  assert.throws(() => Template().setEnvs({ 'A=B': 'x' }), InvalidArgumentError);
  await assert.rejects(Template.build(Template().copy('nope.txt', '/x'), 'nope', opts), InvalidArgumentError);
  // a setup that fails fails the build, naming the template and the command
  await assert.rejects(Template.build(Template().fromImage('default').runCmd('exit 7'), 'fails', opts), (e) => {
    assert.match(e.message, /template fails:\d+: command "exit 7" exited with 7/);
    return true;
  });
  const names = (await Template.list(opts)).map((x) => x.name);
  assert.ok(!names.includes('fails') && !names.includes('nope'), names.join(','));
  // the helpers are shell commands of the image's own tools
  assert.match(waitForURL('http://localhost:3000/x', 204).getCmd(), /204/);
  assert.match(waitForProcess('nginx').getCmd(), /'nginx'/);
  assert.equal(waitForTimeout(1500).getCmd(), 'sleep 2');
});

test('registered templates survive a daemon restart', async () => {
  const dir = fs.mkdtempSync(path.join(daemon.dir, 'restart-'));
  const socket = path.join(dir, 's.sock');
  const state = path.join(dir, 'state');
  const start = async () => {
    const child = track(spawn(BIN, ['daemon', '--socket', socket, '--state-dir', state, '--log', path.join(dir, 'log')], { stdio: 'ignore' }));
    const exit = new Promise((r) => child.once('exit', (code) => r(code)));
    // up once its socket answers (a stopped daemon's file may still be there)
    const answers = () =>
      new Promise((resolve) => {
        const s = net.createConnection({ path: socket });
        s.once('connect', () => { s.destroy(); resolve(true); });
        s.once('error', () => { s.destroy(); resolve(false); });
      });
    for (let i = 0; i < 1000 && !(await answers()); i++) await new Promise((r) => setTimeout(r, 10));
    return { stop: async () => { signal(child, 'SIGTERM'); return exit; } }; // not child.kill(): daemon.mjs says why
  };
  let d = await start();
  try {
    await Template.build(Template().fromImage('default').setEnvs({ KEPT: 'yes' }), 'kept', { socket });
  } finally {
    assert.equal(await d.stop(), 0);
  }
  d = await start();
  try {
    assert.deepEqual((await Template.list({ socket })).map((x) => x.name), ['kept']);
    const sbx = await Sandbox.create('kept', { socket });
    try {
      assert.equal((await sbx.commands.run('echo $KEPT')).stdout, 'yes\n');
    } finally {
      await sbx.kill();
    }
  } finally {
    assert.equal(await d.stop(), 0);
  }
});

test('bases: Debian images tupper builds take aptInstall as packages; other versions are Docker Hub images', async () => {
  const deb = await Template.toRecipe(Template().fromDebianImage('stable').aptInstall(['git', 'jq']).runCmd('git --version'), 'deb:1');
  assert.match(deb, /^return recipe "deb-1" \{$/m);
  assert.match(deb, /image = \{ debian = "bookworm", packages = \{ "ca-certificates", "git", "jq" \} \}/);
  assert.doesNotMatch(deb, /apt-get/);
  const base = await Template.toRecipe(Template().fromBaseImage(), 'b');
  assert.match(base, /packages = \{ "ca-certificates", "curl", "git", "python3", "python3-pip" \}/);
  assert.match(base, /user = "user"/);
  const py = await Template.toRecipe(Template().fromPythonImage('3.12').aptInstall('vim'), 'p');
  assert.match(py, /image = "docker\.io\/library\/python:3\.12"/);
  assert.match(py, /apt-get install -y 'vim'/);
  assert.match(await Template.toRecipe(Template().fromNodeImage(), 'n'), /image = "docker\.io\/library\/node:lts"/);
});
