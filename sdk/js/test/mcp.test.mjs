// The MCP server (src/mcp/) through the official SDK's client over stdio,
// against a real daemon: list the tools, call each, a failing command, bad
// arguments; the session's sandboxes die with it.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import * as crypto from 'node:crypto';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { BIN, startDaemon } from './daemon.mjs';
import { MCP_TOOLS } from '../dist/mcp.js';
import { ERROR_TYPES } from '../dist/http.js';
import { Sandbox } from '../dist/index.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { withConnection } from '../dist/connection.js';

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

// a result's data is its structuredContent, and its one text block the same JSON, once
function json(r) {
  assert.equal(r.content.length, 1);
  assert.equal(r.content[0].type, 'text');
  const v = JSON.parse(r.content[0].text);
  assert.deepEqual(r.structuredContent, v);
  return v;
}

// a failed command's data: one line, then its JSON once
function failed(r) {
  assert.equal(r.isError, true);
  const [line, ...rest] = r.content[0].text.split('\n');
  assert.ok(ERROR_TYPES.includes(line.split(':')[0]), line);
  assert.deepEqual(JSON.parse(rest.join('\n')), r.structuredContent);
  return { line, v: r.structuredContent };
}

// the result of a command that ended: output and status, without the offsets
function ended(v) {
  assert.equal(v.running, false);
  assert.equal(typeof v.pid, 'number');
  const { pid, running, stdoutOffset, stderrOffset, ...rest } = v;
  assert.equal(stdoutOffset, v.stdout.length);
  assert.equal(stderrOffset, v.stderr.length);
  return rest;
}

async function call(name, args, c = client) {
  return c.callTool({ name, arguments: args });
}

async function boxes() {
  return (await Sandbox.list({ socket: daemon.socket }).nextItems()).map((s) => s.sandboxId);
}

// the live processes of a sandbox, without a Sandbox object of our own
async function procs(sandboxId) {
  return withConnection({ socket: daemon.socket }, async (c) => (await c.call('process.list', { sandbox: sandboxId })).processes);
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
  // flat schemas (some providers refuse $ref), hints, and what each returns
  for (const t of tools) assert.ok(!/\$ref|"definitions"/.test(JSON.stringify(t)), `${t.name}'s schemas have no $ref`);
  for (const t of tools) {
    assert.equal(t.inputSchema.additionalProperties, false, `${t.name} refuses unknown arguments`);
    assert.equal(t.outputSchema?.type, 'object', `${t.name} has an outputSchema`);
    assert.equal(typeof t.annotations?.readOnlyHint, 'boolean', `${t.name} has annotations`);
  }
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  assert.equal(byName.read_file.annotations.readOnlyHint, true);
  assert.equal(byName.sandbox_kill.annotations.destructiveHint, true);
  const create = byName.sandbox_create;
  for (const k of ['image', 'recipe', 'limits', 'network', 'cwd', 'envs', 'timeoutMs', 'name']) assert.ok(create.inputSchema.properties[k], `sandbox_create takes ${k}`);
  // the descriptions say what this daemon has: its store is empty here
  assert.match(create.description, /"default".*no other image in its store/);
});

test('volumes: volume_create, sandbox_create with volumeMounts, data kept for the next sandbox, volume_destroy refused while mounted', async () => {
  const v = json(await call('volume_create', { name: 'mcp-vol', size: '16M' }));
  assert.equal(v.name, 'mcp-vol');
  assert.equal(v.size, 16 << 20);
  const bad = await call('volume_create', { name: '../x' });
  assert.equal(bad.isError, true);
  const a = json(await call('sandbox_create', { volumeMounts: { '/mnt/v': 'mcp-vol' } }));
  json(await call('write_file', { sandboxId: a.sandboxId, path: '/mnt/v/note.txt', content: 'from mcp' }));
  const listed = json(await call('volume_list', {})).volumes;
  assert.deepEqual(listed.map((x) => [x.name, x.mountedBy]), [['mcp-vol', [{ sandboxId: a.sandboxId, path: '/mnt/v' }]]]);
  const refused = await call('volume_destroy', { name: 'mcp-vol' });
  assert.equal(refused.isError, true);
  assert.ok(refused.content[0].text.includes(a.sandboxId), refused.content[0].text);
  json(await call('sandbox_kill', { sandboxId: a.sandboxId }));
  const b = json(await call('sandbox_create', { volumeMounts: { '/data': 'mcp-vol' } }));
  assert.equal(json(await call('read_file', { sandboxId: b.sandboxId, path: '/data/note.txt' })).content, 'from mcp');
  json(await call('sandbox_kill', { sandboxId: b.sandboxId }));
  assert.deepEqual(json(await call('volume_destroy', { name: 'mcp-vol' })), { name: 'mcp-vol', destroyed: true });
  assert.deepEqual(json(await call('volume_list', {})).volumes, []);
});

