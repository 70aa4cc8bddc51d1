// The MCP server (src/mcp/) through the official SDK's client over stdio,
// against a real daemon: list the tools, call each, a failing command, bad
// arguments; the session's sandboxes die with it.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { BIN, startDaemon } from './daemon.mjs';
import { MCP_TOOLS } from '../dist/mcp.js';
import { Sandbox } from '../dist/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const PKG = path.resolve(here, '..');
const ENTRY = path.join(PKG, 'dist', 'cli-mcp.js');

let daemon;
let client;

async function connect(command, args, env = {}) {
  const c = new Client({ name: 'tupper-test', version: '0.0.0' });
  const t = new StdioClientTransport({ command, args, stderr: 'pipe', env: { PATH: process.env.PATH, ...env } });
  await c.connect(t);
  return c;
}

function json(r) {
  assert.equal(r.content[0].type, 'text');
  return JSON.parse(r.content[0].text);
}

async function call(name, args, c = client) {
  return c.callTool({ name, arguments: args });
}

async function boxes() {
  return (await Sandbox.list({ socket: daemon.socket }).nextItems()).map((s) => s.sandboxId);
}

async function until(what, fn) {
  const deadline = Date.now() + 15_000;
  while (!(await fn())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

before(async () => {
  daemon = await startDaemon();
  client = await connect(process.execPath, [ENTRY, '--socket', daemon.socket]);
});

after(async () => {
  try {
    await client?.close();
    await until('the session ends and its sandboxes go', async () => (await boxes()).length === 0);
  } finally {
    if (daemon) assert.equal((await daemon.stop()).code, 0);
  }
});

test('the tools are listed with descriptions and input schemas', async () => {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), [...MCP_TOOLS].sort());
  for (const t of tools) {
    assert.ok(t.description && t.description.length > 20, `${t.name} has a description`);
    assert.equal(t.inputSchema.type, 'object');
  }
  const run = tools.find((t) => t.name === 'run_command');
  assert.deepEqual([...run.inputSchema.required].sort(), ['cmd', 'sandboxId']);
  assert.equal(run.inputSchema.properties.timeoutMs.type, 'integer');
});

test('create, run, write, read, list, kill', async () => {
  const created = await call('sandbox_create', { image: 'default', metadata: { via: 'mcp' }, timeoutMs: 120000 });
  assert.ok(!created.isError, created.content[0].text);
  const { sandboxId } = json(created);
  assert.deepEqual(created.structuredContent.sandboxId, sandboxId);
  assert.ok((await boxes()).includes(sandboxId));

  const listed = json(await call('sandbox_list', {}));
  assert.deepEqual(listed.sandboxes.map((s) => [s.sandboxId, s.metadata.via]), [[sandboxId, 'mcp']]);

  const r = await call('run_command', { sandboxId, cmd: 'echo hi; echo there >&2; pwd', cwd: '/tmp', envs: { X: '1' } });
  assert.ok(!r.isError);
  assert.deepEqual(json(r), { exitCode: 0, stdout: 'hi\n/tmp\n', stderr: 'there\n' });

  const s = await call('run_command', { sandboxId, cmd: 'tr a-z A-Z', stdin: 'shout\n' });
  assert.equal(json(s).stdout, 'SHOUT\n');

  // as the sandbox's default account, `user`: relative paths from its home
  const w = await call('write_file', { sandboxId, path: 'work/notes/a.txt', content: 'héllo\n' });
  assert.ok(!w.isError, w.content[0].text);
  assert.deepEqual(json(w), { path: 'work/notes/a.txt', size: 7 });
  const rd = await call('read_file', { sandboxId, path: '/home/user/work/notes/a.txt' });
  assert.equal(rd.content[0].text, 'héllo\n');
  const who = await call('run_command', { sandboxId, cmd: 'id -un; pwd; stat -c %u work/notes/a.txt' });
  assert.equal(json(who).stdout, 'user\n/home/user\n1000\n');
  const denied = await call('write_file', { sandboxId, path: '/etc/x', content: 'no' });
  assert.equal(denied.isError, true);
  assert.match(denied.content[0].text, /PermissionError.*Permission denied|Permission denied/);
  const asRoot = await call('write_file', { sandboxId, path: '/etc/x', content: 'ok', user: 'root' });
  assert.ok(!asRoot.isError, asRoot.content[0].text);
  assert.equal(json(await call('run_command', { sandboxId, cmd: 'id -u; pwd', user: 'root' })).stdout, '0\n/root\n');

  const bytes = Buffer.from([0, 255, 1, 254, 10, 13]);
  await call('write_file', { sandboxId, path: 'work/bin', content: bytes.toString('base64'), encoding: 'base64' });
  const rb = json(await call('read_file', { sandboxId, path: 'work/bin', encoding: 'base64' }));
  assert.ok(Buffer.from(rb.content, 'base64').equals(bytes));
  const notText = await call('read_file', { sandboxId, path: 'work/bin' });
  assert.equal(notText.isError, true);
  assert.match(notText.content[0].text, /not valid UTF-8.*base64/);

  const ls = json(await call('list_files', { sandboxId, path: 'work' }));
  assert.deepEqual(ls.entries.map((e) => [e.name, e.type]), [['bin', 'file'], ['notes', 'dir']]);

  const k = await call('sandbox_kill', { sandboxId });
  assert.deepEqual(json(k), { sandboxId, killed: true });
  assert.ok(!(await boxes()).includes(sandboxId));
  const again = await call('run_command', { sandboxId, cmd: 'true' });
  assert.equal(again.isError, true);
  assert.match(again.content[0].text, /no sandbox .* in this session/);
});

