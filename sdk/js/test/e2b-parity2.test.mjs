// E2B's API beside ours, member by member, and its option and error
// behaviour against a real daemon: the package index's runtime exports,
// the public members of Commands, Filesystem, Pty, CommandHandle,
// CommandExitError, WatchHandle, SandboxPaginator and of the option and
// result types (read from both packages' typings with the TypeScript
// compiler), each difference listed here with its reason; then every
// commands, files and pty call refusing an option it does not know,
// E2B's request options taken, and E2B's messages where code matches on them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startDaemon, withSandbox } from './daemon.mjs';
import * as ours from '../dist/index.js';

const {
  Sandbox, AbortError, CommandExitError, FileNotFoundError, InvalidArgumentError, NotFoundError, RateLimitError,
  SandboxError, ServiceBusyError, TimeoutError, FileType, FilesystemEventType,
} = ours;
const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'package.json'));

// E2B's runtime exports tupper has not, and why (README, "E2B options").
const EXPORTS_LEFT_OUT = {
  ApiClient: "E2B's HTTP API client: there is no API server, the daemon's socket is the transport",
  ConnectionConfig: "E2B's API/envd connection settings: tupper's are the socket and requestTimeoutMs",
  E2B: "E2B's client object of its API (sandboxes, templates, volumes, secrets through one key)",
  getSignature: 'signed file URLs of envd: no URLs, files go through files.read/write',
  Git: 'E2B deprecates its git module (run git with commands.run), tupper has none',
  GitAuthError: 'of the git module',
  GitUpstreamError: 'of the git module',
  Secret: 'no secret store',
  SecretError: 'no secret store',
  SecretNotFoundError: 'no secret store',
  SecretPaginator: 'no secret store',
  TemplateBase: "the base class of E2B's Template; tupper's Template is one class",
  LogEntryStart: "E2B's build-log markers: Template.build's onBuildLogs gets LogEntry lines",
  LogEntryEnd: "E2B's build-log markers: Template.build's onBuildLogs gets LogEntry lines",
  defaultBuildLogger: "E2B's console logger of a build: pass onBuildLogs: (l) => console.log(l.toString())",
};
// left out for now, coming with tupper's volumes: present or not, both pass
const EXPORTS_PENDING = new Set(['Volume', 'VolumeError', 'VolumeFileType', 'VolumeNotFoundError', 'VolumePathNotFoundError']);

test("the package index exports every runtime name of E2B's, but those left out with a reason", () => {
  // both as CommonJS, as both packages' main is
  const e2b = require('e2b');
  const mine = require('./dist/index.js');
  const missing = Object.keys(e2b).filter((k) => !(k in mine) && !EXPORTS_PENDING.has(k));
  assert.deepEqual(missing.sort(), Object.keys(EXPORTS_LEFT_OUT).sort());
  // nothing left out that is there after all: the list stays true
  for (const k of Object.keys(EXPORTS_LEFT_OUT)) assert.equal(k in mine, false, `${k} is exported now: take it off the list`);
  assert.equal(mine.default, mine.Sandbox);
  assert.equal(e2b.default, e2b.Sandbox);
  // what both export is of the same kind (a class is a class, a constant a constant)
  for (const k of Object.keys(e2b).filter((n) => n in mine)) assert.equal(typeof mine[k], typeof e2b[k], k);
});

