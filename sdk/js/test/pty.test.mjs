// sbx.pty against a real daemon: a real busybox shell on a terminal of the
// box: echo, input, resize seen by `stty size`, kill, hostile sizes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { withSandbox } from './daemon.mjs';
import { Sandbox, CommandExitError, InvalidArgumentError, NotFoundError } from '../dist/index.js';

let sbx;
withSandbox(Sandbox, (_d, s) => { sbx = s; });

// Collects a terminal's bytes; until(text) waits for text to show.
function screen() {
  const chunks = [];
  let wake = () => {};
  const s = {
    onData: (d) => { assert.ok(d instanceof Uint8Array); chunks.push(Buffer.from(d)); wake(); },
    text: () => Buffer.concat(chunks).toString('utf8'),
    async until(text, ms = 10_000) {
      const deadline = Date.now() + ms;
      while (!s.text().includes(text)) {
        if (Date.now() > deadline) throw new Error(`no ${JSON.stringify(text)} on the terminal: ${JSON.stringify(s.text())}`);
        await new Promise((r) => { wake = r; setTimeout(r, 200); });
      }
    },
  };
  return s;
}

test('a shell on a terminal: echo, input, stty size, resize, exit code', async () => {
  const term = screen();
  const h = await sbx.pty.create({ cols: 100, rows: 30, onData: term.onData, envs: { PS1: 'PROMPT> ' } });
  assert.ok(h.pid > 0);
  await sbx.pty.sendInput(h.pid, 'echo hi-$((6*7))\n');
  await term.until('hi-42');
  // the terminal echoes what was typed
  assert.ok(term.text().includes('echo hi-$((6*7))'));
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size; tty\n'));
  await term.until('30 100');
  await term.until('/dev/pts/');
  await sbx.pty.resize(h.pid, { cols: 132, rows: 43 });
  await sbx.pty.sendInput(h.pid, 'stty size\n');
  await term.until('43 132');
  await sbx.pty.sendInput(h.pid, 'exit 3\n');
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode === 3);
  assert.equal(h.stdout, '', 'terminal output goes to onData, not stdout');
});

test('a terminal in a cwd as a user, with the program given', async () => {
  const term = screen();
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: term.onData, cwd: '/tmp', user: 'user',
    cmd: ['/bin/sh', '-c', 'pwd; id -u; test -t 0 && echo is-a-tty'] });
  const r = await h.wait();
  assert.equal(r.exitCode, 0);
  assert.match(term.text(), /\/tmp\r\n1000\r\nis-a-tty\r\n/);
});

test('pty.kill ends it (listed meanwhile as a terminal); unknown pid is false', async () => {
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} });
  const listed = (await sbx.commands.list()).find((p) => p.pid === h.pid);
  assert.equal(listed?.pty, true);
  assert.equal(await sbx.pty.kill(h.pid), true);
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.error === 'signal: killed');
  assert.equal(await sbx.pty.kill(h.pid), false);
  await assert.rejects(sbx.pty.resize(h.pid, { cols: 10, rows: 10 }), NotFoundError);
});

test('hostile sizes are refused before they reach the daemon, and by it', async () => {
  for (const size of [{ cols: 0, rows: 24 }, { cols: 80, rows: 4097 }, { cols: 1.5, rows: 2 }, { cols: '80', rows: 24 }, {}]) {
    await assert.rejects(sbx.pty.create({ ...size, onData: () => {} }), InvalidArgumentError);
  }
  await assert.rejects(sbx.pty.create({ cols: 80, rows: 24 }), InvalidArgumentError);
  const plain = await sbx.commands.run('sleep 100', { background: true });
  await assert.rejects(sbx.pty.resize(plain.pid, { cols: 80, rows: 24 }), (e) => e.errnoCode === 'ENOTTY');
  await plain.kill();
});
