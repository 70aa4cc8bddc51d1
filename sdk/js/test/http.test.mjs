// The HTTP API (src/http/) against a real daemon, with fetch: every route,
// streaming order, binary bodies byte-exact, the auth rules, the limits.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import { spawn } from 'node:child_process';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { BIN, signal, startDaemon, track } from './daemon.mjs';
import { ERROR_TYPES, HTTP_ROUTES, listenHttp, openApiPath } from '../dist/http.js';
import { Sandbox } from '../dist/index.js';

const MAX_BODY = 8 << 20;
const MAX_JSON = 64 << 10;
let daemon;
let api; // the server, no token, loopback
let base;
let id; // a sandbox made through the API

before(async () => {
  daemon = await startDaemon();
  api = await listenHttp({ socket: daemon.socket, listen: '127.0.0.1:0', maxBodyBytes: MAX_BODY, maxJsonBytes: MAX_JSON });
  base = api.url;
  const r = await post('/sandboxes', { metadata: { suite: 'http' } });
  assert.equal(r.status, 201);
  id = (await r.json()).sandboxId;
});

after(async () => {
  try {
    await api?.close();
    for (const s of await Sandbox.list({ socket: daemon.socket }).nextItems()) await Sandbox.kill(s.sandboxId, { socket: daemon.socket });
  } finally {
    if (daemon) assert.equal((await daemon.stop()).code, 0);
  }
});

function post(path, body, headers = {}) {
  return fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
}

async function errorOf(r, status) {
  assert.equal(r.status, status, `want ${status}, got ${r.status}: ${await r.clone().text()}`);
  const b = await r.json();
  assert.equal(typeof b.error.type, 'string');
  assert.equal(typeof b.error.message, 'string');
  return b.error;
}

const q = (p) => `?path=${encodeURIComponent(p)}`;

// reads NDJSON events from a response as they come
async function* ndjson(r) {
  const dec = new TextDecoder();
  let buf = '';
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line) yield JSON.parse(line);
    }
  }
  assert.equal(buf, '', 'the stream ends with a whole line');
}

async function allEvents(r) {
  const out = [];
  for await (const e of ndjson(r)) out.push(e);
  return out;
}

function run(cmd, extra = {}, headers = {}) {
  return post(`/sandboxes/${id}/commands`, { cmd, ...extra }, headers);
}

test('openapi.json documents every route, and only those; it is served', async () => {
  const doc = JSON.parse(fs.readFileSync(openApiPath(), 'utf8'));
  assert.equal(doc.openapi, '3.1.0');
  const documented = [];
  for (const [p, item] of Object.entries(doc.paths)) {
    for (const m of ['get', 'put', 'post', 'delete', 'patch']) {
      if (item[m]) {
        documented.push(`${m.toUpperCase()} ${p}`);
        assert.ok(item[m].responses, `${m} ${p} has responses`);
        assert.ok(item[m].summary, `${m} ${p} has a summary`);
      }
    }
  }
  const served = HTTP_ROUTES.map((r) => `${r.method} ${r.path}`);
  assert.deepEqual([...documented].sort(), [...served].sort());
  // every $ref resolves
  const text = JSON.stringify(doc);
  for (const m of text.matchAll(/"\$ref":"#\/components\/(\w+)\/(\w+)"/g)) {
    assert.ok(doc.components[m[1]][m[2]], `${m[0]} resolves`);
  }
  const r = await fetch(base + '/openapi.json');
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), doc);
});

test('volumes: create, list, get, mount with volumeMounts, destroy refused while mounted (409), bad names (400)', async () => {
  let r = await post('/volumes', { name: 'http-vol', size: '16M' });
  assert.equal(r.status, 201);
  const v = await r.json();
  assert.equal(v.name, 'http-vol');
  assert.equal(v.size, 16 << 20);
  assert.match(v.volumeId, /^vol-/);
  await errorOf(await post('/volumes', { name: 'http-vol' }), 409);
  for (const bad of ['..', 'a/b', 'a\nb']) await errorOf(await post('/volumes', { name: bad }), 400);
  await errorOf(await post('/volumes', { name: 'x', extra: 1 }), 400);
  assert.deepEqual((await (await fetch(base + '/volumes')).json()).volumes.map((x) => x.name), ['http-vol']);
  r = await post('/sandboxes', { volumeMounts: { '/mnt/v': 'http-vol' } });
  assert.equal(r.status, 201);
  const sid = (await r.json()).sandboxId;
  try {
    r = await post(`/sandboxes/${sid}/commands`, { cmd: 'echo kept > /mnt/v/f && cat /mnt/v/f' });
    assert.equal(r.status, 200);
    const events = await allEvents(r);
    assert.equal(events.at(-1).exitCode, 0, JSON.stringify(events));
    const got = await fetch(`${base}/volumes/${v.volumeId}`);
    assert.deepEqual((await got.json()).mountedBy, [{ sandboxId: sid, path: '/mnt/v' }]);
    const e = await errorOf(await fetch(`${base}/volumes/http-vol`, { method: 'DELETE' }), 409);
    assert.ok(e.message.includes(sid), e.message);
  } finally {
    await fetch(`${base}/sandboxes/${sid}`, { method: 'DELETE' });
  }
  r = await post('/sandboxes', { volumeMounts: { '/data': 'http-vol' } });
  const sid2 = (await r.json()).sandboxId;
  try {
    const f = await fetch(`${base}/sandboxes/${sid2}/files${q('/data/f')}`);
    assert.equal(await f.text(), 'kept\n');
  } finally {
    await fetch(`${base}/sandboxes/${sid2}`, { method: 'DELETE' });
  }
  await errorOf(await post('/sandboxes', { volumeMounts: { '/d': 'missing' } }), 422);
  await errorOf(await fetch(`${base}/volumes/a..b`), 400);
  assert.equal((await fetch(`${base}/volumes/http-vol`, { method: 'DELETE' })).status, 200);
  await errorOf(await fetch(`${base}/volumes/http-vol`, { method: 'DELETE' }), 404);
  await errorOf(await fetch(`${base}/volumes/http-vol`), 404);
});

