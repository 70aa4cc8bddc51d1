// Not a test of the SDK: runtimes.sh runs this file first on each runtime
// and requires the run to FAIL.  Its one test passes and its top-level
// after() hook throws, as a file's hook does when its daemon did not stop
// cleanly; a runner that ignored that (Deno's node:test does, without
// test/deno/node-test.mjs) would let every such failure of the suite pass.
import { after, test } from 'node:test';

test('runtimes-canary: a test that passes', () => {});

after(() => {
  throw new Error('runtimes-canary: this after() hook fails on purpose');
});
