// The data plane from the SDK (src/stream.ts, docs/protocol.md "Stream
// frames"): sbx.files on binary frames, byte for byte; a slow reader loses
// nothing; a reader that stops early leaves the connection usable; errors
// keep their types; a client's malformed frame closes only its own data
// connection.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { withSandbox } from './daemon.mjs';
import { Sandbox, NotFoundError } from '../dist/index.js';
import { dataConn, frame, T } from '../dist/stream.js';
import { Connection } from '../dist/connection.js';

let sbx;
let daemon;
withSandbox(Sandbox, (d, s) => { daemon = d; sbx = s; });

test('files go over the data connection: 16 MiB byte for byte both ways', async () => {
  const dc = await dataConn(sbx.conn);
  assert.ok(dc, 'the daemon has a data plane');
  const data = randomBytes(16 * 1024 * 1024 + 5);
  await sbx.files.write('/tmp/s16', data);
  assert.equal((await sbx.commands.run('wc -c < /tmp/s16')).stdout.trim(), String(data.length));
  const back = await sbx.files.read('/tmp/s16', { format: 'bytes' });
  assert.ok(Buffer.from(back).equals(data));
  assert.equal(await dataConn(sbx.conn), dc, 'one data connection per connection, reused');
});

test('bytes, text and a Blob are filled from the stream whole; an empty file reads empty', async () => {
  const text = 'ä'.repeat(3 * 1024 * 1024 + 7); // 2 bytes a character: frames end mid-character
  await sbx.files.write('/tmp/text', text);
  assert.equal(await sbx.files.read('/tmp/text'), text);
  const blob = await sbx.files.read('/tmp/text', { format: 'blob' });
  assert.ok(Buffer.from(await blob.arrayBuffer()).equals(Buffer.from(text, 'utf8')));
  await sbx.files.write('/tmp/empty', '');
  assert.equal((await sbx.files.read('/tmp/empty', { format: 'bytes' })).length, 0);
  assert.equal(await sbx.files.read('/tmp/empty'), '');
});

test('a slow reader gets every byte; the stream format pulls as it is read', async () => {
  const data = randomBytes(9 * 1024 * 1024);
  await sbx.files.write('/tmp/slow', data);
  const rs = await sbx.files.read('/tmp/slow', { format: 'stream' });
  const parts = [];
  let n = 0;
  for await (const c of rs) {
    parts.push(Buffer.from(c));
    if (n++ === 0) await new Promise((r) => setTimeout(r, 500)); // the daemon waits on our credit meanwhile
  }
  assert.ok(Buffer.concat(parts).equals(data));
});

test('a reader that stops early leaves the connection usable', async () => {
  const rs = await sbx.files.read('/tmp/slow', { format: 'stream' });
  const reader = rs.getReader();
  const first = await reader.read();
  assert.ok(first.value.length > 0);
  await reader.cancel();
  assert.equal(await sbx.files.read('/tmp/s16', { format: 'bytes' }).then((b) => b.length), 16 * 1024 * 1024 + 5);
});

test('errors keep their types on the data plane', async () => {
  await assert.rejects(sbx.files.read('/nope/x'), NotFoundError);
  await assert.rejects(sbx.files.write('/proc/version', 'x'));
  assert.equal(await sbx.files.read('/tmp/s16', { format: 'bytes' }).then((b) => b.length), 16 * 1024 * 1024 + 5);
});

test('a malformed frame closes that data connection only, after an ERROR on stream 0', async () => {
  // a second client (a connection has one data connection: sbx's has its own)
  const other = await Connection.open({ socket: daemon.socket });
  const { token } = await other.call('stream.channel', {});
  const s = net.createConnection({ path: daemon.socket });
  await new Promise((r) => s.once('connect', r));
  let got = Buffer.alloc(0);
  const closed = new Promise((r) => s.once('close', r));
  s.on('data', (c) => { got = Buffer.concat([got, c]); });
  s.write(JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'stream.attach', params: { token } }) + '\n');
  const deadline = Date.now() + 5000;
  while (!got.includes(0x0a) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  const nl = got.indexOf(0x0a);
  assert.equal(JSON.parse(got.subarray(0, nl).toString()).id, 3);
  got = got.subarray(nl + 1);
  const bad = frame(T.CREDIT, 1, Buffer.alloc(8)); // CREDIT must be 4 bytes
  s.write(bad);
  await closed;
  assert.ok(got.length >= 16);
  assert.equal(got[5], T.ERROR);
  assert.equal(got.readUInt32LE(8), 0);
  assert.equal(got.readUInt32LE(12), 71); // EPROTO
  assert.match(got.subarray(16).toString(), /CREDIT payload/);
  // this client's own data connection and its calls are unaffected, and so
  // is the other client's JSON connection
  assert.equal(await sbx.files.read('/tmp/s16', { format: 'bytes' }).then((b) => b.length), 16 * 1024 * 1024 + 5);
  assert.equal((await other.call('hello', {})).streams, 1);
  other.close();
});