test('sandboxes: create, get, list with filters, timeout, metrics, kill', async () => {
  const r = await post('/sandboxes', { image: 'default', metadata: { who: 'crud' }, envs: { A: 'b' }, timeoutMs: 60000, limits: { pids: 64 } });
  assert.equal(r.status, 201);
  const info = await r.json();
  assert.match(info.sandboxId, /^[A-Za-z0-9]/);
  assert.equal(info.state, 'running');
  assert.deepEqual(info.metadata, { who: 'crud' });
  assert.equal(info.timeoutMs, 60000);
  assert.equal(info.limits.pids, 64);
  const sid = info.sandboxId;

  const g = await fetch(`${base}/sandboxes/${sid}`);
  assert.equal(g.status, 200);
  assert.equal((await g.json()).sandboxId, sid);

  const l = await fetch(`${base}/sandboxes?metadata.who=crud&state=running`);
  const list = await l.json();
  assert.deepEqual(list.sandboxes.map((s) => s.sandboxId), [sid]);
  const none = await (await fetch(`${base}/sandboxes?metadata.who=nobody`)).json();
  assert.deepEqual(none.sandboxes, []);
  const page = await (await fetch(`${base}/sandboxes?limit=1`)).json();
  assert.equal(page.sandboxes.length, 1);
  assert.equal(typeof page.nextToken, 'string');
  const page2 = await (await fetch(`${base}/sandboxes?limit=1&nextToken=${page.nextToken}`)).json();
  assert.equal(page2.sandboxes.length, 1);
  assert.notEqual(page2.sandboxes[0].sandboxId, page.sandboxes[0].sandboxId);
  await errorOf(await fetch(`${base}/sandboxes?state=dead`), 400);
  await errorOf(await fetch(`${base}/sandboxes?bogus=1`), 400);

  const t = await post(`/sandboxes/${sid}/timeout`, { timeoutMs: 0 });
  assert.equal(t.status, 200);
  const ti = await t.json();
  assert.equal(ti.timeoutMs, 0);
  assert.equal(ti.endAt, undefined);
  await errorOf(await post(`/sandboxes/${sid}/timeout`, { timeoutMs: -1 }), 400);

  const mine = await allEvents(await post(`/sandboxes/${sid}/commands`, { cmd: 'echo $A' }));
  assert.deepEqual(mine.filter((e) => e.type === 'stdout').map((e) => e.data).join(''), 'b\n');

  const m = await fetch(`${base}/sandboxes/${sid}/metrics`);
  if (m.status === 200) {
    const mm = await m.json();
    assert.equal(typeof mm.memUsed, 'number');
    assert.equal(typeof mm.pids, 'number');
  } else {
    // a host without cgroups says so
    await errorOf(m, m.status);
  }

  // pause: commands and files are refused (409) until resume, which nothing else does
  // the pause to disk's option is checked (the pause itself: e2b-parity's keepMemory test)
  await errorOf(await post(`/sandboxes/${sid}/pause`, { keepMemory: 'yes' }), 400);
  await errorOf(await post(`/sandboxes/${sid}/pause`, { keep: true }), 400);
  const pz = await post(`/sandboxes/${sid}/pause`, {});
  assert.equal(pz.status, 200);
  assert.equal((await pz.json()).state, 'paused');
  await errorOf(await post(`/sandboxes/${sid}/commands`, { cmd: 'true' }), 409);
  await errorOf(await fetch(`${base}/sandboxes/${sid}/files${q('/etc/hostname')}`), 409);
  await errorOf(await fetch(`${base}/sandboxes/${sid}/files/list${q('/')}`), 409);
  assert.equal((await (await fetch(`${base}/sandboxes/${sid}`)).json()).state, 'paused');
  const rs = await post(`/sandboxes/${sid}/resume`, {});
  assert.equal(rs.status, 200);
  assert.equal((await rs.json()).state, 'running');
  const after = await allEvents(await post(`/sandboxes/${sid}/commands`, { cmd: 'echo back' }));
  assert.deepEqual(after.at(-1), { type: 'exit', exitCode: 0 });
  await errorOf(await post(`/sandboxes/nosuchbox0000/pause`, {}), 404);
  await errorOf(await post(`/sandboxes/nosuchbox0000/resume`, {}), 404);

  const k = await fetch(`${base}/sandboxes/${sid}`, { method: 'DELETE' });
  assert.equal(k.status, 200);
  assert.deepEqual(await k.json(), { killed: true });
  await errorOf(await fetch(`${base}/sandboxes/${sid}`), 404);
  await errorOf(await fetch(`${base}/sandboxes/${sid}`, { method: 'DELETE' }), 404);
});

test('a sandbox paused by another client is not resumed by a file or command request', async () => {
  const other = await Sandbox.create({ socket: daemon.socket });
  try {
    await other.pause();
    const sid = other.sandboxId;
    const e = await errorOf(await fetch(`${base}/sandboxes/${sid}/files/list${q('/')}`), 409);
    assert.match(e.message, /paused/);
    await errorOf(await post(`/sandboxes/${sid}/commands`, { cmd: 'true' }), 409);
    assert.equal((await other.getInfo()).state, 'paused');
  } finally {
    await other.kill();
  }
});

