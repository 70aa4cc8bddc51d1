// A 5-minute command through the MCP server under the official client's
// default 60 s request timeout: the server's progress notifications, with
// the client's resetTimeoutOnProgress, keep the call alive to its end.
// Slow: not part of `npm test` (test/*.test.mjs); tests/slow/mcp_long_spec.lua runs it.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { DEFAULT_REQUEST_TIMEOUT_MSEC } from '@modelcontextprotocol/sdk/shared/protocol.js';
import { startDaemon } from '../daemon.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const ENTRY = path.resolve(here, '..', '..', 'dist', 'cli-mcp.js');

let daemon;
let client;

before(async () => {
  daemon = await startDaemon();
  client = new Client({ name: 'tupper-slow-test', version: '0.0.0' });
  await client.connect(new StdioClientTransport({ command: process.execPath, args: [ENTRY, '--socket', daemon.socket], stderr: 'pipe' }));
});

after(async () => {
  try {
    await client?.close();
  } finally {
    if (daemon) assert.equal((await daemon.stop()).code, 0);
  }
});

test('a 5-minute command completes under the default 60 s timeout, kept alive by progress', { timeout: 15 * 60_000 }, async () => {
  assert.equal(DEFAULT_REQUEST_TIMEOUT_MSEC, 60_000, 'the client default this test is about');
  const created = await client.callTool({ name: 'sandbox_create', arguments: { timeoutMs: 15 * 60_000 } });
  assert.ok(!created.isError, created.content[0].text);
  const { sandboxId } = created.structuredContent;
  let n = 0;
  const t0 = Date.now();
  // no `timeout`: the client's default 60 s, reset by every progress notification
  const r = await client.callTool(
    { name: 'run_command', arguments: { sandboxId, cmd: 'sleep 300; echo finished', timeoutMs: 10 * 60_000 } },
    CallToolResultSchema,
    { resetTimeoutOnProgress: true, onprogress: () => n++ },
  );
  const took = Date.now() - t0;
  assert.ok(!r.isError, r.content[0].text);
  assert.equal(r.structuredContent.stdout, 'finished\n');
  assert.equal(r.structuredContent.exitCode, 0);
  assert.ok(took >= 300_000, `took ${took} ms`);
  assert.ok(n >= 250, `${n} progress notifications`);
  await client.callTool({ name: 'sandbox_kill', arguments: { sandboxId } });
});
