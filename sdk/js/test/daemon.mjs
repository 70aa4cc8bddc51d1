// Starts a real tupper daemon on a private socket and state dir in a temp
// dir (as tests/spec/helper.lua does) and stops it with SIGTERM.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const BIN = process.env.TUPPER_BIN || path.resolve(here, '../../../build/tupper');

// The net under the after hooks.  Every daemon (and other process, through
// track) a test file started is recorded until it exits.  A file whose
// hooks never stopped one (a test that failed before its stop, an after
// hook that threw) would never end: that daemon's process and a sandbox's
// socket keep node's loop alive.  So once the file's tests are over, what
// still runs a minute later (the file's own after hooks have long stopped
// theirs by then) is sent SIGTERM, which destroys a daemon's boxes, and its
// dir removed; the timer itself keeps nobody waiting.  A process still
// running when the file's process exits is sent SIGTERM too.
const LEAK_GRACE_MS = 60_000;
const live = new Map(); // child process -> its temp dir, or null
function leaked() {
  for (const [child, dir] of live) {
    process.stderr.write(`daemon.mjs: pid ${child.pid} outlived its test file's hooks: SIGTERM\n`);
    if (dir) child.once('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
    child.kill('SIGTERM');
  }
}
after(() => { setTimeout(leaked, LEAK_GRACE_MS).unref(); });
process.on('exit', () => {
  for (const child of live.keys()) child.kill('SIGTERM');
});

/** Sends `signal` to a child that has not exited yet, by its pid.  Not
 * child.kill(): Deno (2.9) reports a child it signalled that way as killed
 * by that signal, { code: null, sig }, even when the child caught it and
 * exited 0, so a clean shutdown could not be told from a crash there. */
export function signal(child, sig = 'SIGTERM') {
  if (child.exitCode !== null || child.signalCode !== null) return false;
  try {
    process.kill(child.pid, sig);
    return true;
  } catch (e) {
    if (e.code === 'ESRCH') return false;
    throw e;
  }
}

/** Records a child process to be sent SIGTERM if it still runs a minute
 * after this file's tests, or when the file's process exits; returns it. */
export function track(child, dir = null) {
  live.set(child, dir);
  child.once('exit', () => live.delete(child));
  return child;
}

function answers(socket) {
  return new Promise((resolve) => {
    const s = net.createConnection({ path: socket });
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('error', () => { s.destroy(); resolve(false); });
  });
}

export async function startDaemon() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tupper-sdk-'));
  const socket = path.join(dir, 'tupper.sock');
  const log = path.join(dir, 'daemon.log');
  const child = spawn(BIN, ['daemon', '--socket', socket, '--state-dir', path.join(dir, 'state'), '--log', log], {
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  let exited = null;
  const exit = new Promise((resolve) => child.once('exit', (code, sig) => { exited = { code, sig }; resolve(exited); }));
  // as tests/spec/helper.lua's START_MS: a loaded 2-core machine takes far
  // longer than an idle one (the loop ends as soon as the daemon answers)
  const deadline = Date.now() + 90_000;
  while (!(await answers(socket))) {
    if (exited || Date.now() > deadline) {
      child.kill('SIGKILL');
      await exit;
      const text = fs.existsSync(log) ? fs.readFileSync(log, 'utf8') : '';
      fs.rmSync(dir, { recursive: true, force: true });
      throw new Error(`daemon did not start: ${text}`);
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  track(child, dir);
  const daemon = {
    socket,
    dir,
    log,
    async stop() {
      if (!exited) {
        signal(child, 'SIGTERM');
        // its boxes are destroyed first: give it the 30 s tests/spec/cleanup.lua gives
        const t = setTimeout(() => child.kill('SIGKILL'), 30_000);
        await exit;
        clearTimeout(t);
      }
      fs.rmSync(dir, { recursive: true, force: true });
      return exited;
    },
  };
  return daemon;
}

/** Starts a private daemon and one sandbox for a test file (node:test
 * before/after hooks); `use(daemon, sbx)` receives them.  The sandbox is
 * killed and the daemon must stop cleanly afterwards (stopped even when the
 * kill fails).  TUPPER_TEST_BACKEND
 * (e.g. microvm) picks the sandbox's backend: the same tests, another
 * backend (docs/microvm.md). */
export function withSandbox(Sandbox, use) {
  let daemon;
  let sbx;
  before(async () => {
    daemon = await startDaemon();
    const backend = process.env.TUPPER_TEST_BACKEND;
    sbx = await Sandbox.create({ socket: daemon.socket, ...(backend ? { backend } : {}) });
    use(daemon, sbx);
  });
  after(async () => {
    try {
      await sbx?.kill();
    } finally {
      // stopped whatever the kill did (a before that failed has no sbx)
      if (daemon) assert.equal((await daemon.stop()).code, 0);
    }
  });
}