test('killing a sandbox ends the streams of its commands', async () => {
  const sid = (await (await post('/sandboxes', {})).json()).sandboxId;
  const r = await post(`/sandboxes/${sid}/commands`, { cmd: 'echo up; sleep 60' });
  const it = ndjson(r);
  assert.equal((await it.next()).value.type, 'start');
  assert.deepEqual((await it.next()).value, { type: 'stdout', data: 'up\n' });
  const bg = await (await post(`/sandboxes/${sid}/commands`, { cmd: 'sleep 60', background: true })).json();
  const follow = fetch(`${base}/sandboxes/${sid}/commands/${bg.pid}`).then(allEvents);
  assert.equal((await fetch(`${base}/sandboxes/${sid}`, { method: 'DELETE' })).status, 200);
  const last = (await it.next()).value;
  assert.ok(
    (last.type === 'exit' && last.error === 'signal: killed') || (last.type === 'error' && /is gone/.test(last.error.message)),
    JSON.stringify(last),
  );
  assert.equal((await it.next()).done, true);
  const fev = (await follow).at(-1);
  assert.ok(fev.type === 'exit' || fev.type === 'error', JSON.stringify(fev));
});

test('create validates its body', async () => {
  await errorOf(await post('/sandboxes', { bogus: 1 }), 400);
  await errorOf(await post('/sandboxes', { envs: { A: 1 } }), 400);
  await errorOf(await post('/sandboxes', { timeoutMs: 'soon' }), 400);
  await errorOf(await post('/sandboxes', { limits: { cpus: -1 } }), 400);
  await errorOf(await post('/sandboxes', [1, 2]), 400);
  await errorOf(await fetch(base + '/sandboxes', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{nope' }), 400);
  await errorOf(await fetch(base + '/sandboxes', { method: 'POST', headers: { 'content-type': 'text/plain' }, body: '{}' }), 415);
  // an image the daemon does not have: it cannot be made (422)
  const e = await errorOf(await post('/sandboxes', { image: 'no-such-image' }), 422);
  assert.match(e.message, /image/);
});

test('unknown sandbox: 404 on every kind of route; a bad id is 400', async () => {
  const u = 'nosuchbox0000';
  await errorOf(await fetch(`${base}/sandboxes/${u}`), 404);
  await errorOf(await fetch(`${base}/sandboxes/${u}/files${q('/etc/hostname')}`), 404);
  await errorOf(await fetch(`${base}/sandboxes/${u}/files${q('/x')}`, { method: 'PUT', body: 'x' }), 404);
  await errorOf(await fetch(`${base}/sandboxes/${u}/files/list${q('/')}`), 404);
  await errorOf(await fetch(`${base}/sandboxes/${u}/commands`), 404);
  await errorOf(await post(`/sandboxes/${u}/commands`, { cmd: 'true' }), 404);
  await errorOf(await post(`/sandboxes/${u}/timeout`, { timeoutMs: 1000 }), 404);
  await errorOf(await fetch(`${base}/sandboxes/bad%2Fid`), 400);
  await errorOf(await fetch(`${base}/sandboxes/${id}/commands/abc`, { method: 'DELETE' }), 400);
  await errorOf(await fetch(`${base}/nowhere`), 404);
  await errorOf(await fetch(`${base}/sandboxes/${id}`, { method: 'PATCH' }), 405);
});

test('a command streams its events in order, as NDJSON', async () => {
  const r = await run('for i in 1 2 3 4 5; do echo $i; done; echo err >&2; exit 3');
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /application\/x-ndjson/);
  const ev = await allEvents(r);
  assert.equal(ev[0].type, 'start');
  assert.ok(ev[0].pid > 0);
  assert.equal(ev.filter((e) => e.type === 'stdout').map((e) => e.data).join(''), '1\n2\n3\n4\n5\n');
  assert.equal(ev.filter((e) => e.type === 'stderr').map((e) => e.data).join(''), 'err\n');
  assert.deepEqual(ev.at(-1), { type: 'exit', exitCode: 3, error: 'exit status 3' });
});

test('output is in order under load (a lot of it, fast)', async () => {
  const ev = await allEvents(await run('seq 1 50000'));
  const out = ev.filter((e) => e.type === 'stdout').map((e) => e.data).join('');
  const want = Array.from({ length: 50000 }, (_, i) => `${i + 1}\n`).join('');
  assert.equal(out, want);
  assert.deepEqual(ev.at(-1), { type: 'exit', exitCode: 0 });
});

test('output arrives while the command runs (it is streamed, not buffered)', async () => {
  const r = await run('echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second');
  const it = ndjson(r);
  assert.equal((await it.next()).value.type, 'start');
  assert.deepEqual((await it.next()).value, { type: 'stdout', data: 'first\n' });
  // the command is still waiting: only now is it let go
  const w = await fetch(`${base}/sandboxes/${id}/files${q('/tmp/go')}`, { method: 'PUT', body: '' });
  assert.equal(w.status, 200);
  assert.deepEqual((await it.next()).value, { type: 'stdout', data: 'second\n' });
  assert.deepEqual((await it.next()).value, { type: 'exit', exitCode: 0 });
  assert.equal((await it.next()).done, true);
  await fetch(`${base}/sandboxes/${id}/files${q('/tmp/go')}`, { method: 'DELETE' });
});

test('server-sent events when asked for', async () => {
  const r = await run('echo one; echo two >&2', {}, { accept: 'text/event-stream' });
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const text = await r.text();
  const events = text
    .trim()
    .split('\n\n')
    .map((block) => {
      const [ev, data] = block.split('\n');
      assert.match(ev, /^event: \w+$/);
      assert.match(data, /^data: /);
      const v = JSON.parse(data.slice(6));
      assert.equal(v.type, ev.slice(7));
      return v;
    });
  assert.equal(events[0].type, 'start');
  assert.deepEqual(events.slice(1).sort((a, b) => a.type.localeCompare(b.type)), [
    { type: 'exit', exitCode: 0 },
    { type: 'stderr', data: 'two\n' },
    { type: 'stdout', data: 'one\n' },
  ]);
});

test('a command past its timeoutMs is killed and says so', async () => {
  const ev = await allEvents(await run('echo a; sleep 30', { timeoutMs: 300 }));
  const end = ev.at(-1);
  assert.equal(end.type, 'exit');
  assert.equal(end.timedOut, true);
  assert.equal(end.exitCode, -1);
});

test('a reader that falls behind gets its command killed, not buffered without bound', async () => {
  const small = await listenHttp({ socket: daemon.socket, listen: '127.0.0.1:0', maxOutputBytes: 64 << 10 });
  try {
    const u = new URL(`${small.url}/sandboxes/${id}/commands`);
    const res = await new Promise((resolve, reject) => {
      const req = http.request(u, { method: 'POST', headers: { 'content-type': 'application/json' } }, resolve);
      req.on('error', reject);
      req.end(JSON.stringify({ cmd: 'yes flood', timeoutMs: 120000 }));
    });
    res.pause(); // read nothing while the command writes
    const deadline = Date.now() + 60_000;
    for (;;) {
      const l = await (await fetch(`${base}/sandboxes/${id}/commands`)).json();
      if (!l.processes.some((p) => p.args.includes('yes flood'))) break;
      assert.ok(Date.now() < deadline, 'the flooding command was killed');
      await new Promise((r) => setTimeout(r, 100));
    }
    res.resume();
    let text = '';
    res.setEncoding('utf8');
    for await (const chunk of res) text += chunk;
    const last = JSON.parse(text.trim().split('\n').at(-1));
    assert.equal(last.type, 'error');
    assert.equal(last.error.type, 'RateLimitError');
  } finally {
    await small.close();
  }
});

test('command arguments are validated', async () => {
  await errorOf(await run(''), 400);
  await errorOf(await post(`/sandboxes/${id}/commands`, { cmd: 'true', nope: 1 }), 400);
  await errorOf(await post(`/sandboxes/${id}/commands`, { cmd: 'true', timeoutMs: -5 }), 400);
  await errorOf(await post(`/sandboxes/${id}/commands`, { cmd: 'true', envs: ['x'] }), 400);
  await errorOf(await post(`/sandboxes/${id}/commands`, { cmd: 'true', background: 'yes' }), 400);
  // a cwd that does not exist: the daemon refuses before anything streams
  const e = await errorOf(await run('true', { cwd: '/no/such/dir' }), 404);
  assert.equal(e.code, 'ENOENT');
});

test('background: start, list, stdin, follow the output, exit', async () => {
  const r = await run('cat; echo done >&2', { background: true, stdin: true });
  assert.equal(r.status, 201);
  const { pid } = await r.json();
  assert.ok(pid > 0);
  const l = await (await fetch(`${base}/sandboxes/${id}/commands`)).json();
  const p = l.processes.find((x) => x.pid === pid);
  assert.ok(p);
  assert.deepEqual(p.args, ['-c', 'cat; echo done >&2']);
  const bin = crypto.randomBytes(300_000).toString('hex'); // 600 kB of text through stdin
  const w = await fetch(`${base}/sandboxes/${id}/commands/${pid}/stdin`, { method: 'POST', body: 'hello\n' + bin });
  assert.equal(w.status, 200);
  assert.deepEqual(await w.json(), { written: 6 + bin.length });
  const c = await fetch(`${base}/sandboxes/${id}/commands/${pid}/stdin`, { method: 'DELETE' });
  assert.equal(c.status, 200);
  const ev = await allEvents(await fetch(`${base}/sandboxes/${id}/commands/${pid}`));
  assert.equal(ev.filter((e) => e.type === 'stdout').map((e) => e.data).join(''), 'hello\n' + bin);
  assert.equal(ev.filter((e) => e.type === 'stderr').map((e) => e.data).join(''), 'done\n');
  assert.deepEqual(ev.at(-1), { type: 'exit', exitCode: 0 });
  // it can be read again after its end
  const again = await allEvents(await fetch(`${base}/sandboxes/${id}/commands/${pid}`));
  assert.deepEqual(again, ev);
  await errorOf(await fetch(`${base}/sandboxes/${id}/commands/999999`), 404);
});

test('kill a command (and its tree); an unknown pid is 404', async () => {
  const r = await run('sh -c "sleep 60" & sleep 60', { background: true });
  const { pid } = await r.json();
  const follow = fetch(`${base}/sandboxes/${id}/commands/${pid}`).then(allEvents);
  const k = await fetch(`${base}/sandboxes/${id}/commands/${pid}`, { method: 'DELETE' });
  assert.equal(k.status, 200);
  const ev = await follow;
  assert.deepEqual(ev.at(-1), { type: 'exit', exitCode: -1, error: 'signal: killed' });
  const left = await allEvents(await run('ps -o pid,args | grep "sleep 6[0]" || true'));
  assert.equal(left.filter((e) => e.type === 'stdout').map((e) => e.data).join(''), '');
  await errorOf(await fetch(`${base}/sandboxes/${id}/commands/${pid}`, { method: 'DELETE' }), 404);
});

test('files: a few MiB of random bytes go up and come back byte-exact', async () => {
  const data = crypto.randomBytes(5 * (1 << 20) + 12345);
  const w = await fetch(`${base}/sandboxes/${id}/files${q('data/blob.bin')}`, { method: 'PUT', body: data });
  assert.equal(w.status, 200);
  assert.deepEqual(await w.json(), { path: '/home/user/data/blob.bin', size: data.length });
  const r = await fetch(`${base}/sandboxes/${id}/files${q('data/blob.bin')}`);
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('content-type'), 'application/octet-stream');
  assert.equal(r.headers.get('x-file-size'), String(data.length));
  const back = Buffer.from(await r.arrayBuffer());
  assert.equal(back.length, data.length);
  assert.ok(back.equals(data), 'byte-exact');
  // the sandbox sees the same bytes
  const sum = await allEvents(await run('md5sum data/blob.bin'));
  const md5 = crypto.createHash('md5').update(data).digest('hex');
  assert.equal(sum.find((e) => e.type === 'stdout').data, `${md5}  data/blob.bin\n`);
  // a chunked body (no Content-Length) streams too
  const chunked = await new Promise((resolve, reject) => {
    const u = new URL(`${base}/sandboxes/${id}/files${q('data/chunked.bin')}`);
    const req = http.request(u, { method: 'PUT' }, (res) => {
      let s = '';
      res.on('data', (d) => (s += d));
      res.on('end', () => resolve({ status: res.statusCode, body: JSON.parse(s) }));
    });
    req.on('error', reject);
    for (let i = 0; i < data.length; i += 100_000) req.write(data.subarray(i, i + 100_000));
    req.end();
  });
  assert.equal(chunked.status, 200);
  assert.equal(chunked.body.size, data.length);
  const back2 = Buffer.from(await (await fetch(`${base}/sandboxes/${id}/files${q('data/chunked.bin')}`)).arrayBuffer());
  assert.ok(back2.equals(data));
  // an empty file
  assert.equal((await fetch(`${base}/sandboxes/${id}/files${q('data/empty')}`, { method: 'PUT', body: '' })).status, 200);
  const empty = await fetch(`${base}/sandboxes/${id}/files${q('data/empty')}`);
  assert.equal((await empty.arrayBuffer()).byteLength, 0);
  // no temporary file is left behind
  const names = (await (await fetch(`${base}/sandboxes/${id}/files/list${q('data')}`)).json()).entries.map((e) => e.name);
  assert.deepEqual(names, ['blob.bin', 'chunked.bin', 'empty']);
});

test('files: list, stat, mkdir, rename, remove, and their errors', async () => {
  const put = (p, body) => fetch(`${base}/sandboxes/${id}/files${q(p)}`, { method: 'PUT', body });
  assert.equal((await put('w/a.txt', 'A')).status, 200);
  assert.equal((await put('w/sub/b.txt', 'BB')).status, 200);
  // an existing file keeps its mode when replaced
  await allEvents(await run('chmod 750 w/a.txt'));
  assert.equal((await put('w/a.txt', 'AAA')).status, 200);
  const st = await (await fetch(`${base}/sandboxes/${id}/files/stat${q('w/a.txt')}`)).json();
  assert.equal(st.type, 'file');
  assert.equal(st.size, 3);
  assert.equal(st.mode, 0o750);
  assert.equal(st.permissions, '-rwxr-x---');
  const list = await (await fetch(`${base}/sandboxes/${id}/files/list${q('w')}`)).json();
  assert.deepEqual(list.entries.map((e) => [e.name, e.type]), [['a.txt', 'file'], ['sub', 'dir']]);

  const mk = await post(`/sandboxes/${id}/files/mkdir`, { path: 'w/new/deep' });
  assert.equal(mk.status, 201);
  assert.deepEqual(await mk.json(), { created: true });
  const mk2 = await post(`/sandboxes/${id}/files/mkdir`, { path: 'w/new/deep' });
  assert.equal(mk2.status, 200);
  assert.deepEqual(await mk2.json(), { created: false });

  const rn = await post(`/sandboxes/${id}/files/rename`, { from: 'w/sub/b.txt', to: 'w/new/b2.txt' });
  assert.equal(rn.status, 200);
  const moved = await rn.json();
  assert.equal(moved.path, '/home/user/w/new/b2.txt');
  assert.equal(moved.size, 2);

  const rm = await fetch(`${base}/sandboxes/${id}/files${q('w/new')}`, { method: 'DELETE' });
  assert.equal(rm.status, 200);
  await errorOf(await fetch(`${base}/sandboxes/${id}/files/stat${q('w/new')}`), 404);

  // errors: missing file, wrong kinds, bad paths
  const e = await errorOf(await fetch(`${base}/sandboxes/${id}/files${q('w/missing')}`), 404);
  assert.equal(e.code, 'ENOENT');
  // removing nothing is no error, as the SDK's files.remove (and E2B's)
  assert.equal((await fetch(`${base}/sandboxes/${id}/files${q('w/missing')}`, { method: 'DELETE' })).status, 200);
  await errorOf(await fetch(`${base}/sandboxes/${id}/files/list${q('w/a.txt')}`), 409);
  await errorOf(await fetch(`${base}/sandboxes/${id}/files${q('w')}`), 409);
  await errorOf(await put('w/sub', 'x'), 409); // a directory is not replaced by a file
  await errorOf(await put('w/', 'x'), 400);
  await errorOf(await fetch(`${base}/sandboxes/${id}/files`), 400);
  await errorOf(await fetch(`${base}/sandboxes/${id}/files?path=a%00b`), 400);
  await errorOf(await fetch(`${base}/sandboxes/${id}/files${q('/' + 'x'.repeat(5000))}`), 400);
  await errorOf(await post(`/sandboxes/${id}/files/rename`, { from: 'w/a.txt' }), 400);
  await errorOf(await post(`/sandboxes/${id}/files/mkdir`, { path: 7 }), 400);
});

test('files and commands act as the default account (user), or as ?user= / "user" says', async () => {
  const put = (p, body, user) => fetch(`${base}/sandboxes/${id}/files${q(p)}${user ? `&user=${user}` : ''}`, { method: 'PUT', body });
  assert.equal((await put('acct.txt', 'mine')).status, 200);
  const st = await (await fetch(`${base}/sandboxes/${id}/files/stat${q('/home/user/acct.txt')}`)).json();
  assert.equal(st.uid, 1000);
  const denied = await errorOf(await put('/etc/acct', 'no'), 403);
  assert.equal(denied.code, 'EACCES');
  assert.equal((await put('/etc/acct', 'yes', 'root')).status, 200);
  const back = await fetch(`${base}/sandboxes/${id}/files${q('/etc/acct')}&user=root`);
  assert.equal(await back.text(), 'yes');
  await errorOf(await fetch(`${base}/sandboxes/${id}/files${q('/etc/acct')}`, { method: 'DELETE' }), 403);
  assert.equal((await fetch(`${base}/sandboxes/${id}/files${q('/etc/acct')}&user=root`, { method: 'DELETE' })).status, 200);
  await errorOf(await fetch(`${base}/sandboxes/${id}/files/list${q('/root')}`), 403);
  assert.equal((await fetch(`${base}/sandboxes/${id}/files/list${q('/root')}&user=root`)).status, 200);
  assert.equal((await post(`/sandboxes/${id}/files/mkdir`, { path: '/opt/x', user: 'root' })).status, 201);
  await errorOf(await post(`/sandboxes/${id}/files/mkdir`, { path: '/opt/y' }), 403);
  await errorOf(await fetch(`${base}/sandboxes/${id}/files${q('x')}&user=ghost`), 404);
  await errorOf(await fetch(`${base}/sandboxes/${id}/files${q('x')}&user=bad%20name`), 400);
  const who = await allEvents(await run('whoami; pwd'));
  assert.equal(who.filter((e) => e.type === 'stdout').map((e) => e.data).join(''), 'user\n/home/user\n');
  const r = await post(`/sandboxes/${id}/commands`, { cmd: 'whoami; pwd', user: 'root' });
  const rootWho = await allEvents(r);
  assert.equal(rootWho.filter((e) => e.type === 'stdout').map((e) => e.data).join(''), 'root\n/root\n');
  await errorOf(await post(`/sandboxes/${id}/commands`, { cmd: 'true', user: 7 }), 400);
});

test('oversized bodies are refused, and the old file stays as it was', async () => {
  const p = 'big/keep.txt';
  assert.equal((await fetch(`${base}/sandboxes/${id}/files${q(p)}`, { method: 'PUT', body: 'old' })).status, 200);
  // declared too big: refused before a byte is read
  const big = Buffer.alloc(MAX_BODY + 1, 7);
  const r = await fetch(`${base}/sandboxes/${id}/files${q(p)}`, { method: 'PUT', body: big }).catch((e) => e);
  if (r instanceof Error) assert.match(String(r.cause?.code ?? r.message), /EPIPE|ECONNRESET|UND_ERR|other side closed|fetch failed/);
  else await errorOf(r, 413);
  // not declared (chunked): refused once it passes the limit
  const status = await new Promise((resolve) => {
    const u = new URL(`${base}/sandboxes/${id}/files${q(p)}`);
    const req = http.request(u, { method: 'PUT' }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
    });
    req.on('error', () => resolve('reset'));
    let sent = 0;
    const more = () => {
      while (sent <= MAX_BODY + (1 << 20)) {
        sent += 1 << 16;
        if (!req.write(Buffer.alloc(1 << 16, 1))) return req.once('drain', more);
      }
      req.end();
    };
    more();
  });
  assert.ok(status === 413 || status === 'reset', `refused: ${status}`);
  const back = await fetch(`${base}/sandboxes/${id}/files${q(p)}`);
  assert.equal(await back.text(), 'old');
  const names = (await (await fetch(`${base}/sandboxes/${id}/files/list${q('big')}`)).json()).entries.map((e) => e.name);
  assert.deepEqual(names, ['keep.txt'], 'no temporary file left');
  // a JSON body over its own limit
  const j = await post(`/sandboxes/${id}/commands`, { cmd: 'x'.repeat(MAX_JSON) }).catch((e) => e);
  if (!(j instanceof Error)) await errorOf(j, 413);
});

