// files.watchDir against a real daemon: events of a nested tree
// (recursive), a flat watch, stop(), timeoutMs, errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { withSandbox } from './daemon.mjs';
import { Sandbox, FilesystemEventType, NotFoundError, TimeoutError, SandboxError } from '../dist/index.js';

let sbx;
withSandbox(Sandbox, (_d, s) => { sbx = s; });

function recorder() {
  const events = [];
  let wake = () => {};
  return {
    events,
    onEvent: (e) => { events.push(`${e.type} ${e.name}`); wake(); },
    async until(line, ms = 10_000) {
      const deadline = Date.now() + ms;
      while (!events.includes(line)) {
        if (Date.now() > deadline) throw new Error(`no event ${line}; got ${JSON.stringify(events)}`);
        await new Promise((r) => { wake = r; setTimeout(r, 200); });
      }
    },
  };
}

test('recursive: create, write, rename, chmod, remove in nested dirs', async () => {
  await sbx.files.makeDir('/tmp/rw/a');
  const rec = recorder();
  const exits = [];
  const h = await sbx.files.watchDir('/tmp/rw', rec.onEvent, { recursive: true, onExit: (e) => exits.push(e) });
  await sbx.commands.run('mkdir -p /tmp/rw/a/b/c');
  await rec.until(`${FilesystemEventType.CREATE} a/b`);
  await rec.until('create a/b/c');
  await sbx.files.write('/tmp/rw/a/b/c/f.txt', 'hello');
  await rec.until('create a/b/c/f.txt');
  await rec.until(`${FilesystemEventType.WRITE} a/b/c/f.txt`);
  await sbx.files.rename('/tmp/rw/a/b/c/f.txt', '/tmp/rw/a/b/g.txt');
  await rec.until(`${FilesystemEventType.RENAME} a/b/c/f.txt`);
  await rec.until('create a/b/g.txt');
  await sbx.commands.run('chmod 600 /tmp/rw/a/b/g.txt');
  await rec.until(`${FilesystemEventType.CHMOD} a/b/g.txt`);
  await sbx.files.remove('/tmp/rw/a/b/g.txt');
  await rec.until(`${FilesystemEventType.REMOVE} a/b/g.txt`);
  await h.stop();
  assert.deepEqual(exits, [undefined], 'onExit once, without an error, after stop()');
  const n = rec.events.length;
  await sbx.files.write('/tmp/rw/after.txt', 'x');
  await sbx.commands.run('sleep 0.3');
  assert.equal(rec.events.length, n, 'no event after stop()');
});

test('a flat watch sees the top level only', async () => {
  await sbx.files.makeDir('/tmp/fw/sub');
  const rec = recorder();
  const h = await sbx.files.watchDir('/tmp/fw', rec.onEvent);
  await sbx.files.write('/tmp/fw/sub/deep.txt', 'x');
  await sbx.files.write('/tmp/fw/top.txt', 'x');
  await rec.until('create top.txt');
  assert.ok(!rec.events.some((e) => e.includes('deep.txt')), JSON.stringify(rec.events));
  await h.stop();
});

test('timeoutMs ends the watch with TimeoutError; the directory going away ends it too', async () => {
  await sbx.files.makeDir('/tmp/tw');
  const ended = new Promise((resolve) => {
    void sbx.files.watchDir('/tmp/tw', () => {}, { timeoutMs: 300, onExit: resolve });
  });
  assert.ok((await ended) instanceof TimeoutError);
  await sbx.files.makeDir('/tmp/gw');
  const gone = new Promise((resolve) => {
    void sbx.files.watchDir('/tmp/gw', () => {}, { onExit: resolve });
  });
  await sbx.files.remove('/tmp/gw');
  const e = await gone;
  assert.ok(e instanceof SandboxError && /gone/.test(e.message), String(e));
});

test('watching what is not there, or not a directory, is an error', async () => {
  await assert.rejects(sbx.files.watchDir('/nonexistent', () => {}), NotFoundError);
  await assert.rejects(sbx.files.watchDir('/etc/passwd', () => {}), (e) => e.errnoCode === 'ENOTDIR');
});
