// sbx.commands against a real daemon: foreground runs and exit codes,
// streaming, background handles, kill, stdin, timeouts, a killed sandbox.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { withSandbox } from './daemon.mjs';
import { Sandbox, SandboxError, CommandExitError, TimeoutError, CommandHandle, NotFoundError, InvalidArgumentError } from '../dist/index.js';

let daemon;
let sbx;
withSandbox(Sandbox, (d, s) => { daemon = d; sbx = s; });

test('run resolves stdout, stderr and exitCode 0', async () => {
  const r = await sbx.commands.run('echo out; echo err >&2');
  assert.deepEqual(r, { exitCode: 0, stdout: 'out\n', stderr: 'err\n' });
});

test('a non-zero exit rejects with CommandExitError carrying the output', async () => {
  await assert.rejects(sbx.commands.run('echo partial; echo bad >&2; exit 3'), (e) => {
    assert.ok(e instanceof CommandExitError);
    assert.ok(e instanceof SandboxError);
    assert.equal(e.exitCode, 3);
    assert.equal(e.stdout, 'partial\n');
    assert.equal(e.stderr, 'bad\n');
    assert.equal(e.error, 'exit status 3');
    assert.equal(e.result.exitCode, 3);
    return true;
  });
  // a missing program is exit 127 from the shell, as on E2B
  await assert.rejects(sbx.commands.run('nosuchprogram'), (e) => e instanceof CommandExitError && e.exitCode === 127);
});

test('a command its memory limit kills rejects with the reason', async () => {
  const small = await Sandbox.create({ socket: daemon.socket, limits: { memory: '64M' } });
  try {
    await assert.rejects(small.commands.run('dd if=/dev/zero of=/dev/null bs=256M count=1'), (e) => {
      assert.ok(e instanceof CommandExitError);
      assert.equal(e.error, "out of memory: killed by the sandbox's memory limit");
      return true;
    });
    // a kill that is not the memory limit's says signal: killed, as before
    await assert.rejects(small.commands.run('kill -9 $$'), (e) => e.error === 'signal: killed' || e.error === 'exit status 137');
  } finally {
    await small.kill();
  }
});

test('cwd and envs', async () => {
  const r = await sbx.commands.run('pwd; echo $A-$B', { cwd: '/tmp', envs: { A: '1', B: 'two' } });
  assert.equal(r.stdout, '/tmp\n1-two\n');
});

test('onStdout and onStderr stream chunks as they come', async () => {
  const out = [];
  const err = [];
  const r = await sbx.commands.run('echo one; sleep 0.2; echo two; echo e >&2', {
    onStdout: (d) => out.push(d),
    onStderr: (d) => err.push(d),
  });
  assert.equal(out.join(''), 'one\ntwo\n');
  assert.ok(out.length >= 2, 'two writes 200 ms apart arrive as two chunks');
  assert.equal(err.join(''), 'e\n');
  assert.equal(r.stdout, 'one\ntwo\n');
});

test('a character split across chunks, and bytes that are not UTF-8, decode', async () => {
  // é is c3 a9: the two halves come in separate (base64) chunks
  const r = await sbx.commands.run("printf '\\303'; sleep 0.2; printf '\\251\\n'");
  assert.equal(r.stdout, 'é\n');
  const bad = await sbx.commands.run("printf 'a\\377b'");
  assert.equal(bad.stdout, 'a\uFFFDb');
});

test('large output arrives whole', async () => {
  const r = await sbx.commands.run('head -c 3000000 /dev/zero | tr "\\0" x');
  assert.equal(r.stdout.length, 3_000_000);
  assert.ok(/^x+$/.test(r.stdout));
});

test('background: a handle with pid, list, kill; wait rejects after kill', async () => {
  const h = await sbx.commands.run('echo started; sleep 60', { background: true });
  assert.ok(h instanceof CommandHandle);
  assert.ok(Number.isInteger(h.pid) && h.pid > 0);
  const procs = await sbx.commands.list();
  const p = procs.find((x) => x.pid === h.pid);
  assert.ok(p, 'listed while it runs');
  assert.equal(p.cmd, '/bin/sh');
  assert.deepEqual(p.args, ['-c', 'echo started; sleep 60']);
  // killed before its echo ran (a loaded machine), it would have no output to check
  while (!h.stdout.includes('started')) await new Promise((r) => setTimeout(r, 10));
  assert.equal(await h.kill(), true);
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof CommandExitError);
    assert.equal(e.exitCode, -1);
    assert.equal(e.error, 'signal: killed');
    assert.equal(e.stdout, 'started\n');
    return true;
  });
  assert.equal(h.exitCode, -1);
  assert.equal(await h.kill(), false, 'no longer running');
  assert.equal(await sbx.commands.kill(h.pid), false);
  assert.ok(!(await sbx.commands.list()).some((x) => x.pid === h.pid));
});

test('commands.kill by pid; unknown pid is false', async () => {
  const h = await sbx.commands.run('sleep 60', { background: true });
  assert.equal(await sbx.commands.kill(h.pid), true);
  await assert.rejects(h.wait(), CommandExitError);
  assert.equal(await sbx.commands.kill(999999), false);
});

test('background wait resolves on success', async () => {
  const h = await sbx.commands.run('sleep 0.1; echo done', { background: true });
  const r = await h.wait();
  assert.equal(r.stdout, 'done\n');
  assert.equal(r.exitCode, 0);
  assert.equal(h.stdout, 'done\n');
});

test('stdin: sendStdin on the handle and by pid, then closeStdin', async () => {
  const h = await sbx.commands.run('cat; echo eof', { background: true, stdin: true });
  await h.sendStdin('hello ');
  await sbx.commands.sendStdin(h.pid, new TextEncoder().encode('world\n'));
  await h.closeStdin();
  const r = await h.wait();
  assert.equal(r.stdout, 'hello world\neof\n');
});