test('no token: web pages and foreign Host names are refused', async () => {
  await errorOf(await fetch(`${base}/sandboxes`, { headers: { origin: 'https://evil.example' } }), 403);
  const status = await new Promise((resolve, reject) => {
    const u = new URL(`${base}/sandboxes`);
    http.get({ host: u.hostname, port: u.port, path: u.pathname, headers: { host: 'evil.example' } }, (res) => {
      res.resume();
      resolve(res.statusCode);
    }).on('error', reject);
  });
  assert.equal(status, 403);
});

test('auth: off loopback a token is required; wrong or missing tokens get 401', async () => {
  await assert.rejects(listenHttp({ socket: daemon.socket, listen: '0.0.0.0:0' }), /without a bearer token/);
  await assert.rejects(listenHttp({ socket: daemon.socket, listen: '127.0.0.1:0', token: 'short' }), /at least 16/);
  await assert.rejects(listenHttp({ socket: daemon.socket, listen: 'nonsense' }), /ADDR:PORT/);
  const token = crypto.randomBytes(24).toString('hex');
  const s = await listenHttp({ socket: daemon.socket, listen: '0.0.0.0:0', token });
  try {
    const port = new URL(s.url).port;
    const u = `http://127.0.0.1:${port}`;
    const none = await fetch(`${u}/sandboxes`);
    assert.equal(none.status, 401);
    assert.equal(none.headers.get('www-authenticate'), 'Bearer');
    await errorOf(await fetch(`${u}/sandboxes`, { headers: { authorization: `Bearer ${token}x` } }), 401);
    await errorOf(await fetch(`${u}/sandboxes`, { headers: { authorization: `Basic ${token}` } }), 401);
    await errorOf(await fetch(`${u}/openapi.json`, { headers: { authorization: 'Bearer ' } }), 401);
    await errorOf(await fetch(`${u}/sandboxes/${id}/files${q('/x')}`, { method: 'PUT', body: 'x' }), 401);
    const ok = await fetch(`${u}/sandboxes/${id}`, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(ok.status, 200);
    assert.equal((await ok.json()).sandboxId, id);
  } finally {
    await s.close();
  }
});

const PKG = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

function tupperHttp(args, env = {}) {
  const child = track(spawn(BIN, ['--socket', daemon.socket, 'http', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, TUPPER_SDK_JS: PKG, ...env },
  })); // ended with the file if a failed test never sent its SIGTERM
  let err = '';
  child.stderr.on('data', (d) => (err += d));
  const exit = new Promise((resolve) => child.once('exit', (code, sig) => resolve({ code, sig, err })));
  return { child, exit, stderr: () => err };
}