test('unknown arguments are an error, as additionalProperties: false says', async () => {
  const r = await call('sandbox_create', { image: 'default', netwrok: 'all' });
  assert.equal(r.isError, true);
  assert.match(r.content[0].text, /netwrok|Unrecognized key/);
  const l = await call('sandbox_create', { limits: { memory: '64M', swap: '1G' } });
  assert.equal(l.isError, true);
  assert.match(l.content[0].text, /swap|Unrecognized key/);
  assert.equal((await boxes()).length, 0);
});

test('create, run, write, read, list, kill', async () => {
  const created = await call('sandbox_create', { image: 'default', metadata: { via: 'mcp' }, timeoutMs: 120000 });
  assert.ok(!created.isError, created.content[0].text);
  const { sandboxId } = json(created);
  assert.deepEqual(created.structuredContent.sandboxId, sandboxId);
  assert.ok((await boxes()).includes(sandboxId));

  const listed = json(await call('sandbox_list', {}));
  assert.deepEqual(listed.sandboxes.map((s) => [s.sandboxId, s.metadata.via]), [[sandboxId, 'mcp']]);

  assert.equal(created.structuredContent.defaultUser, 'user');
  assert.equal(created.structuredContent.home, '/home/user');
  const r = await call('run_command', { sandboxId, cmd: 'echo hi; echo there >&2; pwd', cwd: '/tmp', envs: { X: '1' } });
  assert.ok(!r.isError);
  assert.deepEqual(ended(json(r)), { exitCode: 0, stdout: 'hi\n/tmp\n', stderr: 'there\n' });

  const s = await call('run_command', { sandboxId, cmd: 'tr a-z A-Z', stdin: 'shout\n' });
  assert.equal(json(s).stdout, 'SHOUT\n');
  const sb = await call('run_command', { sandboxId, cmd: 'od -An -tx1', stdinBase64: Buffer.from([0, 255, 10]).toString('base64') });
  assert.equal(json(sb).stdout.trim(), '00 ff 0a');

  // as the sandbox's default account, `user`: relative paths from its home
  const w = await call('write_file', { sandboxId, path: 'work/notes/a.txt', content: 'héllo\n' });
  assert.ok(!w.isError, w.content[0].text);
  assert.deepEqual(json(w), { path: 'work/notes/a.txt', size: 7 });
  const rd = await call('read_file', { sandboxId, path: '/home/user/work/notes/a.txt' });
  assert.deepEqual(json(rd), { path: '/home/user/work/notes/a.txt', size: 7, encoding: 'utf8', content: 'héllo\n' });
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
  assert.match(again.content[0].text, /NotFoundError: no sandbox .* in this session/);
});

