// The package as a project uses it: found by name ('@tupper/sdk') in the
// project's node_modules through package.json's "exports", by import and
// by require, in a script run by the same runtime as this file (node, or
// bun and deno under test/runtimes.sh), against a real daemon.  Under Deno
// the script runs with the permissions the README names, not -A.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startDaemon } from './daemon.mjs';

const PKG = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

const SCRIPT = `import { Sandbox, CommandExitError } from '@tupper/sdk';
import Default from '@tupper/sdk';
import { createRequire } from 'node:module';
const cjs = createRequire(import.meta.url)('@tupper/sdk');
if (cjs.Sandbox !== Sandbox || cjs.default !== Sandbox) throw new Error('require and import differ');
// the default import of CommonJS: module.exports on node and deno, its .default on bun
const def = Default === Sandbox ? 'Sandbox' : Default === cjs ? 'module.exports' : 'something else';
const sbx = await Sandbox.create({ socket: process.env.TUPPER_SOCKET });
try {
  const r = await sbx.commands.run('echo "$((6 * 7))"');
  await sbx.files.write('/tmp/f', 'from the project');
  let code = null;
  try { await sbx.commands.run('exit 5'); } catch (e) { if (e instanceof CommandExitError) code = e.exitCode; else throw e; }
  console.log(JSON.stringify({ out: r.stdout, file: await sbx.files.read('/tmp/f'), code, def }));
} finally {
  await sbx.kill();
}
`;

let daemon;
let dir;
before(async () => {
  daemon = await startDaemon();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tupper-project-'));
  // what `npm install /path/to/sdk/js` makes: a dependency and a link
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({
    name: 'a-project', private: true, dependencies: { '@tupper/sdk': `file:${PKG}` },
  }));
  fs.mkdirSync(path.join(dir, 'node_modules', '@tupper'), { recursive: true });
  fs.symlinkSync(PKG, path.join(dir, 'node_modules', '@tupper', 'sdk'));
  fs.writeFileSync(path.join(dir, 'main.mjs'), SCRIPT);
});
after(async () => {
  try {
    assert.equal((await daemon.stop()).code, 0);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

function run(args) {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, args, {
      cwd: dir,
      env: { ...process.env, TUPPER_SOCKET: daemon.socket },
      timeout: 60_000,
    }, (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)));
  });
}

test('a project imports and requires @tupper/sdk by name and runs a sandbox', async () => {
  const s = daemon.socket;
  const args = process.versions.deno
    ? ['run', '--no-prompt', '--allow-env', '--allow-read', `--allow-write=${s}`, `--allow-net=unix:${s}`, 'main.mjs']
    : ['main.mjs'];
  const out = JSON.parse(await run(args));
  // README's Runtimes: use the named import, the default one differs
  const def = process.versions.bun ? 'Sandbox' : 'module.exports';
  assert.deepEqual(out, { out: '42\n', file: 'from the project', code: 5, def });
  if (process.versions.deno) {
    // those permissions are needed: without the socket's, Deno refuses
    await assert.rejects(run(['run', '--no-prompt', '--allow-env', '--allow-read', 'main.mjs']),
      /NotCapable: Requires (write|net) access to "(unix:)?[^"]*tupper\.sock"/);
  }
});