test('`tupper http` serves on loopback, refuses 0.0.0.0 without a token, stops on SIGTERM', async () => {
  const refused = await tupperHttp(['--listen', '0.0.0.0:0'], { TUPPER_HTTP_TOKEN: '' }).exit;
  assert.notEqual(refused.code, 0);
  assert.match(refused.err, /refusing to listen on 0\.0\.0\.0 without a bearer token/);

  const token = crypto.randomBytes(20).toString('hex');
  const s = tupperHttp(['--listen', '127.0.0.1:0'], { TUPPER_HTTP_TOKEN: token });
  const deadline = Date.now() + 20_000;
  let m;
  while (!(m = /listening on (http:\/\/\S+)/.exec(s.stderr()))) {
    assert.ok(Date.now() < deadline, `tupper http did not start: ${s.stderr()}`);
    await new Promise((r) => setTimeout(r, 20));
  }
  const url = m[1];
  assert.equal((await fetch(`${url}/sandboxes`)).status, 401, 'the token from the environment is required');
  const r = await fetch(`${url}/sandboxes/${id}`, { headers: { authorization: `Bearer ${token}` } });
  assert.equal(r.status, 200);
  signal(s.child, 'SIGTERM'); // not child.kill(): daemon.mjs says why
  const end = await s.exit;
  assert.equal(end.code, 0, end.err);
});

