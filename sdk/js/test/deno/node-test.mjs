// node:test for the suite's files under `deno test` (import-map.json maps
// their 'node:test' here; sdk/js/test/runtimes.sh passes it).  Deno's
// node:test (2.9) runs a file's top-level after() hooks but ignores what
// they throw, and those hooks are where every file checks that its daemon
// stopped cleanly (exit 0 on SIGTERM, its boxes destroyed).  Here such an
// error is printed and thrown again outside the hook, as an uncaught
// error, which `deno test` reports as a failure of the file.  Everything
// else is Deno's own node:test (the default export too: its test.after is
// Deno's, which no file uses; after() inside a describe() Deno reports).
import { after as denoAfter } from 'node:test';

export * from 'node:test';
export { default } from 'node:test';

export function after(fn, options) {
  return denoAfter(async (...args) => {
    try {
      await fn(...args);
    } catch (e) {
      console.error('an after() hook failed:', e);
      queueMicrotask(() => { throw e; });
    }
  }, options);
}