test('stdin: 3 MiB goes through in chunks', async () => {
  const h = await sbx.commands.run('wc -c', { background: true, stdin: true });
  await h.sendStdin(new Uint8Array(3 * 1024 * 1024).fill(65));
  await h.closeStdin();
  assert.equal((await h.wait()).stdout.trim(), String(3 * 1024 * 1024));
});

test('without stdin: true the command reads /dev/null', async () => {
  const r = await sbx.commands.run('cat; echo ok');
  assert.equal(r.stdout, 'ok\n');
});

test('timeoutMs kills the command with TimeoutError', async () => {
  const t0 = Date.now();
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 300 }), TimeoutError);
  assert.ok(Date.now() - t0 < 10_000);
  const r = await sbx.commands.run('sleep 0.1; echo ok', { timeoutMs: 0 });
  assert.equal(r.stdout, 'ok\n');
});

test('disconnect: the handle stops listening, the command keeps running', async () => {
  const h = await sbx.commands.run('sleep 60', { background: true });
  const waiting = h.wait();
  await h.disconnect();
  await assert.rejects(waiting, SandboxError);
  assert.ok((await sbx.commands.list()).some((x) => x.pid === h.pid));
  assert.equal(await sbx.commands.kill(h.pid), true);
});

test('killing the sandbox rejects background waits with TimeoutError', async () => {
  const other = await Sandbox.create({ socket: daemon.socket });
  const h = await other.commands.run('sleep 60', { background: true });
  const fg = assert.rejects(other.commands.run('sleep 60'), TimeoutError);
  while ((await other.commands.list()).length < 2) await new Promise((r) => setTimeout(r, 10));
  // by another client: this one learns of it from the exit (signal 9)
  assert.equal(await Sandbox.kill(other.sandboxId, { socket: daemon.socket }), true);
  await assert.rejects(h.wait(), TimeoutError);
  await fg;

  // by its own object
  const third = await Sandbox.create({ socket: daemon.socket });
  const h3 = await third.commands.run('sleep 60', { background: true });
  await third.kill();
  await assert.rejects(h3.wait(), TimeoutError);
  await assert.rejects(third.commands.run('true'), SandboxError);
});

test('output streams in order under load', async () => {
  const n = 20000;
  const chunks = [];
  // two noisy neighbours compete for the box, the daemon and the socket
  const noise = await Promise.all([1, 2].map(() => sbx.commands.run('head -c 20000000 /dev/zero | tr "\\0" y', { background: true })));
  const r = await sbx.commands.run(`i=0; while [ $i -lt ${n} ]; do i=$((i+1)); echo $i; done`, {
    onStdout: (d) => chunks.push(d),
  });
  await Promise.all(noise.map((h) => h.wait()));
  const lines = chunks.join('').split('\n');
  assert.equal(lines.pop(), '');
  assert.equal(lines.length, n);
  for (let i = 0; i < n; i++) if (lines[i] !== String(i + 1)) assert.fail(`line ${i} is ${lines[i]}`);
  assert.equal(r.stdout, chunks.join(''));
});

test('kill takes the whole tree down: children, a setsid grandchild, a double fork', async () => {
  const h = await sbx.commands.run(
    'sleep 301 & setsid sleep 302 & (sleep 303 &) ; echo up; wait',
    { background: true },
  );
  const count = async () => Number((await sbx.commands.run('ps -o comm,args | grep -c "sleep 30[123]" || true')).stdout.trim());
  while ((await count()) < 3) await new Promise((r) => setTimeout(r, 20));
  assert.equal(await sbx.commands.kill(h.pid), true);
  await assert.rejects(h.wait(), CommandExitError);
  assert.equal(await count(), 0, 'no sleep left');
});

test('connect: a background command reattached from a new client after a reconnect', async () => {
  const h = await sbx.commands.run('echo before; read x; echo after $x; sleep 0.1', { background: true, stdin: true });
  while (!h.stdout.includes('before')) await new Promise((r) => setTimeout(r, 10));
  await h.disconnect();
  // a new client, as after a crash or a redeploy of the caller
  const again = await Sandbox.connect(sbx.sandboxId, { socket: daemon.socket });
  const out = [];
  const h2 = await again.commands.connect(h.pid, { onStdout: (d) => out.push(d) });
  assert.equal(h2.pid, h.pid);
  assert.equal(h2.stdout, 'before\n', 'the recent output is replayed');
  await again.commands.sendStdin(h.pid, 'now\n');
  const r = await h2.wait();
  assert.equal(r.stdout, 'before\nafter now\n');
  assert.equal(out.join(''), 'before\nafter now\n');
  await assert.rejects(again.commands.connect(h.pid), NotFoundError);
  await assert.rejects(again.commands.connect(999999), NotFoundError);
});

test('user: a command runs as an account of the box, in its home; list says who', async () => {
  const r = await sbx.commands.run('id -u; pwd; echo $HOME', { user: 'user' });
  assert.equal(r.stdout, '1000\n/home/user\n/home/user\n');
  const root = await sbx.commands.run('id -u; pwd; echo $HOME', { user: 'root' });
  assert.equal(root.stdout, '0\n/root\n/root\n');
  const h = await sbx.commands.run('sleep 60', { background: true, user: 'user' });
  const p = (await sbx.commands.list()).find((x) => x.pid === h.pid);
  assert.equal(p.user, 'user');
  await h.kill();
  await assert.rejects(sbx.commands.run('true', { user: 'nosuchuser' }), NotFoundError);
  await assert.rejects(sbx.commands.run('true', { user: 'bad name' }), InvalidArgumentError);
});
