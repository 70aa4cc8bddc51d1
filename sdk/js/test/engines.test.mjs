// The Node versions the package claims (package.json "engines") against
// what it is built with and what it loads: a dependency bump that drops a
// Node version we claim fails here, under any node, before anyone runs the
// suite on that version (tests/slow/node18_spec.lua runs it on Debian's
// Node 18).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import semver from 'semver';

const PKG = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(fs.readFileSync(path.join(PKG, 'package.json'), 'utf8'));
const lock = JSON.parse(fs.readFileSync(path.join(PKG, 'package-lock.json'), 'utf8'));
const OURS = pkg.engines.node;

// Production dependencies whose engines exclude part of OURS, and why that
// is fine: none of them may be loaded by the package's entry points.
const NOT_LOADED = {
  // the MCP SDK's HTTP server transports; tupper's MCP server is stdio only
  'node_modules/@hono/node-server': 'server/streamableHttp of @modelcontextprotocol/sdk',
};

function admits(range) {
  return range === undefined || semver.subset(OURS, range, { includePrerelease: false });
}

/** The package directory ("node_modules/...") a loaded file belongs to. */
function packageOf(file) {
  const rel = path.relative(PKG, file).split(path.sep);
  let last = -1;
  rel.forEach((p, i) => { if (p === 'node_modules') last = i; });
  if (last < 0) return null;
  const n = rel[last + 1].startsWith('@') ? 3 : 2;
  return rel.slice(0, last + n).join('/');
}

test('engines.node is a valid range that the running node satisfies', () => {
  assert.ok(semver.validRange(OURS), OURS);
  assert.ok(semver.satisfies(process.versions.node, OURS), `node ${process.versions.node} is outside ${OURS}`);
});

test('the Node types the source is checked against are those of the oldest Node claimed', () => {
  // tsc then refuses a Node API that the oldest supported version lacks
  const types = lock.packages['node_modules/@types/node'].version;
  assert.equal(semver.major(types), semver.minVersion(OURS).major, `@types/node ${types} vs engines ${OURS}`);
  const ts = JSON.parse(fs.readFileSync(path.join(PKG, 'tsconfig.json'), 'utf8')).compilerOptions;
  // ES2022 is all there in Node 18 (V8 10.2); ES2023's lib would let
  // toSorted() and friends through, which Node 18 lacks
  assert.equal(ts.target, 'ES2022');
  assert.deepEqual(ts.lib, ['ES2022']);
});

test('every dependency the entry points load admits engines.node', () => {
  const require = createRequire(path.join(PKG, 'package.json'));
  const before = new Set(Object.keys(require.cache)); // this file's own imports (semver)
  for (const entry of ['index.js', 'mcp.js', 'http.js']) require(path.join(PKG, 'dist', entry));
  const loaded = new Set();
  for (const file of Object.keys(require.cache)) {
    if (before.has(file)) continue;
    const p = packageOf(file);
    if (p) loaded.add(p);
  }
  assert.ok(loaded.has('node_modules/@modelcontextprotocol/sdk'), [...loaded].join(' '));
  assert.ok(loaded.has('node_modules/zod'), [...loaded].join(' '));
  for (const p of loaded) {
    const info = lock.packages[p];
    assert.ok(info, `${p} is loaded but not in package-lock.json`);
    assert.ok(!info.dev, `${p} is a devDependency, loaded at run time`);
    assert.ok(admits(info.engines?.node), `${p}@${info.version} needs node ${info.engines?.node}, we claim ${OURS}`);
    assert.ok(!(p in NOT_LOADED), `${p} is loaded: ${NOT_LOADED[p]}`);
  }
});

test('the production dependencies that exclude part of engines.node are the known ones', () => {
  const excluding = Object.entries(lock.packages)
    .filter(([p, info]) => p !== '' && !info.dev && !admits(info.engines?.node))
    .map(([p]) => p)
    .sort();
  assert.deepEqual(excluding, Object.keys(NOT_LOADED).sort());
});

test('engines.bun and engines.deno start at the versions test/runtimes.sh runs the suite on', () => {
  const script = fs.readFileSync(path.join(PKG, 'test', 'runtimes.sh'), 'utf8');
  for (const name of ['bun', 'deno']) {
    const range = pkg.engines[name];
    assert.ok(semver.validRange(range), `engines.${name}: ${range}`);
    const pinned = new RegExp(`^${name.toUpperCase()}_VERSION=\\$\\{TUPPER_${name.toUpperCase()}_VERSION:-([^}]+)\\}$`, 'm').exec(script);
    assert.ok(pinned, `runtimes.sh pins no ${name} version`);
    assert.equal(semver.minVersion(range).version, pinned[1], `engines.${name} ${range} vs runtimes.sh's ${name}@${pinned[1]}`);
    // and under that runtime (runtimes.sh runs this file there too), it is inside the range
    const running = process.versions[name];
    if (running) assert.ok(semver.satisfies(running, range), `${name} ${running} is outside ${range}`);
  }
});
