// Policy files from the SDK: sent at create (a path, text, or the nearest
// tupper.lua), enforced by a real daemon, refusals as PolicyError.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { startDaemon } from './daemon.mjs';
import { Sandbox, PolicyError, InvalidArgumentError, findPolicy } from '../dist/index.js';

const POLICY = `return policy {
  max = { memory = "64M" },
  on_exec = function(argv)
    for _, a in ipairs(argv) do if a:find("rm ", 1, true) then return false, "no rm" end end
    return true
  end,
  on_file = function(op, path)
    if op == "write" and path:find("^/etc/") then return false, "/etc is read-only" end
    return true
  end,
}`;

let daemon;
let opts;
before(async () => {
  daemon = await startDaemon();
  opts = { socket: daemon.socket };
});
after(async () => {
  assert.equal((await daemon.stop()).code, 0);
});

test('a policy given as text caps limits and guards commands and files', async () => {
  const sbx = await Sandbox.create({ ...opts, policy: { source: POLICY, name: 'project/tupper.lua' } });
  try {
    const info = await sbx.getInfo();
    assert.equal(info.limits.memory, 64 * 1024 * 1024);
    await assert.rejects(sbx.commands.run('rm -rf /tmp'), (e) => {
      assert.ok(e instanceof PolicyError, String(e));
      assert.match(e.message, /project\/tupper\.lua: on_exec refused: no rm/);
      return true;
    });
    assert.equal((await sbx.commands.run('echo ok')).stdout, 'ok\n');
    await assert.rejects(sbx.files.write('/tmp/../etc/x', 'no'), PolicyError);
    await sbx.files.write('/tmp/x', 'yes');
    assert.equal(await sbx.files.read('/tmp/x'), 'yes');
  } finally {
    await sbx.kill();
  }
});

test('a policy above its cap is refused at create', async () => {
  await assert.rejects(
    Sandbox.create({ ...opts, limits: { memory: '1G' }, policy: { source: POLICY } }),
    (e) => e instanceof PolicyError && /max\.memory is 64M, asked 1G/.test(e.message),
  );
});

test('a path is read, and the nearest tupper.lua is found upward', async () => {
  const dir = fs.mkdtempSync(path.join(daemon.dir, 'project-'));
  fs.mkdirSync(path.join(dir, 'a', 'b'), { recursive: true });
  fs.writeFileSync(path.join(dir, 'tupper.lua'), POLICY);
  assert.equal(await findPolicy(path.join(dir, 'a', 'b')), path.join(dir, 'tupper.lua'));
  const sbx = await Sandbox.create({ ...opts, policy: path.join(dir, 'tupper.lua') });
  try {
    await assert.rejects(sbx.commands.run('rm -f /x'), PolicyError);
  } finally {
    await sbx.kill();
  }
  await assert.rejects(Sandbox.create({ ...opts, policy: path.join(dir, 'missing.lua') }), InvalidArgumentError);
  await assert.rejects(Sandbox.create({ ...opts, policy: { source: 'return policy { nope = 1 }' } }),
    (e) => e instanceof InvalidArgumentError && /unknown field 'nope'/.test(e.message));
  // policy: false sends none
  const free = await Sandbox.create({ ...opts, policy: false, limits: { memory: '1G' } });
  await free.kill();
});