// Each shape: how to name it in either package, and what of E2B's public
// members ours lacks on purpose (name -> why).  Ours may have more.
const SHAPES = {
  Commands: ['Commands', {}],
  Filesystem: ['Filesystem', {}],
  Pty: ['Pty', {}],
  CommandHandle: ['CommandHandle', {}],
  CommandExitError: ['CommandExitError', {}],
  WatchHandle: ['WatchHandle', {}],
  SandboxPaginator: ['SandboxPaginator', {}],
  CommandResult: ['CommandResult', {}],
  EntryInfo: ['EntryInfo', {}],
  WriteInfo: ['WriteInfo', {}],
  FilesystemEvent: ['FilesystemEvent', {}],
  ProcessInfo: ['ProcessInfo', {}],
  CommandStartOpts: ['CommandStartOpts', {}],
  CommandConnectOpts: ['CommandConnectOpts', {}],
  CommandRequestOpts: ['CommandRequestOpts', {}],
  FilesystemReadOpts: ['FilesystemReadOpts', {}],
  FilesystemWriteOpts: ['FilesystemWriteOpts', { metadata: "refused: tupper keeps no per-file metadata (E2B's user.e2b.* xattrs)" }],
  FilesystemListOpts: ["NonNullable<Parameters<X.Filesystem['list']>[1]>", {}],
  FilesystemRequestOpts: ["NonNullable<Parameters<X.Filesystem['makeDir']>[1]>", {}],
  WatchOpts: ["NonNullable<Parameters<X.Filesystem['watchDir']>[2]>", {}],
  PtyCreateOpts: ["Parameters<X.Pty['create']>[0]", {}],
  PtyConnectOpts: ["NonNullable<Parameters<X.Pty['connect']>[1]>", {}],
  PtyRequestOpts: ["NonNullable<Parameters<X.Pty['kill']>[1]>", {}],
  PtySize: ["Parameters<X.Pty['resize']>[1]", {}],
  CommandHandleRequestOpts: ["NonNullable<Parameters<X.CommandHandle['sendStdin']>[1]>", {}],
  SandboxListOpts: ['SandboxListOpts', {}],
  SandboxConnectOpts: ['SandboxConnectOpts', {}],
};

/** The public members of every shape in both packages' typings: { E_name: [...], T_name: [...] }, and which are methods. */
function publicMembers() {
  const ts = require('typescript');
  let src = '';
  for (const [side, mod] of [['E', 'e2b'], ['T', path.join(here, '..', 'dist', 'index')]]) {
    src += `import type * as ${side} from ${JSON.stringify(mod)};\n`;
    for (const [k, [v]] of Object.entries(SHAPES)) {
      src += `export type ${side}_${k} = ${v.includes('X.') ? v.replaceAll('X.', `${side}.`) : `${side}.${v}`};\n`;
    }
  }
  const file = path.join(here, 'api-probe.generated.ts');
  const host = ts.createCompilerHost({});
  const getSourceFile = host.getSourceFile.bind(host);
  const fileExists = host.fileExists.bind(host);
  host.getSourceFile = (f, l) => (path.resolve(f) === file ? ts.createSourceFile(f, src, l) : getSourceFile(f, l));
  host.fileExists = (f) => path.resolve(f) === file || fileExists(f);
  const options = {
    strict: true, skipLibCheck: true, noEmit: true, types: ['node'],
    module: ts.ModuleKind.CommonJS, moduleResolution: ts.ModuleResolutionKind.Node10, target: ts.ScriptTarget.ES2022,
  };
  const prog = ts.createProgram([file], options, host);
  const sf = prog.getSourceFile(file);
  const diags = ts.getPreEmitDiagnostics(prog, sf).map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
  assert.deepEqual(diags, [], 'the probe of both typings compiles');
  const checker = prog.getTypeChecker();
  const out = {};
  const methods = {};
  for (const st of sf.statements) {
    if (!ts.isTypeAliasDeclaration(st)) continue;
    const props = checker.getPropertiesOfType(checker.getTypeAtLocation(st.name)).filter(
      (p) => !(p.declarations ?? []).some((d) => ts.getCombinedModifierFlags(d) & (ts.ModifierFlags.Private | ts.ModifierFlags.Protected)),
    );
    out[st.name.text] = props.map((p) => p.name);
    methods[st.name.text] = props.filter((p) => p.flags & (ts.SymbolFlags.Method | ts.SymbolFlags.GetAccessor)).map((p) => p.name);
  }
  return { members: out, methods };
}

