// Type-checked only (npm test runs tsc --noEmit on it): E2B-style code must
// compile against the SDK's typings unchanged but for the import.
import Sandbox, { CommandExitError, type CommandResult, type CommandHandle, type EntryInfo, type SandboxInfo } from '../src/index';

export async function e2bStyle(): Promise<void> {
  const sbx = await Sandbox.create({ timeoutMs: 60_000, metadata: { a: 'b' }, envs: { X: '1' }, apiKey: 'ignored' });
  const viaTemplate = await Sandbox.create('default', { timeoutMs: 10_000 });
  const r: CommandResult = await sbx.commands.run('ls', { cwd: '/', onStdout: (d: string) => void d });
  const h: CommandHandle = await sbx.commands.run('sleep 1', { background: true, stdin: true });
  await h.sendStdin('x');
  const done: CommandResult = await h.wait();
  const killed: boolean = await h.kill();
  try {
    await sbx.commands.run('exit 1');
  } catch (e) {
    if (e instanceof CommandExitError) console.log(e.exitCode, e.stderr, r.stdout, done.exitCode, killed);
  }
  const text: string = await sbx.files.read('/etc/hostname');
  const bytes: Uint8Array = await sbx.files.read('/etc/hostname', { format: 'bytes' });
  await sbx.files.write('/tmp/x', text);
  await sbx.files.write([{ path: '/tmp/y', data: bytes }]);
  const entries: EntryInfo[] = await sbx.files.list('/');
  const made: boolean = await sbx.files.makeDir('/tmp/d');
  const paginator = Sandbox.list({ query: { metadata: { a: 'b' } } });
  while (paginator.hasNext) {
    const items: SandboxInfo[] = await paginator.nextItems();
    console.log(items.map((i) => i.sandboxId), entries.length, made);
  }
  const gone: boolean = await Sandbox.kill(viaTemplate.sandboxId);
  await sbx.setTimeout(30_000);
  console.log(gone, (await sbx.getInfo()).endAt, await sbx.isRunning());
  await sbx.kill();
}