test('a second data connection for one connection is refused', async () => {
  const { token } = await sbx.conn.call('stream.channel', {});
  const s = net.createConnection({ path: daemon.socket });
  await new Promise((r) => s.once('connect', r));
  let got = '';
  s.on('data', (c) => { got += c.toString(); });
  s.write(JSON.stringify({ jsonrpc: '2.0', id: 4, method: 'stream.attach', params: { token } }) + '\n');
  const deadline = Date.now() + 5000;
  while (!got.includes('\n') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  s.destroy();
  assert.equal(JSON.parse(got).error.code, -32600);
});

test('commands run on process streams: 12 MiB of stdout byte for byte, stderr, stdin and the exit', async () => {
  assert.equal(sbx.conn.processStreams, 1, 'the daemon binds process streams');
  let seen = 0;
  const r = await sbx.commands.run('head -c 12582912 /dev/zero | tr "\\0" x; echo done >&2', {
    maxOutputBytes: 1024,
    onStdout: (s) => { seen += Buffer.byteLength(s); },
  });
  assert.equal(seen, 12582912, 'every byte reached onStdout');
  assert.equal(r.stderr, 'done\n');
  assert.equal(r.stdoutDroppedBytes, 12582912 - 1024);
  const h = await sbx.commands.run('cat; echo end', { background: true, stdin: true });
  const big = Buffer.alloc(3 * 1024 * 1024 + 3, 'q'); // more than the stdin window: credit paces it
  await h.sendStdin(big);
  await h.closeStdin();
  const res = await h.wait();
  assert.equal(res.stdout, big.toString() + 'end\n');
  const back = await sbx.commands.run(`head -c 3 /dev/null; echo ok`);
  assert.equal(back.stdout, 'ok\n');
  await assert.rejects(sbx.commands.run('exit 7'), (e) => e.exitCode === 7);
});

test('onStdout gets a patterned stream exact and in order, characters split between pieces joined', async () => {
  // about 3.2 MB of lines that end in a two-byte character: frames of up to
  // 512 KiB come in the socket's pieces, so characters are cut between them
  let want = '';
  for (let i = 1; i <= 300000; i++) want += `${i}\u00e9\n`;
  const parts = [];
  const r = await sbx.commands.run("seq 1 300000 | sed 's/$/\u00e9/'", { onStdout: (s) => { parts.push(s); } });
  const got = parts.join('');
  assert.equal(got.length, want.length, 'as many characters as written');
  assert.ok(got === want, 'every character, in order');
  assert.ok(r.stdout === want, 'the kept output too');
  assert.ok(parts.length > 1, 'in more than one chunk');
});

test('a slow onStdout holds the process back and loses nothing', async () => {
  let got = 0;
  let first = true;
  const t0 = Date.now();
  await sbx.commands.run('head -c 6291456 /dev/zero; touch /tmp/wrote-all', {
    maxOutputBytes: 0,
    onStdout: async (s) => {
      got += Buffer.byteLength(s);
      if (first) {
        first = false;
        // the daemon waits for this chunk's credit: the writer cannot finish meanwhile
        await new Promise((r) => setTimeout(r, 600));
        const ls = await sbx.commands.run('test -e /tmp/wrote-all && echo yes || echo no');
        assert.equal(ls.stdout, 'no\n', 'the writer was held back');
      }
    },
  });
  assert.equal(got, 6291456);
  assert.ok(Date.now() - t0 >= 600);
});

test('a terminal on its stream: keystrokes in, screen out', async () => {
  const seen = [];
  const t = await sbx.pty.create({ cols: 80, rows: 24, cmd: ['/bin/sh'], onData: (d) => { seen.push(Buffer.from(d)); } });
  await sbx.pty.sendInput(t.pid, 'echo pty-$((6*7))\rexit\r');
  await t.wait().catch(() => {});
  assert.match(Buffer.concat(seen).toString('utf8'), /pty-42/);
});

test('frames cut anywhere by the socket: a DATA payload comes whole, in order, and the header after it is read', async () => {
  // a stand-in daemon on a socket of its own: it answers stream.attach, then
  // sends a read stream's frames in pieces of 1 to 70,000 bytes, so that
  // headers and payloads straddle the client's socket reads
  const { DataConn } = await import('../dist/stream.js');
  const path = `${daemon.dir}/dc-cut.sock`;
  const payloads = [randomBytes(1024 * 1024), randomBytes(3), Buffer.alloc(0), randomBytes(200000)];
  const wire = Buffer.concat([...payloads.map((p) => frame(T.DATA, 7, p)), frame(T.END, 7, Buffer.from([0, 0, 0, 0, 0, 0, 0, 0]))]);
  const conns = new Set();
  const server = net.createServer((s) => {
    conns.add(s);
    s.on('close', () => conns.delete(s));
    let line = '';
    s.on('data', async (c) => {
      if (line.includes('\n')) return; // CREDIT frames from here: not looked at
      line += c.toString('latin1');
      if (!line.includes('\n')) return;
      s.write('{"jsonrpc":"2.0","id":1,"result":{"protocol":1,"window":4194304,"frame_max":1048576}}\n');
      const cuts = [1, 5, 6, 11, 70000, 2, 65536, 13, 12, 1, 1, 40000];
      for (let off = 0, i = 0; off < wire.length; i++) {
        const n = Math.min(cuts[i % cuts.length], wire.length - off);
        s.write(wire.subarray(off, off + n));
        off += n;
        await new Promise((r) => setTimeout(r, 1));
      }
    });
  });
  await new Promise((r) => server.listen(path, r));
  let dc;
  try {
    const conn = {
      socketPath: path,
      call: async (method) => (method === 'stream.channel' ? { token: 't' } : { stream: 7, size: 1224003 }),
    };
    dc = await DataConn.open(conn);
    const { size, chunks } = await dc.readFile(conn, {});
    assert.equal(size, 1224003);
    const frames = [];
    for await (const pieces of chunks) frames.push(Buffer.concat(pieces));
    assert.equal(frames.length, payloads.length);
    payloads.forEach((p, i) => assert.ok(frames[i].equals(p), `frame ${i}`));
  } finally {
    dc?.close();
    for (const c of conns) c.destroy();
    await new Promise((r) => server.close(r));
  }
});