const stdoutOf = (ev) => ev.filter((e) => e.type === 'stdout').map((e) => e.data).join('');

test('one set of error type names: the SDK classes, openapi.json and docs/http.md say the same', async () => {
  const doc = JSON.parse(fs.readFileSync(openApiPath(), 'utf8'));
  assert.deepEqual(doc.components.schemas.ErrorType.enum, [...ERROR_TYPES]);
  const md = fs.readFileSync(path.resolve(path.dirname(openApiPath()), '../../docs/http.md'), 'utf8');
  for (const t of ERROR_TYPES) assert.match(md, new RegExp('`' + t + '`'), `docs/http.md names ${t}`);
  const sdk = await import('../dist/index.js');
  for (const t of ERROR_TYPES.slice(0, 8)) assert.equal(typeof sdk[t], 'function', `the SDK exports ${t}`);
  // no other name in the server's source
  const dir = path.resolve(path.dirname(openApiPath()), 'src/http');
  const files = [...fs.readdirSync(dir).map((f) => path.join(dir, f)), ...fs.readdirSync(path.join(dir, 'routes')).map((f) => path.join(dir, 'routes', f))];
  for (const f of files.filter((x) => x.endsWith('.ts'))) {
    const text = fs.readFileSync(f, 'utf8');
    for (const m of text.matchAll(/HttpError\(\d+, '(\w+)'|type: '(\w+Error)'/g)) assert.ok(ERROR_TYPES.includes(m[1] ?? m[2]), `${path.basename(f)}: ${m[0]}`);
  }
  // the cases the issue named: an unknown sandbox is NotFoundError everywhere
  const gone = await errorOf(await fetch(`${base}/sandboxes/no-such-box`, { method: 'DELETE' }), 404);
  assert.equal(gone.type, 'NotFoundError');
  const info = await errorOf(await fetch(`${base}/sandboxes/no-such-box`), 404);
  assert.equal(info.type, 'NotFoundError');
  const route = await errorOf(await fetch(`${base}/no/route`), 404);
  assert.equal(route.type, 'NotFoundError');
  assert.equal((await errorOf(await fetch(`${base}/sandboxes`, { method: 'PATCH' }), 405)).type, 'InvalidArgumentError');
});

test('create with network rules; the network log and rules routes; ports reach a server inside', async () => {
  const r = await post('/sandboxes', { network: { allow: ['example.com'] }, timeoutMs: 60000 });
  assert.equal(r.status, 201, await r.clone().text());
  const sid = (await r.json()).sandboxId;
  try {
    const ev = await allEvents(await post(`/sandboxes/${sid}/commands`, { cmd: 'echo $HTTP_PROXY' }));
    assert.match(stdoutOf(ev), /^http:\/\/127\.0\.0\.1:\d+\n$/);
    // a denied destination is in the log
    await allEvents(await post(`/sandboxes/${sid}/commands`, { cmd: 'nslookup denied.invalid >/dev/null 2>&1; true' }));
    const log = await fetch(`${base}/sandboxes/${sid}/network/log`);
    assert.equal(log.status, 200);
    const { entries } = await log.json();
    assert.ok(entries.some((e) => e.action === 'deny' && e.host === 'denied.invalid'), JSON.stringify(entries));
    const put = await fetch(`${base}/sandboxes/${sid}/network`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ network: 'none' }) });
    assert.equal(put.status, 200);
    assert.deepEqual(await put.json(), { network: 'none' });
    assert.equal((await errorOf(await fetch(`${base}/sandboxes/${sid}/network`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ network: { allow: 'x' } }) }), 400)).type, 'InvalidArgumentError');

    await fetch(`${base}/sandboxes/${sid}/files${q('/tmp/www/index.html')}`, { method: 'PUT', body: 'from inside\n' });
    const bg = await post(`/sandboxes/${sid}/commands`, { cmd: 'httpd -f -p 127.0.0.1:8000 -h /tmp/www', background: true });
    assert.equal(bg.status, 201);
    const pr = await post(`/sandboxes/${sid}/ports`, { port: 8000 });
    assert.equal(pr.status, 200, await pr.clone().text());
    const { host, port } = await pr.json();
    assert.equal(port, 8000);
    assert.match(host, /^127\.0\.0\.1:\d+$/);
    let body;
    for (let i = 0; i < 100 && !(body ?? '').includes('inside'); i++) {
      body = await fetch(`http://${host}/index.html`).then((x) => x.text(), () => undefined);
      if (!(body ?? '').includes('inside')) await new Promise((res) => setTimeout(res, 50));
    }
    assert.equal(body, 'from inside\n');
    assert.equal((await errorOf(await post(`/sandboxes/${sid}/ports`, { port: 0 }), 400)).type, 'InvalidArgumentError');
    await errorOf(await post(`/sandboxes/${sid}/ports`, { port: 80, extra: 1 }), 400);
    await errorOf(await post('/sandboxes/no-such-box/ports', { port: 80 }), 404);
  } finally {
    await Sandbox.kill(sid, { socket: daemon.socket });
  }
  await errorOf(await post('/sandboxes', { network: 'some' }), 400);
  await errorOf(await post('/sandboxes', { network: { allow: ['ok'], other: [] } }), 400);
});

