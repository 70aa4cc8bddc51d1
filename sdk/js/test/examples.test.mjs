// The scripts in examples/ run against a real daemon and say what they should.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startDaemon } from './daemon.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
let daemon;
before(async () => { daemon = await startDaemon(); });
after(async () => { assert.equal((await daemon.stop()).code, 0); });

function run(name) {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [path.join(here, '..', 'examples', name)], {
      env: { ...process.env, TUPPER_SOCKET: daemon.socket },
      timeout: 120_000,
    }, (err, stdout, stderr) => (err ? reject(new Error(`${name}: ${err.message}\n${stderr}`)) : resolve(stdout)));
  });
}

test('run-code.mjs', async () => {
  const out = await run('run-code.mjs');
  assert.match(out, /fibonacci: 0 1 1 2 3 5 8 13 21 34/);
  assert.match(out, /failed as expected: exit 3, stderr "about to fail\\n"/);
});

test('stream-output.mjs', async () => {
  const out = await run('stream-output.mjs');
  assert.match(out, /out: tick 1\n[^]*out: tick 3\n/);
  assert.match(out, /err: warn 2/);
  assert.match(out, /exit code 0/);
});

test('files.mjs', async () => {
  const out = await run('files.mjs');
  assert.match(out, /Hello from the host/);
  assert.match(out, /bytes: \[ 0, 1, 2, 255 \]/);
  assert.match(out, /streamed back 8388608 bytes/);
  assert.match(out, /events: .*create src.*write src\/hello.txt/);
});

test('background.mjs', async () => {
  const out = await run('background.mjs');
  assert.match(out, /> server up/);
  assert.match(out, /> got: hello/);
  assert.match(out, /killed: true/);
});

test('pty.mjs (scripted, not on a terminal)', async () => {
  const out = await run('pty.mjs');
  assert.match(out, /24 80/);
  assert.match(out, /\/dev\/pts\//);
  assert.match(out, /40 120/);
});