test("every public member of E2B's classes, options and results is ours too, but those left out with a reason", () => {
  const { members, methods } = publicMembers();
  for (const [k, [, leftOut]] of Object.entries(SHAPES)) {
    const e = members[`E_${k}`];
    const t = members[`T_${k}`];
    assert.ok(e.length > 0, `${k}: E2B's typings name members`);
    const missing = e.filter((n) => !t.includes(n));
    assert.deepEqual(missing.sort(), Object.keys(leftOut).sort(), `${k}: E2B's members ours lacks`);
  }
  // and the classes have them at run time, not only in their typings
  for (const c of ['Commands', 'Filesystem', 'Pty', 'CommandHandle', 'CommandExitError', 'WatchHandle', 'SandboxPaginator']) {
    for (const m of methods[`E_${c}`]) assert.ok(m in ours[c].prototype, `${c}.prototype.${m}`);
  }
});

test("E2B's error classes: names, ancestry, statusCode", () => {
  assert.equal(new RateLimitError('x').statusCode, 429);
  assert.equal(new ServiceBusyError('x').statusCode, 503);
  assert.equal(new SandboxError('x').statusCode, undefined);
  for (const n of ['AuthenticationError', 'ServiceBusyError', 'TemplateError', 'BuildError', 'FileUploadError']) {
    const e = new ours[n]('m');
    assert.equal(e.name, n);
    assert.equal(e.message, 'm');
    assert.ok(e instanceof SandboxError);
  }
  assert.ok(new ours.FileUploadError('m') instanceof ours.BuildError);
  // E2B's CommandExitError: its message is the result's error
  const e = new CommandExitError({ exitCode: 3, stdout: 'o', stderr: 'e', error: 'exit status 3' });
  assert.deepEqual([e.message, e.name, e.exitCode, e.error, e.stdout, e.stderr], ['exit status 3', 'CommandExitError', 3, 'exit status 3', 'o', 'e']);
});

let sbx;
let daemon;
withSandbox(Sandbox, (d, s) => {
  daemon = d;
  sbx = s;
});

/** Rejects (or throws) InvalidArgumentError naming the bad key and, among the known ones, `known`. */
async function refuses(what, fn, known) {
  await assert.rejects(
    (async () => fn())(),
    (e) => {
      assert.ok(e instanceof InvalidArgumentError, `${what}: ${e}`);
      assert.match(e.message, new RegExp(`^${what.replace('.', '\\.')}: unknown option 'bogus' \\(known: [^)]*\\b${known}\\b`), what);
      return true;
    },
  );
}

