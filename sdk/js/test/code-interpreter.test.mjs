// The code interpreter (@tupper/sdk/code-interpreter) against a real daemon
// and the shipped code-interpreter recipe: variables persist, logs and
// callbacks, errors with tracebacks, a matplotlib PNG, a DataFrame's html,
// contexts, a timeout that interrupts a cell and leaves its context usable,
// bad input refused; the MCP tool and HTTP route on the same machinery.
//
// The recipe's first build takes minutes (a Debian image with numpy,
// pandas and matplotlib), so the tests that need it run when
// TUPPER_CODE_SOCKET names a daemon that has it (or builds it once):
// tests/slow/code_interpreter_spec.lua starts one and runs this file and
// the Python SDK's tests against it.  The rest runs in every `npm test`.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startDaemon } from './daemon.mjs';
import {
  Sandbox,
  Execution,
  CODE_MAX_BYTES,
  DEFAULT_RUN_CODE_TIMEOUT_MS,
} from '../dist/code-interpreter.js';
import { Sandbox as BaseSandbox, InvalidArgumentError, NotFoundError, SandboxError, TimeoutError } from '../dist/index.js';
import { createMcpServer } from '../dist/mcp.js';
import { listenHttp } from '../dist/http.js';

const SHARED = process.env.TUPPER_CODE_SOCKET;
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

describe('code interpreter, without the recipe', () => {
  let daemon;
  let sbx;
  before(async () => {
    daemon = await startDaemon();
    // the embedded busybox image: no python3, no driver
    sbx = await Sandbox.create({ socket: daemon.socket, image: 'default', policy: false });
  });
  after(async () => {
    try {
      await sbx?.kill();
    } finally {
      assert.equal((await daemon.stop()).code, 0);
    }
  });

  test('Sandbox is the SDK Sandbox with runCode on top', () => {
    assert.ok(sbx instanceof BaseSandbox);
    assert.ok(sbx instanceof Sandbox);
    assert.equal(typeof sbx.runCode, 'function');
    assert.equal(DEFAULT_RUN_CODE_TIMEOUT_MS, 60_000);
  });

  test('bad input is refused before anything runs', async () => {
    await assert.rejects(sbx.runCode('x'.repeat(CODE_MAX_BYTES + 1)), (e) => e instanceof InvalidArgumentError && /at most 1048576 bytes/.test(e.message));
    await assert.rejects(sbx.runCode(42), InvalidArgumentError);
    await assert.rejects(sbx.runCode('1', { language: 'python', context: { id: 'x', language: 'python', cwd: '/' } }), /not both/);
    await assert.rejects(sbx.runCode('1', { timeoutMs: -1 }), InvalidArgumentError);
    await assert.rejects(sbx.removeCodeContext(''), InvalidArgumentError);
  });

  test('a sandbox without the driver says how to get one', async () => {
    await assert.rejects(sbx.runCode('1 + 1'), (e) => e instanceof SandboxError && /code-interpreter recipe/.test(e.message));
    // nothing was left running
    assert.deepEqual(await sbx.commands.list(), []);
  });
});