test('create with a recipe (its text, or a shipped name; never a path) and a policy', async () => {
  const recipe = { source: 'return recipe "httptest" { env = { FROM_RECIPE = "yes" }, files = { ["/etc/motd"] = "made by a recipe\\n" } }', name: 'httptest.lua' };
  const r = await post('/sandboxes', { recipe });
  assert.equal(r.status, 201, await r.clone().text());
  const sid = (await r.json()).sandboxId;
  try {
    const ev = await allEvents(await post(`/sandboxes/${sid}/commands`, { cmd: 'echo $FROM_RECIPE; cat /etc/motd' }));
    assert.equal(stdoutOf(ev), 'yes\nmade by a recipe\n');
  } finally {
    await Sandbox.kill(sid, { socket: daemon.socket });
  }
  const path1 = await errorOf(await post('/sandboxes', { recipe: './app.lua' }), 400);
  assert.match(path1.message, /reads no file/);
  assert.match((await errorOf(await post('/sandboxes', { recipe: '/etc/passwd' }), 400)).message, /reads no file/);
  await errorOf(await post('/sandboxes', { recipe: 'default', image: 'default' }), 400);
  const bad = await errorOf(await post('/sandboxes', { recipe: { source: 'return recipe "x" { nope = 1 }' } }), 422);
  assert.match(bad.message, /nope/);

  const policy = { source: 'return policy { on_exec = function(argv) if (argv[3] or ""):find("forbidden") then return false, "not that" end return true end }', name: 'test-policy.lua' };
  const p = await post('/sandboxes', { policy });
  assert.equal(p.status, 201, await p.clone().text());
  const pid = (await p.json()).sandboxId;
  try {
    const ok = await allEvents(await post(`/sandboxes/${pid}/commands`, { cmd: 'echo allowed' }));
    assert.equal(stdoutOf(ok), 'allowed\n');
    const no = await errorOf(await post(`/sandboxes/${pid}/commands`, { cmd: 'echo forbidden' }), 403);
    assert.equal(no.type, 'PolicyError');
    assert.match(no.message, /not that/);
  } finally {
    await Sandbox.kill(pid, { socket: daemon.socket });
  }
  await errorOf(await post('/sandboxes', { policy: '/etc/tupper.lua' }), 400);
  await errorOf(await post('/sandboxes', { policy: { source: 'return policy { bogus = 1 }' } }), 400);
});

