// A background process: start it, leave, come back from a new client,
// reattach to its output, talk to its stdin, kill it with its whole tree.
import { Sandbox } from '../dist/index.js';

const sbx = await Sandbox.create({ timeoutMs: 60_000 });
try {
  const server = await sbx.commands.run('echo "server up"; while read line; do echo "got: $line"; done', {
    background: true,
    stdin: true,
  });
  while (!server.stdout.includes('server up')) await new Promise((r) => setTimeout(r, 10));
  await server.disconnect(); // this client stops listening; the process runs on

  // later, possibly from another program: connect to the sandbox, then the process
  const again = await Sandbox.connect(sbx.sandboxId);
  console.log('running:', (await again.commands.list()).map((p) => `${p.pid} ${p.args.join(' ')}`));
  const handle = await again.commands.connect(server.pid, { onStdout: (d) => process.stdout.write(`> ${d}`) });
  await again.commands.sendStdin(server.pid, 'hello\n');
  while (!handle.stdout.includes('got: hello')) await new Promise((r) => setTimeout(r, 10));
  console.log('killed:', await again.commands.kill(server.pid));
  await handle.wait().catch((e) => console.log('it ended:', e.message));
} finally {
  await sbx.kill();
}
