// Recipes from the SDK: a recipe file (with its lockfile), its text, or a
// shipped recipe's name, against a real daemon; setup runs once and the
// next sandbox comes from its cached layer; failures are SandboxErrors
// naming the recipe's line.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { startDaemon } from './daemon.mjs';
import { Sandbox, SandboxError, InvalidArgumentError, lockPath } from '../dist/index.js';

const RECIPE = `return recipe "node-spec" {
  env = { GREETING = "hi" },
  workdir = "/home/user",
  user = "user",
  limits = { memory = "128M", timeout = "7m" },
  files = { ["/etc/motd"] = "from the recipe\\n" },
  setup = function(box)
    box:run("cat /proc/sys/kernel/random/uuid > /built")
  end,
}
`;

let daemon;
let opts;
before(async () => {
  daemon = await startDaemon();
  opts = { socket: daemon.socket, policy: false };
});
after(async () => {
  assert.equal((await daemon.stop()).code, 0);
});

test('a recipe file sets the image, env, workdir, user, limits and files; setup is cached', async () => {
  const file = path.join(daemon.dir, 'app.lua');
  fs.writeFileSync(file, RECIPE);
  const a = await Sandbox.create({ ...opts, recipe: file });
  let built;
  try {
    const info = await a.getInfo();
    assert.equal(info.recipe.name, 'node-spec');
    assert.equal(info.recipe.cached, false);
    assert.equal(info.limits.memory, 128 * 1024 * 1024);
    assert.equal(info.timeoutMs, 7 * 60 * 1000);
    const r = await a.commands.run('id -u; pwd; echo $GREETING; cat /etc/motd /built');
    const lines = r.stdout.split('\n');
    assert.deepEqual(lines.slice(0, 4), ['1000', '/home/user', 'hi', 'from the recipe']);
    built = lines[4];
    assert.match(built, /^[0-9a-f-]{36}$/);
  } finally {
    await a.kill();
  }
  // the second sandbox comes from the layer: setup did not run again;
  // explicit options override the recipe's
  const b = await Sandbox.create({ ...opts, recipe: { source: RECIPE, name: 'app.lua' }, envs: { GREETING: 'yo' }, timeoutMs: 60_000 });
  try {
    const info = await b.getInfo();
    assert.equal(info.recipe.cached, true);
    assert.equal(info.timeoutMs, 60_000);
    assert.equal((await b.commands.run('echo $GREETING; cat /built')).stdout, `yo\n${built}\n`);
  } finally {
    await b.kill();
  }
});

test('a lockfile beside the recipe is sent, and a changed recipe is refused', async () => {
  const file = path.join(daemon.dir, 'locked.lua');
  fs.writeFileSync(file, RECIPE);
  fs.writeFileSync(lockPath(file), JSON.stringify({ version: 1, recipe_sha256: '0'.repeat(64), image: 'default', image_digest: 'sha256:x' }));
  await assert.rejects(Sandbox.create({ ...opts, recipe: file }), (e) => {
    assert.ok(e instanceof SandboxError, String(e));
    assert.match(e.message, /locked\.lua changed since it was locked/);
    return true;
  });
});

test('a shipped recipe by name; failures name the recipe and its line', async () => {
  const sbx = await Sandbox.create({ ...opts, recipe: 'default' });
  try {
    assert.equal((await sbx.getInfo()).recipe.name, 'default');
  } finally {
    await sbx.kill();
  }
  await assert.rejects(
    Sandbox.create({ ...opts, recipe: { source: 'return recipe "x" {\n  setup = function(box)\n    box:run("exit 4")\n  end }', name: 'bad.lua' } }),
    (e) => e instanceof SandboxError && /bad\.lua:3: command "exit 4" exited with 4/.test(e.message),
  );
  await assert.rejects(
    Sandbox.create({ ...opts, recipe: { source: 'return recipe "x" { network = { allow = { "pypi.org:99999" } } }' } }),
    (e) => e instanceof SandboxError && /bad port '99999'/.test(e.message),
  );
  await assert.rejects(Sandbox.create({ ...opts, recipe: path.join(daemon.dir, 'missing.lua') }), InvalidArgumentError);
  await assert.rejects(Sandbox.create({ ...opts, recipe: { source: 'x'.repeat(1024 * 1024 + 1) } }), InvalidArgumentError);
  assert.deepEqual(await Sandbox.list({ socket: daemon.socket }).nextItems(), []);
});
