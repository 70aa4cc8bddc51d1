// Run code in a sandbox and get its result: E2B's first example.
// Usage (a daemon running, or TUPPER_SOCKET set): node examples/run-code.mjs
import { Sandbox, CommandExitError } from '../dist/index.js';

const sbx = await Sandbox.create({ timeoutMs: 60_000 });
try {
  const script = `
n=10; a=0; b=1; i=0
while [ $i -lt $n ]; do echo -n "$a "; t=$((a+b)); a=$b; b=$t; i=$((i+1)); done
echo`;
  await sbx.files.write('/tmp/fib.sh', script);
  const result = await sbx.commands.run('sh /tmp/fib.sh');
  console.log('fibonacci:', result.stdout.trim());

  try {
    await sbx.commands.run('echo about to fail >&2; exit 3');
  } catch (e) {
    if (!(e instanceof CommandExitError)) throw e;
    console.log(`failed as expected: exit ${e.exitCode}, stderr ${JSON.stringify(e.stderr)}`);
  }
} finally {
  await sbx.kill();
}