test('every commands, files and pty call refuses an option it does not know, naming it and the known ones, and does nothing', async () => {
  const bad = { bogus: 1 };
  const h = await sbx.commands.run('cat', { background: true, stdin: true, timeoutMs: 30_000 });
  try {
    await refuses('commands.run', () => sbx.commands.run('touch /tmp/ran', { ...bad }), 'cwd');
    await refuses('commands.run', () => sbx.commands.run('touch /tmp/ran', { background: true, ...bad }), 'background');
    await refuses('commands.connect', () => sbx.commands.connect(h.pid, bad), 'onStdout');
    await refuses('commands.list', () => sbx.commands.list(bad), 'requestTimeoutMs');
    await refuses('commands.kill', () => sbx.commands.kill(h.pid, bad), 'signal');
    await refuses('commands.sendStdin', () => sbx.commands.sendStdin(h.pid, 'x', bad), 'requestTimeoutMs');
    await refuses('commands.closeStdin', () => sbx.commands.closeStdin(h.pid, bad), 'requestTimeoutMs');
    await refuses('commands.sendStdin', () => h.sendStdin('x', bad), 'requestTimeoutMs');
    await refuses('commands.closeStdin', () => h.closeStdin(bad), 'requestTimeoutMs');
    for (const m of ['wait', 'kill', 'disconnect']) {
      await assert.rejects(h[m](bad), (e) => e instanceof InvalidArgumentError && e.message === `CommandHandle.${m}: takes no options`);
    }
    await refuses('files.read', () => sbx.files.read('/etc/passwd', bad), 'format');
    await refuses('files.write', () => sbx.files.write('/tmp/w1', 'x', bad), 'mode');
    await refuses('files.write', () => sbx.files.write([{ path: '/tmp/w2', data: 'x' }], bad), 'useOctetStream');
    await refuses('files.writeFiles', () => sbx.files.writeFiles([{ path: '/tmp/w3', data: 'x' }], bad), 'user');
    await refuses('files.append', () => sbx.files.append('/tmp/w4', 'x', bad), 'user');
    await refuses('files.copy', () => sbx.files.copy('/etc/passwd', '/tmp/w5', bad), 'overwrite');
    await refuses('files.list', () => sbx.files.list('/', bad), 'depth');
    await refuses('files.exists', () => sbx.files.exists('/', bad), 'user');
    await refuses('files.getInfo', () => sbx.files.getInfo('/', bad), 'user');
    await refuses('files.remove', () => sbx.files.remove('/etc/passwd', bad), 'user');
    await refuses('files.rename', () => sbx.files.rename('/etc/passwd', '/tmp/w6', bad), 'user');
    await refuses('files.makeDir', () => sbx.files.makeDir('/tmp/w7', bad), 'user');
    await refuses('files.watchDir', () => sbx.files.watchDir('/tmp', () => {}, bad), 'includeEntry');
    const onData = () => {};
    await refuses('pty.create', () => sbx.pty.create({ cols: 80, rows: 24, onData, ...bad }), 'cols');
    await refuses('pty.connect', () => sbx.pty.connect(h.pid, { onData, ...bad }), 'onData');
    await refuses('pty.kill', () => sbx.pty.kill(h.pid, bad), 'requestTimeoutMs');
    await refuses('pty.sendInput', () => sbx.pty.sendInput(h.pid, 'x', bad), 'requestTimeoutMs');
    await refuses('pty.resize', () => sbx.pty.resize(h.pid, { cols: 80, rows: 24 }, bad), 'requestTimeoutMs');
    await refuses('pty.resize', () => sbx.pty.resize(h.pid, { cols: 80, rows: 24, ...bad }), 'cols');
    // an option E2B has and tupper cannot keep says why
    await assert.rejects(sbx.files.write('/tmp/w8', 'x', { metadata: { a: 'b' } }), /^InvalidArgumentError: files\.write: option 'metadata' is not supported: tupper does not keep/);
    // not an object at all
    await assert.rejects(sbx.files.read('/etc/passwd', 'bytes'), /files\.read: options must be an object/);
    // none of it happened: nothing was written, moved, removed or started, cat still runs
    for (const p of ['/tmp/ran', '/tmp/w1', '/tmp/w2', '/tmp/w3', '/tmp/w4', '/tmp/w5', '/tmp/w6', '/tmp/w7', '/tmp/w8']) {
      assert.equal(await sbx.files.exists(p), false, p);
    }
    assert.equal(await sbx.files.exists('/etc/passwd'), true);
    const procs = await sbx.commands.list();
    assert.deepEqual(procs.map((p) => p.pid), [h.pid]);
    // E2B's ProcessInfo: pid, cmd, args, envs (tupper reports none), cwd
    assert.deepEqual(Object.keys(procs[0]).filter((k) => ['pid', 'cmd', 'args', 'envs'].includes(k)).sort(), ['args', 'cmd', 'envs', 'pid']);
    assert.equal(procs[0].cmd, '/bin/sh');
  } finally {
    await h.kill();
  }
});

