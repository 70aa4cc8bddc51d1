// Type-checked only (npm test runs tsc --noEmit on it): E2B-style code must
// compile against the SDK's typings unchanged but for the import.
import Sandbox, { CommandExitError, type CommandResult, type CommandHandle, type EntryInfo, type SandboxInfo } from '../src/index';
import { ALL_TRAFFIC, FileNotFoundError, RateLimitError, SandboxNotFoundError, type SandboxMetrics } from '../src/index';

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

// E2B's examples of its network, lifecycle and host options, and the fields
// its code reads (issue 15's drop-in list)
export async function e2bParity(): Promise<void> {
  const sbx = await Sandbox.create({
    allowInternetAccess: false,
    secure: true,
    lifecycle: { onTimeout: 'kill' },
    network: { allowOut: ['api.example.com', '1.1.1.1', '8.8.8.0/24'], denyOut: [ALL_TRAFFIC] },
  });
  await Sandbox.create({ network: { allowOut: ['pypi.org'], denyOut: ({ allTraffic }) => [allTraffic] } });
  // @ts-expect-error an option E2B's SDK does not have is a type error
  await Sandbox.create({ timeOutMs: 1 });
  const url: string = `https://${sbx.getHost(3000)}`;
  await sbx.updateNetwork({ allowOut: ['example.com'], denyOut: [ALL_TRAFFIC] });
  const [m]: SandboxMetrics[] = await sbx.getMetrics();
  const nums: number[] = [m.cpuUsedPct, m.cpuCount, m.memUsed, m.memTotal, m.diskUsed, m.diskTotal];
  const e: EntryInfo = await sbx.files.getInfo('/etc/passwd');
  const names: string[] = [e.owner, e.group, e.path, e.permissions, e.symlinkTarget ?? ''];
  await sbx.files.writeFiles([{ path: 'a', data: 'b' }]);
  const again: Sandbox = await sbx.connect({ timeoutMs: 60_000 });
  const pty: CommandHandle = await sbx.pty.connect(1, { onData: (d: Uint8Array) => void d });
  const page = Sandbox.list({ query: { state: ['running'], template: 'default' }, order: 'asc', limit: 10 });
  const running: boolean = await again.isRunning();
  try {
    await Sandbox.connect('gone');
  } catch (err) {
    if (err instanceof SandboxNotFoundError || err instanceof FileNotFoundError || err instanceof RateLimitError) console.log(err.message);
  }
  console.log(url, nums, names, pty.pid, page.hasNext, running);
}
