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

// Every commands, files and pty call takes E2B's options and refuses, as a
// type error, one it does not know (issue 15: never silently dropped)
export async function e2bCallOptions(sbx: Sandbox): Promise<void> {
  const req = { requestTimeoutMs: 1000, signal: new AbortController().signal };
  const h = await sbx.commands.run('cat', { background: true, stdin: true, ...req });
  await sbx.commands.connect(h.pid, { onStdout: () => {}, timeoutMs: 0, ...req });
  await sbx.commands.list(req);
  await sbx.commands.sendStdin(h.pid, 'x', req);
  if (sbx.commands.supportsStdinClose) await sbx.commands.closeStdin(h.pid, req);
  await h.sendStdin('x', req);
  await h.closeStdin(req);
  await sbx.commands.kill(h.pid, req);
  await sbx.files.read('/a', { format: 'bytes', gzip: true, streamIdleTimeoutMs: 1000, ...req });
  await sbx.files.write('/a', 'b', { useOctetStream: true, gzip: true, ...req });
  await sbx.files.writeFiles([{ path: '/a', data: 'b' }], req);
  await sbx.files.list('/', { depth: 2, ...req });
  await sbx.files.watchDir('/', (e) => void e.entry?.size, { includeEntry: true, allowNetworkMounts: true, recursive: true, ...req });
  await sbx.pty.resize(h.pid, { cols: 80, rows: 24 }, req);
  await sbx.pty.sendInput(h.pid, new Uint8Array([13]), req);
  await sbx.pty.kill(h.pid, req);
  // @ts-expect-error unknown option of commands.run
  await sbx.commands.run('ls', { cwdd: '/' });
  // @ts-expect-error unknown option of commands.connect
  await sbx.commands.connect(1, { onStdot: () => {} });
  // @ts-expect-error unknown option of commands.list
  await sbx.commands.list({ all: true });
  // @ts-expect-error unknown option of commands.kill
  await sbx.commands.kill(1, { signal9: true });
  // @ts-expect-error unknown option of commands.sendStdin
  await sbx.commands.sendStdin(1, 'x', { eof: true });
  // @ts-expect-error unknown option of commands.closeStdin
  await sbx.commands.closeStdin(1, { force: true });
  // @ts-expect-error unknown option of CommandHandle.sendStdin
  await h.sendStdin('x', { eof: true });
  // @ts-expect-error CommandHandle.wait takes no options
  await h.wait({ timeoutMs: 1 });
  // @ts-expect-error unknown option of files.read
  await sbx.files.read('/a', { fromat: 'bytes' });
  // @ts-expect-error unknown option of files.write
  await sbx.files.write('/a', 'b', { mod: 0o600 });
  // @ts-expect-error E2B's per-file metadata: tupper refuses it
  await sbx.files.write('/a', 'b', { metadata: { a: 'b' } });
  // @ts-expect-error unknown option of files.writeFiles
  await sbx.files.writeFiles([{ path: '/a', data: 'b' }], { users: 'root' });
  // @ts-expect-error unknown option of files.list
  await sbx.files.list('/', { dpeth: 2 });
  // @ts-expect-error unknown option of files.exists
  await sbx.files.exists('/', { follow: true });
  // @ts-expect-error unknown option of files.getInfo
  await sbx.files.getInfo('/', { follow: true });
  // @ts-expect-error unknown option of files.remove
  await sbx.files.remove('/a', { recursive: false });
  // @ts-expect-error unknown option of files.rename
  await sbx.files.rename('/a', '/b', { overwrite: true });
  // @ts-expect-error unknown option of files.makeDir
  await sbx.files.makeDir('/a', { parents: false });
  // @ts-expect-error unknown option of files.watchDir
  await sbx.files.watchDir('/', () => {}, { recursiv: true });
  // @ts-expect-error unknown option of files.append
  await sbx.files.append('/a', 'b', { mode: 0o600 });
  // @ts-expect-error unknown option of files.copy
  await sbx.files.copy('/a', '/b', { overwite: false });
  // @ts-expect-error unknown option of pty.create
  await sbx.pty.create({ cols: 80, rows: 24, onData: () => {}, term: 'xterm' });
  // @ts-expect-error unknown option of pty.connect
  await sbx.pty.connect(1, { onDta: () => {} });
  // @ts-expect-error unknown option of pty.resize
  await sbx.pty.resize(1, { cols: 80, rows: 24 }, { force: true });
  // @ts-expect-error unknown option of pty.sendInput
  await sbx.pty.sendInput(1, 'x', { raw: true });
  // @ts-expect-error unknown option of pty.kill
  await sbx.pty.kill(1, { signal9: true });
}