test('a failing command is a tool error carrying its output and exit code', async () => {
  const { sandboxId } = json(await call('sandbox_create', {}));
  const r = await call('run_command', { sandboxId, cmd: 'echo partial; echo oops >&2; exit 3' });
  assert.equal(r.isError, true);
  assert.match(r.content[0].text, /exit status 3/);
  assert.deepEqual(r.structuredContent, { exitCode: 3, stdout: 'partial\n', stderr: 'oops\n', error: 'exit status 3' });
  const t = await call('run_command', { sandboxId, cmd: 'echo before; sleep 30', timeoutMs: 300 });
  assert.equal(t.isError, true);
  assert.equal(t.structuredContent.timedOut, true);
  assert.equal(t.structuredContent.stdout, 'before\n');
  // a command that floods its output is killed, not held without bound
  const f = await call('run_command', { sandboxId, cmd: 'yes' });
  assert.equal(f.isError, true);
  assert.ok(f.structuredContent, f.content[0].text.slice(0, 300));
  assert.match(f.structuredContent.error, /killed: it wrote more than \d+ characters/);
  assert.equal(f.structuredContent.truncated, true);
  assert.ok(f.structuredContent.stdout.length < 200_000);
  const noImage = await call('sandbox_create', { image: '/not a reference/' });
  assert.equal(noImage.isError, true);
  assert.match(noImage.content[0].text, /image|reference/i);
  const missing = await call('read_file', { sandboxId, path: '/no/such/file' });
  assert.equal(missing.isError, true);
  assert.match(missing.content[0].text, /NotFoundError.*ENOENT/);
  await call('sandbox_kill', { sandboxId });
});

test('bad arguments are tool errors, and the server lives on', async () => {
  const a = await call('run_command', { sandboxId: 'x', cmd: 'true', timeoutMs: -1 });
  assert.equal(a.isError, true);
  assert.match(a.content[0].text, /timeoutMs/);
  const b = await call('run_command', { cmd: 'true' });
  assert.equal(b.isError, true);
  assert.match(b.content[0].text, /sandboxId/);
  const c = await call('write_file', { sandboxId: 'x', path: 'a\0b', content: '' });
  assert.equal(c.isError, true);
  const d = await call('sandbox_kill', { sandboxId: 'not-mine' });
  assert.equal(d.isError, true);
  assert.match(d.content[0].text, /no sandbox not-mine in this session/);
  const e = await call('write_file', { sandboxId: 'x', path: '/a', content: '!!', encoding: 'base64' });
  assert.equal(e.isError, true);
  const u = await call('no_such_tool', {});
  assert.equal(u.isError, true);
  assert.match(u.content[0].text, /no_such_tool/);
  // still serving
  assert.equal((await client.listTools()).tools.length, MCP_TOOLS.length);
});

test('`tupper mcp` serves the same, and its sandboxes die when the session ends', async () => {
  const c = await connect(BIN, ['--socket', daemon.socket, 'mcp'], { TUPPER_SDK_JS: PKG });
  const { sandboxId } = json(await call('sandbox_create', { timeoutMs: 0 }, c));
  assert.equal(json(await call('run_command', { sandboxId, cmd: 'echo via-cli' }, c)).stdout, 'via-cli\n');
  assert.ok((await boxes()).includes(sandboxId));
  await c.close();
  await until('the closed session kills its sandbox', async () => !(await boxes()).includes(sandboxId));
});

test('a session killed outright (SIGKILL) still takes its sandboxes along', async () => {
  const t = new StdioClientTransport({ command: process.execPath, args: [ENTRY, '--socket', daemon.socket], stderr: 'pipe' });
  const c = new Client({ name: 'tupper-test', version: '0.0.0' });
  await c.connect(t);
  const { sandboxId } = json(await call('sandbox_create', { timeoutMs: 0 }, c));
  assert.ok((await boxes()).includes(sandboxId));
  process.kill(t.pid, 'SIGKILL');
  await until('the daemon kills the sandbox of a vanished session', async () => !(await boxes()).includes(sandboxId));
  await c.close();
});
