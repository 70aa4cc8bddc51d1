// Files: write (text, bytes, a stream), read back, list, watch a directory.
import { Sandbox, FilesystemEventType } from '../dist/index.js';

const sbx = await Sandbox.create({ timeoutMs: 60_000 });
try {
  await sbx.files.makeDir('/tmp/project');
  const events = [];
  const watcher = await sbx.files.watchDir('/tmp/project', (e) => events.push(`${e.type} ${e.name}`), { recursive: true });

  await sbx.files.write('/tmp/project/src/hello.txt', 'Hello from the host\n');
  await sbx.files.write([
    { path: '/tmp/project/data.bin', data: new Uint8Array([0, 1, 2, 255]) },
    { path: '/tmp/project/notes.md', data: '# notes\n' },
  ]);
  // a large file moves as a stream, 1 MiB at a time
  let left = 8;
  const stream = new ReadableStream({
    pull(ctrl) {
      if (left-- === 0) return ctrl.close();
      ctrl.enqueue(new Uint8Array(1024 * 1024).fill(120));
    },
  });
  await sbx.files.write('/tmp/project/big.bin', stream);

  console.log(await sbx.files.read('/tmp/project/src/hello.txt'));
  console.log('bytes:', [...(await sbx.files.read('/tmp/project/data.bin', { format: 'bytes' }))]);
  let total = 0;
  for await (const chunk of await sbx.files.read('/tmp/project/big.bin', { format: 'stream' })) total += chunk.length;
  console.log('streamed back', total, 'bytes');
  for (const e of await sbx.files.list('/tmp/project')) console.log(e.permissions, e.size, e.name);

  await sbx.commands.run('echo more >> /tmp/project/src/hello.txt');
  // events arrive asynchronously: wait until the last one shows
  while (!events.includes(`${FilesystemEventType.WRITE} src/hello.txt`)) await new Promise((r) => setTimeout(r, 20));
  await watcher.stop();
  console.log('events:', events.join(', '));
} finally {
  await sbx.kill();
}