test("E2B's request options are taken: requestTimeoutMs, signal, gzip, streamIdleTimeoutMs, useOctetStream", async () => {
  const live = new AbortController().signal;
  const req = { requestTimeoutMs: 10_000, signal: live };
  const info = await sbx.files.write('/tmp/req.txt', 'hello', { ...req, useOctetStream: true, gzip: true });
  assert.deepEqual(info, { name: 'req.txt', type: FileType.FILE, path: '/tmp/req.txt' });
  assert.equal(await sbx.files.read('/tmp/req.txt', { ...req, gzip: true, streamIdleTimeoutMs: 1000 }), 'hello');
  assert.equal((await sbx.files.list('/tmp', { ...req, depth: 1 })).some((e) => e.name === 'req.txt'), true);
  assert.equal((await sbx.files.getInfo('/tmp/req.txt', req)).size, 5);
  const r = await sbx.commands.run('echo hi', req);
  assert.equal(r.stdout, 'hi\n');
  assert.ok(Array.isArray(await sbx.commands.list(req)));
  // an already aborted request is not sent: AbortError, nothing written
  const ac = new AbortController();
  ac.abort(new Error('stop'));
  await assert.rejects(sbx.files.write('/tmp/aborted', 'x', { signal: ac.signal }), (e) => e instanceof AbortError && /aborted before the request was sent/.test(e.message));
  await assert.rejects(sbx.files.makeDir('/tmp/aborted-dir', { signal: ac.signal }), AbortError);
  await assert.rejects(sbx.commands.list({ signal: ac.signal }), AbortError);
  await assert.rejects(sbx.pty.create({ cols: 10, rows: 5, onData: () => {}, signal: ac.signal }), AbortError);
  assert.equal(await sbx.files.exists('/tmp/aborted'), false);
  assert.equal(await sbx.files.exists('/tmp/aborted-dir'), false);
  await assert.rejects(sbx.commands.list({ signal: 'yes' }), /commands\.list: signal must be an AbortSignal/);
  await assert.rejects(sbx.files.read('/tmp/req.txt', { streamIdleTimeoutMs: -1 }), /files\.read: bad timeoutMs -1/);
});

test("E2B's stdin example: supportsStdinClose, sendStdin, closeStdin, and the output", async () => {
  assert.equal(sbx.commands.supportsStdinClose, true);
  const h = await sbx.commands.run('cat', { background: true, stdin: true });
  await sbx.commands.sendStdin(h.pid, 'hello\n');
  if (sbx.commands.supportsStdinClose) await sbx.commands.closeStdin(h.pid);
  const r = await h.wait();
  assert.deepEqual([r.exitCode, r.stdout], [0, 'hello\n']);
});