describe('code interpreter, the recipe', { skip: SHARED ? false : 'needs TUPPER_CODE_SOCKET (tests/slow/code_interpreter_spec.lua)' }, () => {
  let sbx;
  const opts = { socket: SHARED, policy: false };
  before(async () => {
    sbx = await Sandbox.create(opts);
  });
  after(async () => {
    if (sbx) {
      const id = sbx.sandboxId;
      await sbx.kill();
      await assert.rejects(BaseSandbox.getInfo(id, opts), NotFoundError);
    }
  });

  test('variables persist between cells; the value is the main result', async () => {
    const a = await sbx.runCode('x = 6 * 7\nx');
    assert.ok(a instanceof Execution);
    assert.equal(a.error, undefined);
    assert.equal(a.text, '42');
    assert.equal(a.results.length, 1);
    assert.equal(a.results[0].isMainResult, true);
    const b = await sbx.runCode('x + 1');
    assert.equal(b.text, '43');
    assert.equal(b.executionCount, a.executionCount + 1);
    const json = JSON.parse(JSON.stringify(b));
    assert.equal(json.results[0].text, '43');
  });

  test('stdout and stderr come as logs and to the callbacks, as they are written', async () => {
    const out = [];
    const err = [];
    const e = await sbx.runCode('import sys, time\nprint("one")\ntime.sleep(0.3)\nprint("two", file=sys.stderr)\nprint("three")', {
      onStdout: (m) => out.push(m),
      onStderr: (m) => err.push(m),
    });
    assert.equal(e.logs.stdout.join(''), 'one\nthree\n');
    assert.equal(e.logs.stderr.join(''), 'two\n');
    assert.equal(out.map((m) => m.line).join(''), 'one\nthree\n');
    assert.equal(err[0].error, true);
    assert.equal(out[0].error, false);
    assert.ok(out[0].timestamp > 1e15, 'microseconds since the epoch');
    assert.equal(e.text, undefined);
  });

  test('an error comes back with its name, value and traceback; the context goes on', async () => {
    let seen;
    const e = await sbx.runCode('def f():\n    raise ValueError("bad thing")\nf()', { onError: (x) => (seen = x) });
    assert.equal(e.error.name, 'ValueError');
    assert.equal(e.error.value, 'bad thing');
    assert.match(e.error.traceback, /in f/);
    assert.equal(seen.name, 'ValueError');
    assert.equal((await sbx.runCode('x')).text, '42');
  });

  test('a matplotlib plot comes back as a PNG result', async () => {
    const results = [];
    const e = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()',
      { onResult: (r) => results.push(r) },
    );
    assert.equal(e.error, undefined, e.error?.traceback);
    const png = e.results.find((r) => r.png !== undefined);
    assert.ok(png, `a png among ${JSON.stringify(e.results.map((r) => r.formats()))}`);
    assert.equal(png.isMainResult, false);
    assert.ok(png.formats().includes('png'));
    assert.deepEqual(Buffer.from(png.png, 'base64').subarray(0, 8), PNG_MAGIC);
    assert.equal(results.length, e.results.length);
  });

  test('a pandas DataFrame comes back as html and text', async () => {
    const e = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})');
    assert.equal(e.error, undefined, e.error?.traceback);
    const r = e.results[0];
    assert.equal(r.isMainResult, true);
    assert.match(r.html, /<table/);
    assert.match(r.text, /a\s+b/);
    assert.ok(r.formats().includes('html'));
  });

  test('envs are seen by the cell and put back after it', async () => {
    const e = await sbx.runCode('import os\nos.environ.get("GREETING")', { envs: { GREETING: 'hi there' } });
    assert.equal(e.text, "'hi there'");
    assert.equal((await sbx.runCode('import os\nos.environ.get("GREETING")')).text, undefined);
  });

  test('a cell that loops forever is interrupted at its timeout; the context keeps its variables', async () => {
    await sbx.runCode('kept = "still here"');
    const t0 = Date.now();
    await assert.rejects(sbx.runCode('while True:\n    pass', { timeoutMs: 2000 }), (e) => e instanceof TimeoutError && /interrupted/.test(e.message));
    const took = Date.now() - t0;
    // interrupted near its timeout: the SDK's own guard (a different error)
    // fires only 150 s later; the upper bound leaves room for a loaded host
    assert.ok(took >= 2000 && took < 10000, `took ${took} ms`);
    assert.equal((await sbx.runCode('kept')).text, "'still here'");
  });

  test('a cell that ignores the interrupt, or kills its kernel, gets a fresh kernel in the same context', async () => {
    const ctx = await sbx.createCodeContext();
    await sbx.runCode('lost = 1', { context: ctx });
    await assert.rejects(
      sbx.runCode('import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass', { context: ctx, timeoutMs: 1000 }),
      (e) => e instanceof TimeoutError && /restarted/.test(e.message),
    );
    assert.equal((await sbx.runCode('"lost" in dir()', { context: ctx })).text, 'False');
    await sbx.runCode('lost = 1', { context: ctx });
    const dead = await sbx.runCode('import os\nos._exit(1)', { context: ctx });
    assert.equal(dead.error.name, 'DeadKernelError');
    assert.equal((await sbx.runCode('"lost" in dir()', { context: ctx })).text, 'False');
    await sbx.removeCodeContext(ctx);
    // the default context was not touched
    assert.equal((await sbx.runCode('x')).text, '42');
  });

  test('cells of one context run in turn and in the order sent, of two contexts at once; the wait counts against timeoutMs', async () => {
    const other = await sbx.createCodeContext();
    try {
      await sbx.runCode('import time', { context: other });
      await sbx.runCode('import time');
      // each cell says when it ran, by the box's clock: the two overlap
      // (a wall-time bound would fail on a loaded machine, not on a bug)
      const span = 't0 = time.time()\ntime.sleep(1.5)\n[t0, time.time()]';
      const [a, b] = (await Promise.all([sbx.runCode(span), sbx.runCode(span, { context: other })])).map((e) =>
        JSON.parse(e.text),
      );
      assert.ok(a[0] < b[1] && b[0] < a[1], `two contexts ran one after the other: ${a} and ${b}`);
      // cells sent at once run in the order sent, as E2B's do
      await sbx.runCode('order = []');
      await Promise.all(Array.from({ length: 30 }, (_, i) => sbx.runCode(`order.append(${i})`)));
      assert.equal((await sbx.runCode('order == list(range(30))')).text, 'True');
      const first = sbx.runCode('time.sleep(2)\n"first"');
      await assert.rejects(sbx.runCode('"second"', { timeoutMs: 500 }), (e) => e instanceof TimeoutError && /did not run/.test(e.message));
      assert.equal((await first).text, "'first'");
    } finally {
      await sbx.removeCodeContext(other);
    }
  });

  test('contexts: create, run in, list, restart, remove', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp' });
    assert.equal(ctx.language, 'python');
    assert.equal(ctx.cwd, '/tmp');
    assert.match(ctx.id, /^[0-9a-f]{32}$/);
    assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: ctx })).text, "'/tmp'");
    // its own variables: the default context's x is not there
    const missing = await sbx.runCode('x', { context: ctx });
    assert.equal(missing.error.name, 'NameError');
    await sbx.runCode('y = 5', { context: ctx });
    const ids = (await sbx.listCodeContexts()).map((c) => c.id);
    assert.ok(ids.includes(ctx.id) && ids.includes('default'), ids.join(','));
    await sbx.restartCodeContext(ctx);
    assert.equal((await sbx.runCode('y', { context: ctx })).error.name, 'NameError');
    await sbx.removeCodeContext(ctx.id);
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
    await assert.rejects(sbx.runCode('1', { context: ctx }), (e) => e instanceof NotFoundError && /no code context/.test(e.message));
    await assert.rejects(sbx.removeCodeContext(ctx), NotFoundError);
    await assert.rejects(sbx.restartCodeContext('nope'), NotFoundError);
  });

  test('bad input in the sandbox gets clear errors', async () => {
    await assert.rejects(sbx.runCode('1', { language: 'cobol' }), (e) => e instanceof InvalidArgumentError && /not supported/.test(e.message));
    await assert.rejects(sbx.createCodeContext({ language: 'r' }), InvalidArgumentError);
    await assert.rejects(sbx.createCodeContext({ cwd: '/no/such/dir' }), NotFoundError);
    await assert.rejects(sbx.runCode('1', { envs: { 'A=B': 'x' } }), InvalidArgumentError);
    // a cell that prints without bound is cut with a marker, and the next cell runs
    const big = await sbx.runCode('for i in range(300000):\n    print("0123456789")');
    const text = big.logs.stdout.join('');
    assert.ok(text.length < (1 << 20) + 200, `${text.length} bytes`);
    assert.match(text, /output truncated/);
    assert.equal((await sbx.runCode('x')).text, '42');
  });

  test('a second Sandbox object reaches the same sandbox with its own interpreter', async () => {
    // connect takes connection options only (an unknown option is an error, as create's policy would be here)
    const other = await Sandbox.connect(sbx.sandboxId, { socket: opts.socket });
    const e = await other.runCode('"x" in dir()');
    assert.equal(e.text, 'False');
    const drivers = (await sbx.commands.list()).filter((p) => [p.cmd, ...p.args].join(' ').includes('interp.py'));
    assert.equal(drivers.length, 2, JSON.stringify(drivers));
    // (its interpreter goes with the sandbox, killed at the end)
  });

  test('MCP run_code on a sandbox_create with recipe "code-interpreter"', async () => {
    const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
    const { InMemoryTransport } = await import('@modelcontextprotocol/sdk/inMemory.js');
    const mcp = createMcpServer({ socket: SHARED });
    const [ct, st] = InMemoryTransport.createLinkedPair();
    await mcp.server.connect(st);
    const client = new Client({ name: 'test', version: '1' });
    await client.connect(ct);
    let made;
    try {
      const tools = (await client.listTools()).tools.map((t) => t.name);
      assert.ok(tools.includes('run_code'), tools.join(','));
      const c = await client.callTool({ name: 'sandbox_create', arguments: { recipe: 'code-interpreter' } });
      assert.notEqual(c.isError, true, JSON.stringify(c));
      made = JSON.parse(c.content[0].text).sandboxId;
      const r = await client.callTool({ name: 'run_code', arguments: { sandboxId: made, code: 'v = 6 * 7\nprint("hi")\nv' } });
      assert.notEqual(r.isError, true, JSON.stringify(r));
      const body = JSON.parse(r.content[0].text);
      assert.equal(body.text, '42');
      assert.deepEqual(body.logs.stdout, ['hi\n']);
      assert.equal(r.structuredContent.text, '42');
      const raised = await client.callTool({ name: 'run_code', arguments: { sandboxId: made, code: '1 / 0' } });
      assert.equal(raised.isError, true);
      assert.match(raised.content[0].text, /ZeroDivisionError/);
      const slow = await client.callTool({ name: 'run_code', arguments: { sandboxId: made, code: 'while True: pass', timeoutMs: 1000 } });
      assert.equal(slow.isError, true);
      assert.match(slow.content[0].text, /interrupted/);
      const again = await client.callTool({ name: 'run_code', arguments: { sandboxId: made, code: 'v' } });
      assert.equal(JSON.parse(again.content[0].text).text, '42');
      const other = await client.callTool({ name: 'run_code', arguments: { sandboxId: sbx.sandboxId, code: '1' } });
      assert.equal(other.isError, true, 'a sandbox of another session is refused');
      const huge = await client.callTool({ name: 'run_code', arguments: { sandboxId: made, code: 'x'.repeat(CODE_MAX_BYTES + 1) } });
      assert.equal(huge.isError, true);
    } finally {
      await client.close();
      await mcp.close();
    }
    // the session's sandbox died with it
    await assert.rejects(BaseSandbox.getInfo(made, opts), NotFoundError);
  });

  test('HTTP POST /sandboxes/{id}/code', async () => {
    const api = await listenHttp({ socket: SHARED, listen: '127.0.0.1:0' });
    const post = (id, body) =>
      fetch(`${api.url}/sandboxes/${id}/code`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    try {
      let r = await post(sbx.sandboxId, { code: 'import pandas as pd\npd.DataFrame({"q": [7]})' });
      assert.equal(r.status, 200, await r.clone().text());
      const e = await r.json();
      assert.match(e.results[0].html, /<table/);
      assert.equal(e.results[0].isMainResult, true);
      r = await post(sbx.sandboxId, { code: 'raise KeyError("k")' });
      assert.equal(r.status, 200);
      assert.equal((await r.json()).error.name, 'KeyError');
      r = await post(sbx.sandboxId, { code: 'while True: pass', timeoutMs: 1000 });
      assert.equal(r.status, 504);
      r = await post(sbx.sandboxId, { code: '1', language: 'cobol' });
      assert.equal(r.status, 400);
      r = await post(sbx.sandboxId, { code: '1', contextId: 'gone' });
      assert.equal(r.status, 404);
      r = await post(sbx.sandboxId, { code: 1 });
      assert.equal(r.status, 400);
      r = await post(sbx.sandboxId, { code: '1', extra: true });
      assert.equal(r.status, 400);
      r = await post('nosuchbox', { code: '1' });
      assert.equal(r.status, 404);
      // the variables of the default context are the SDK's too (the server keeps its own interpreter)
      r = await post(sbx.sandboxId, { code: 'x' });
      assert.equal((await r.json()).error.name, 'NameError');
    } finally {
      await api.close();
    }
  });
});
