// Stream a command's output as it is written, stdout and stderr apart.
import { Sandbox } from '../dist/index.js';

const sbx = await Sandbox.create({ timeoutMs: 60_000 });
try {
  const started = Date.now();
  const result = await sbx.commands.run('for i in 1 2 3; do echo "tick $i"; echo "warn $i" >&2; sleep 0.3; done', {
    onStdout: (data) => process.stdout.write(`[${Date.now() - started} ms] out: ${data}`),
    onStderr: (data) => process.stdout.write(`[${Date.now() - started} ms] err: ${data}`),
  });
  console.log('exit code', result.exitCode);
} finally {
  await sbx.kill();
}