test("watchDir's includeEntry: each event but a removal carries what is at its path", async () => {
  await sbx.files.makeDir('/tmp/inc');
  const events = [];
  const w = await sbx.files.watchDir('/tmp/inc', (e) => { events.push(e); }, { includeEntry: true, timeoutMs: 20_000 });
  try {
    await sbx.files.write('/tmp/inc/a.txt', 'abc');
    await sbx.files.remove('/tmp/inc/a.txt');
    const deadline = Date.now() + 10_000;
    while (!events.some((e) => e.type === FilesystemEventType.REMOVE)) {
      assert.ok(Date.now() < deadline, `no removal; got ${JSON.stringify(events.map((e) => e.type))}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    const created = events.find((e) => e.type === FilesystemEventType.CREATE);
    assert.equal(created.name, 'a.txt');
    // made before the removal came, gone by the time it is asked: either way no wrong entry
    if (created.entry) assert.deepEqual([created.entry.name, created.entry.type, created.entry.path], ['a.txt', FileType.FILE, '/tmp/inc/a.txt']);
    assert.equal(events.find((e) => e.type === FilesystemEventType.REMOVE).entry, undefined);
  } finally {
    await w.stop();
  }
  // one that stays: the entry is there, with its size
  const got = [];
  const w2 = await sbx.files.watchDir('/tmp/inc', (e) => { got.push(e); }, { includeEntry: true, timeoutMs: 20_000 });
  try {
    await sbx.files.write('/tmp/inc/b.txt', 'abcd');
    const deadline = Date.now() + 10_000;
    while (!got.some((e) => e.entry?.size === 4)) {
      assert.ok(Date.now() < deadline, `no entry of size 4; got ${JSON.stringify(got)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    // without includeEntry no event has one
    const plain = [];
    const w3 = await sbx.files.watchDir('/tmp/inc', (e) => { plain.push(e); }, { timeoutMs: 20_000 });
    await sbx.files.write('/tmp/inc/c.txt', 'x');
    const d2 = Date.now() + 10_000;
    while (plain.length === 0) {
      assert.ok(Date.now() < d2, 'no event');
      await new Promise((r) => setTimeout(r, 50));
    }
    await w3.stop();
    assert.ok(plain.every((e) => e.entry === undefined));
  } finally {
    await w2.stop();
  }
});

test("E2B's messages code matches on: exit status, [deadline_exceeded] of timeoutMs, [unavailable] of a gone sandbox, FileNotFoundError", async () => {
  // E2B's documented catch of a failed command
  try {
    await sbx.commands.run('exit 3');
    assert.fail('exit 3 resolved');
  } catch (e) {
    assert.ok(e instanceof CommandExitError);
    assert.deepEqual([e.message, e.exitCode, e.error], ['exit status 3', 3, 'exit status 3']);
  }
  await assert.rejects(sbx.commands.run('sleep 10', { timeoutMs: 300 }), (e) => {
    assert.ok(e instanceof TimeoutError);
    assert.match(e.message, /^\[deadline_exceeded\] /);
    assert.match(e.message, /This error is likely due to exceeding 'timeoutMs'/);
    return true;
  });
  const exited = await new Promise((resolve, reject) => {
    sbx.files.watchDir('/tmp', () => {}, { timeoutMs: 200, onExit: resolve }).catch(reject);
  });
  assert.ok(exited instanceof TimeoutError);
  assert.match(exited.message, /^\[deadline_exceeded\] watch \d+ ran for its timeoutMs \(200 ms\): This error is likely due to exceeding 'timeoutMs'/);
  await assert.rejects(sbx.files.read('/no/such/file'), (e) => e instanceof FileNotFoundError && e instanceof NotFoundError);
  // a sandbox that goes away under a running command: E2B's sandbox-timeout words
  const other = await Sandbox.create({ socket: daemon.socket, timeoutMs: 60_000 });
  try {
    const h = await other.commands.run('sleep 30', { background: true });
    await Sandbox.kill(other.sandboxId, { socket: daemon.socket });
    await assert.rejects(h.wait(), (e) => {
      assert.ok(e instanceof TimeoutError, String(e));
      assert.match(e.message, /^\[unavailable\] sandbox \S+ is gone/);
      assert.match(e.message, /This error is likely due to sandbox timeout/);
      return true;
    });
  } finally {
    await other.kill().catch(() => {});
  }
});

test('a request past requestTimeoutMs: [canceled] and E2B words', async () => {
  // a daemon that never answers: a socket that accepts and says nothing
  const net = await import('node:net');
  const fs = await import('node:fs');
  const sock = path.join(daemon.dir, 'mute.sock');
  const conns = new Set();
  const server = net.createServer((c) => { conns.add(c); c.on('close', () => conns.delete(c)); });
  await new Promise((r) => server.listen(sock, r));
  try {
    await assert.rejects(Sandbox.connect('x', { socket: sock, requestTimeoutMs: 200 }), (e) => {
      assert.ok(e instanceof TimeoutError, String(e));
      assert.match(e.message, /^\[canceled\] .*: This error is likely due to exceeding 'requestTimeoutMs'\./);
      return true;
    });
  } finally {
    for (const c of conns) c.destroy();
    await new Promise((r) => server.close(r));
    fs.rmSync(sock, { force: true });
  }
});