test('a failing command is a tool error carrying its output and exit code', async () => {
  const { sandboxId } = json(await call('sandbox_create', {}));
  const r = failed(await call('run_command', { sandboxId, cmd: 'echo partial; echo oops >&2; exit 3' }));
  assert.equal(r.line, 'CommandExitError: exit status 3');
  assert.deepEqual(ended(r.v), { exitCode: 3, stdout: 'partial\n', stderr: 'oops\n', error: 'exit status 3' });
  const t = failed(await call('run_command', { sandboxId, cmd: 'echo before; sleep 30', timeoutMs: 300 }));
  assert.match(t.line, /^TimeoutError/);
  assert.equal(t.v.timedOut, true);
  assert.equal(t.v.stdout, 'before\n');
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
  assert.match(d.content[0].text, /NotFoundError: no sandbox not-mine in this session/);
  const p = await call('command_output', { sandboxId: 'x', pid: 1 });
  assert.equal(p.isError, true);
  assert.match(p.content[0].text, /NotFoundError: no sandbox x in this session/);
  const q = await call('sandbox_create', { recipe: './mine.lua' });
  assert.equal(q.isError, true);
  assert.match(q.content[0].text, /recipe/);
  const ir = await call('sandbox_create', { image: 'default', recipe: 'default' });
  assert.equal(ir.isError, true);
  assert.match(ir.content[0].text, /image and recipe/);
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

test('long output is sent once, cut with a marker saying how much more; offsets read on', async () => {
  const { sandboxId } = json(await call('sandbox_create', {}));
  try {
    const r = await call('run_command', { sandboxId, cmd: 'head -c 150000 /dev/zero | tr "\\0" a' });
    const v = json(r);
    assert.equal(v.stdout, 'a'.repeat(100_000) + '\n[truncated, 50000 bytes more]');
    assert.equal(v.truncated, true);
    assert.equal(v.stdoutOffset, 100_000);
    // the data once in the text, compact: not much more than the output itself
    assert.ok(r.content[0].text.length < 100_400, `text is ${r.content[0].text.length} characters`);
    // a multi-byte tail: the marker counts bytes
    const m = json(await call('run_command', { sandboxId, cmd: `head -c 100002 /dev/zero | tr "\\0" a; printf 'ééé'` }));
    assert.match(m.stdout, /\n\[truncated, 8 bytes more\]$/);
    // never half a surrogate pair: the cut comes before the emoji
    const e = json(await call('run_command', { sandboxId, cmd: `head -c 99999 /dev/zero | tr "\\0" a; printf '\\360\\237\\230\\200b'` }));
    assert.equal(e.stdout, 'a'.repeat(99_999) + '\n[truncated, 5 bytes more]');
    assert.equal(e.stdoutOffset, 99_999);
  } finally {
    await call('sandbox_kill', { sandboxId });
  }
});

test('background commands: pid at once, polled and waited for from offsets, killed', async () => {
  const { sandboxId } = json(await call('sandbox_create', {}));
  try {
    const b = json(await call('run_command', { sandboxId, cmd: 'for i in 1 2 3; do echo $i; sleep 0.3; done; echo err >&2; exit 4', background: true }));
    assert.equal(b.running, true);
    assert.equal(b.exitCode, null);
    const w = json(await call('command_output', { sandboxId, pid: b.pid, waitMs: 10_000 }));
    assert.deepEqual(ended(w), { exitCode: 4, stdout: '1\n2\n3\n', stderr: 'err\n', error: 'exit status 4' });
    const from = json(await call('command_output', { sandboxId, pid: b.pid, stdoutOffset: 2, stderrOffset: 4 }));
    assert.equal(from.stdout, '2\n3\n');
    assert.equal(from.stderr, '');
    const unknown = await call('command_output', { sandboxId, pid: 99999 });
    assert.equal(unknown.isError, true);
    assert.match(unknown.content[0].text, /^NotFoundError: no background command 99999/);
    const past = await call('command_output', { sandboxId, pid: b.pid, stdoutOffset: 99 });
    assert.equal(past.isError, true);
    assert.match(past.content[0].text, /offset past the output/);

    const long = json(await call('run_command', { sandboxId, cmd: 'echo started; exec sleep 100', background: true }));
    const poll = json(await call('command_output', { sandboxId, pid: long.pid, waitMs: 300 }));
    assert.equal(poll.running, true);
    const k = json(await call('command_kill', { sandboxId, pid: long.pid }));
    assert.deepEqual(k, { sandboxId, pid: long.pid, killed: true });
    const after = json(await call('command_output', { sandboxId, pid: long.pid }));
    assert.equal(after.running, false);
    assert.equal(after.stdout, 'started\n');
    assert.match(after.error, /signal|killed/);
    assert.deepEqual((await procs(sandboxId)).filter((p) => p.pid === long.pid), []);
  } finally {
    await call('sandbox_kill', { sandboxId });
  }
});

test('a create in the background: a createId at once, sandbox_wait gives the sandbox once made', async () => {
  const slow = { source: 'return recipe "mcp-bg" { setup = function(box) box:run("sleep 3") end }', name: 'mcp-bg.lua' };
  const t0 = Date.now();
  const started = json(await call('sandbox_create', { recipe: slow, background: true }));
  assert.ok(Date.now() - t0 < 2500, 'answered before the setup ended');
  assert.equal(started.state, 'creating');
  assert.match(started.createId, /^create-[0-9a-f]+$/);
  assert.deepEqual(json(await call('sandbox_wait', { createId: started.createId })), { state: 'creating', createId: started.createId });
  const made = json(await call('sandbox_wait', { createId: started.createId, waitMs: 60000 }));
  assert.equal(made.state, 'running');
  assert.ok((await boxes()).includes(made.sandboxId));
  assert.equal(json(await call('run_command', { sandboxId: made.sandboxId, cmd: 'echo ready' })).stdout, 'ready\n');
  // given once
  const again = await call('sandbox_wait', { createId: started.createId });
  assert.equal(again.isError, true);
  assert.match(again.content[0].text, /^NotFoundError/);
  await call('sandbox_kill', { sandboxId: made.sandboxId });
  // a create that fails in the background fails its wait
  const bad = json(await call('sandbox_create', { recipe: { source: 'return recipe "x" { nope = 1 }' }, background: true }));
  const failedWait = await call('sandbox_wait', { createId: bad.createId, waitMs: 30000 });
  assert.equal(failedWait.isError, true);
  assert.match(failedWait.content[0].text, /nope/);
});

test('progress notifications keep a waiting client with a short timeout (resetTimeoutOnProgress)', async () => {
  const { sandboxId } = json(await call('sandbox_create', {}));
  try {
    const cmd = 'sleep 6; echo done';
    // without progress the client's 2 s timeout ends the call, and the command with it
    await assert.rejects(
      client.callTool({ name: 'run_command', arguments: { sandboxId, cmd } }, CallToolResultSchema, { timeout: 2000 }),
      (e) => e.code === -32001 && /timed out/i.test(e.message),
    );
    await until('a cancelled foreground command is killed', async () => (await procs(sandboxId)).length === 0);
    const seen = [];
    const t0 = Date.now();
    const r = await client.callTool({ name: 'run_command', arguments: { sandboxId, cmd } }, CallToolResultSchema, {
      timeout: 2000,
      resetTimeoutOnProgress: true,
      onprogress: (p) => seen.push(p),
    });
    assert.ok(Date.now() - t0 >= 5500);
    assert.equal(json(r).stdout, 'done\n');
    assert.ok(seen.length >= 4, `${seen.length} progress notifications`);
    for (let i = 1; i < seen.length; i++) assert.ok(seen[i].progress > seen[i - 1].progress, 'progress increases');
    assert.match(seen.at(-1).message, /running for \d+ s/);
    // command_output's wait sends them too
    const b = json(await call('run_command', { sandboxId, cmd: 'sleep 4; echo bg', background: true }));
    const w = await client.callTool({ name: 'command_output', arguments: { sandboxId, pid: b.pid, waitMs: 60000 } }, CallToolResultSchema, {
      timeout: 2000,
      resetTimeoutOnProgress: true,
      onprogress: () => {},
    });
    assert.equal(json(w).stdout, 'bg\n');

    // a create that takes long (a recipe's setup) is the same
    let n = 0;
    const slow = { source: 'return recipe "mcp-slow" { setup = function(box) box:run("sleep 5") end }', name: 'mcp-slow.lua' };
    const made = await client.callTool({ name: 'sandbox_create', arguments: { recipe: slow } }, CallToolResultSchema, {
      timeout: 2000,
      resetTimeoutOnProgress: true,
      onprogress: () => n++,
    });
    assert.ok(!made.isError, made.content[0].text);
    assert.ok(n >= 3, `${n} progress notifications`);
    await call('sandbox_kill', { sandboxId: json(made).sandboxId });
  } finally {
    await call('sandbox_kill', { sandboxId });
  }
});

test('sandbox_create takes limits, network rules, cwd and envs; sandbox_port reaches a server inside', async () => {
  const c = await call('sandbox_create', {
    limits: { pids: 64, memory: '256M' },
    network: { allow: ['example.com'] },
    cwd: '/tmp',
    envs: { GREETING: 'hi' },
  });
  const { sandboxId } = json(c);
  try {
    const v = json(await call('run_command', { sandboxId, cmd: 'pwd; echo $GREETING; echo $HTTP_PROXY; cat /sys/fs/cgroup/pids.max 2>/dev/null || echo no-cgroup' }));
    const [pwd, greeting, proxy] = v.stdout.split('\n');
    assert.equal(pwd, '/tmp');
    assert.equal(greeting, 'hi');
    assert.match(proxy, /^http:\/\/127\.0\.0\.1:\d+$/);
    const none = json(await call('sandbox_create', {}));
    assert.equal(json(await call('run_command', { sandboxId: none.sandboxId, cmd: 'echo "[$HTTP_PROXY]"' })).stdout, '[]\n');
    await call('sandbox_kill', { sandboxId: none.sandboxId });

    await call('write_file', { sandboxId, path: '/tmp/www/index.html', content: 'served from the box\n' });
    json(await call('run_command', { sandboxId, cmd: 'httpd -f -p 127.0.0.1:8000 -h /tmp/www', background: true }));
    const p = json(await call('sandbox_port', { sandboxId, port: 8000 }));
    assert.match(p.host, /^127\.0\.0\.1:\d+$/);
    let body;
    await until('the server inside answers', async () => {
      body = await fetch(`http://${p.host}/index.html`).then((r) => r.text(), () => undefined);
      return body !== undefined && body.includes('served');
    });
    assert.equal(body, 'served from the box\n');
    const bad = await call('sandbox_port', { sandboxId, port: 70000 });
    assert.equal(bad.isError, true);
  } finally {
    await call('sandbox_kill', { sandboxId });
  }
});

test('a named sandbox is kept across sessions, found again by name or id', async () => {
  const a = await connect(process.execPath, [ENTRY, '--socket', daemon.socket]);
  let id;
  try {
    const made = json(await call('sandbox_create', { name: 'keep-me', timeoutMs: 120000 }, a));
    id = made.sandboxId;
    assert.equal(made.kept, true);
    await call('write_file', { sandboxId: id, path: 'state', content: 'from session a' }, a);
    const bg = json(await call('run_command', { sandboxId: id, cmd: 'echo early; sleep 8; echo late', background: true }, a));
    const other = json(await call('sandbox_create', {}, a));
    await a.close();
    await until("session a's own sandbox goes", async () => !(await boxes()).includes(other.sandboxId));
    assert.ok((await boxes()).includes(id), 'the named sandbox outlives its session');

    // a session per call, as the MCP Inspector's CLI does
    const b = await connect(process.execPath, [ENTRY, '--socket', daemon.socket]);
    try {
      const again = json(await call('sandbox_create', { name: 'keep-me' }, b));
      assert.equal(again.sandboxId, id);
      assert.equal(again.reused, true);
      assert.ok(json(await call('sandbox_list', {}, b)).sandboxes.some((s) => s.sandboxId === id && s.kept));
    } finally {
      await b.close();
    }
    const c = await connect(process.execPath, [ENTRY, '--socket', daemon.socket]);
    try {
      assert.equal(json(await call('read_file', { sandboxId: id, path: 'state' }, c)).content, 'from session a');
      // a background command session a started runs on, and is attached to
      const w = json(await call('command_output', { sandboxId: id, pid: bg.pid, waitMs: 20000 }, c));
      assert.equal(w.reattached, true);
      assert.equal(w.exitCode, 0);
      assert.equal(w.stdout, 'early\nlate\n');
      assert.deepEqual(json(await call('sandbox_kill', { sandboxId: id }, c)), { sandboxId: id, killed: true });
    } finally {
      await c.close();
    }
    assert.ok(!(await boxes()).includes(id));
  } finally {
    if (id) await Sandbox.kill(id, { socket: daemon.socket }).catch(() => {});
  }
});

// an OCI image layout of one small layer (a file), for image.import
function ociLayout(dir, ref) {
  const blobs = path.join(dir, 'blobs', 'sha256');
  fs.mkdirSync(blobs, { recursive: true });
  const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');
  const put = (b) => {
    const d = sha(b);
    fs.writeFileSync(path.join(blobs, d), b);
    return { digest: `sha256:${d}`, size: b.length };
  };
  const root = path.join(dir, 'root');
  fs.mkdirSync(path.join(root, 'etc'), { recursive: true });
  fs.writeFileSync(path.join(root, 'etc', 'hello'), 'from an imported image\n');
  const tar = execFileSync('tar', ['-C', root, '--owner=0', '--group=0', '-cf', '-', 'etc']);
  const gz = execFileSync('gzip', ['-n', '-c'], { input: tar });
  const layer = put(gz);
  const config = Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', config: {}, rootfs: { type: 'layers', diff_ids: [`sha256:${sha(tar)}`] } }));
  const cfg = put(config);
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...cfg },
      layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', ...layer }],
    }),
  );
  const m = put(manifest);
  fs.writeFileSync(
    path.join(dir, 'index.json'),
    JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', ...m, annotations: { 'org.opencontainers.image.ref.name': ref } }] }),
  );
  fs.writeFileSync(path.join(dir, 'oci-layout'), '{"imageLayoutVersion":"1.0.0"}');
}

test("the descriptions name the images of the daemon's store", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tupper-mcp-oci-'));
  let c;
  try {
    ociLayout(dir, 'mcp-described:1');
    await withConnection({ socket: daemon.socket }, (d) => d.call('image.import', { path: dir, ref: 'mcp-described:1' }));
    // a new session asks the daemon at its start
    c = await connect(process.execPath, [ENTRY, '--socket', daemon.socket]);
    const { tools } = await c.listTools();
    const create = tools.find((t) => t.name === 'sandbox_create');
    assert.match(create.description, /in this daemon's store: "(docker\.io\/library\/)?mcp-described:1"/);
    assert.match(create.inputSchema.properties.image.description, /mcp-described:1"/);
    assert.match(c.getInstructions(), /mcp-described:1"/);
  } finally {
    await c?.close();
    await withConnection({ socket: daemon.socket }, (d) => d.call('image.remove', { ref: 'mcp-described:1' })).catch(() => {});
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