test('stdin as text or bytes, foreground and background', async () => {
  const t = await allEvents(await run('tr a-z A-Z', { stdin: 'shout\n' }));
  assert.equal(stdoutOf(t), 'SHOUT\n');
  const b = await allEvents(await run('od -An -tx1', { stdinBase64: Buffer.from([0, 255, 10]).toString('base64') }));
  assert.equal(stdoutOf(b).trim(), '00 ff 0a');
  const bg = await run('cat', { stdin: 'to the background\n', background: true });
  assert.equal(bg.status, 201);
  const { pid } = await bg.json();
  const f = await allEvents(await fetch(`${base}/sandboxes/${id}/commands/${pid}`));
  assert.equal(stdoutOf(f), 'to the background\n');
  assert.equal(f.at(-1).exitCode, 0);
  await errorOf(await run('cat', { stdin: 'a', stdinBase64: 'YQ==' }), 400);
  await errorOf(await run('cat', { stdinBase64: 'not base64!' }), 400);
  await errorOf(await run('cat', { stdin: 3 }), 400);
});

test("a refused upload's error names the client's path, not the server's temporary file", async () => {
  const r = await fetch(`${base}/sandboxes/${id}/files${q('/etc/hosts-upload')}`, { method: 'PUT', body: 'x' });
  const e = await errorOf(r, 403);
  assert.equal(e.type, 'PermissionError');
  assert.match(e.message, /\/etc\/hosts-upload/);
  assert.doesNotMatch(e.message, /\.upload-/);
});
