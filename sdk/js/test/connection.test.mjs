// The SDK's two readers of the daemon's socket on their own (src/connection.ts:
// JSON lines; src/stream.ts: stream frames, docs/protocol.md "Frames"),
// against a stand-in daemon on a unix socket of the test's own: it plays a
// hostile peer (frames and lines the protocol forbids, cut anywhere) as well
// as a well-behaved one.  What is checked: a malformed frame or line closes
// that connection with an error naming what was wrong, on whatever waited on
// it, and never throws out of the socket's read callback (an uncaught
// exception in Node); well-formed input, however the socket cuts it, comes
// through whole; request deadlines fire on one timer, in order.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Connection } from '../dist/connection.js';
import { dataConn, frame, T, HDR } from '../dist/stream.js';
import { TimeoutError } from '../dist/errors.js';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tupper-sdk-conn-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

// an uncaught exception fails the test it happens in: counted here so that
// each test can say so itself, with what was thrown
const uncaught = [];
process.on('uncaughtException', (e) => uncaught.push(e));
function noneUncaught() {
  assert.deepEqual(uncaught.map((e) => String(e)), [], 'nothing thrown out of a read callback');
}

// a reader that waits for ever is a failure too, not a hang
const ttest = (name, fn) => test(name, { timeout: 20_000 }, fn);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let seq = 0;

/**
 * A stand-in daemon.  A connection whose first line is hello is a control
 * connection: hello and stream.channel are answered, other requests go to
 * onRequest(msg, sock).  One whose first line is stream.attach is a data
 * connection: attached, then handed to onData(sock, received) where
 * received() is what the client sent since (its frames).
 */
async function fakeDaemon({ onRequest = () => {}, onData = () => {} } = {}) {
  const sockPath = path.join(dir, `d${seq++}.sock`);
  const conns = new Set();
  const server = net.createServer((s) => {
    conns.add(s);
    s.on('close', () => conns.delete(s));
    s.on('error', () => {});
    let buf = Buffer.alloc(0);
    let data = null; // a data connection: what came after its attach
    s.on('data', (c) => {
      if (data) {
        data.push(c);
        return;
      }
      buf = Buffer.concat([buf, c]);
      for (let nl = buf.indexOf(10); nl >= 0 && !data; nl = buf.indexOf(10)) {
        const msg = JSON.parse(buf.subarray(0, nl).toString('utf8'));
        buf = buf.subarray(nl + 1);
        const reply = (result) => s.write(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result }) + '\n');
        if (msg.method === 'hello') reply({ protocol: 1, server: 'fake', process_streams: 1 });
        else if (msg.method === 'stream.channel') reply({ token: 'a'.repeat(32) });
        else if (msg.method === 'stream.attach') {
          data = [buf];
          reply({ protocol: 1, window: msg.params.window, frame_max: 1048576 });
          onData(s, () => Buffer.concat(data));
        } else onRequest(msg, s);
      }
    });
  });
  await new Promise((r) => server.listen(sockPath, r));
  return {
    path: sockPath,
    async close() {
      for (const c of conns) c.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

const u32 = (n) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return b;
};
const u64 = (n) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(n));
  return b;
};
/** a header as the peer wants it, right or wrong */
function rawHeader(len, type, sid, { version = 1, flags = 0 } = {}) {
  const h = Buffer.alloc(HDR);
  h.writeUInt32LE(len, 0);
  h[4] = version;
  h[5] = type;
  h.writeUInt16LE(flags, 6);
  h.writeUInt32LE(sid, 8);
  return h;
}
/** the client's frames, parsed (what it told the daemon) */
function framesOf(b) {
  const out = [];
  for (let off = 0; off + HDR <= b.length;) {
    const len = b.readUInt32LE(off);
    out.push({ type: b[off + 5], sid: b.readUInt32LE(off + 8), payload: b.subarray(off + HDR, off + HDR + len) });
    off += HDR + len;
  }
  return out;
}

// Frames the protocol forbids, each the only thing the daemon sends on the
// data connection while a file read waits on it; `rule`: what the error names.
const SID = 7;
const hostile = [
  { name: 'a short OPEN (4 bytes)', bytes: Buffer.concat([rawHeader(4, T.OPEN, SID), u32(3)]), rule: /OPEN of 4 bytes/ },
  { name: 'an empty OPEN', bytes: rawHeader(0, T.OPEN, SID), rule: /OPEN of 0 bytes/ },
  { name: 'a long OPEN (12 bytes)', bytes: Buffer.concat([rawHeader(12, T.OPEN, SID), Buffer.alloc(12)]), rule: /OPEN of 12 bytes/ },
  { name: 'an empty CREDIT', bytes: rawHeader(0, T.CREDIT, SID), rule: /CREDIT of 0 bytes \(4\)/ },
  { name: 'a CREDIT of 2 bytes', bytes: Buffer.concat([rawHeader(2, T.CREDIT, SID), Buffer.alloc(2)]), rule: /CREDIT of 2 bytes/ },
  { name: 'a CREDIT of count 0', bytes: Buffer.concat([rawHeader(4, T.CREDIT, SID), u32(0)]), rule: /CREDIT of 0 bytes on stream 7/ },
  { name: 'a CREDIT over 2^30', bytes: Buffer.concat([rawHeader(4, T.CREDIT, SID), u32(2 ** 30 + 1)]), rule: /CREDIT of 1073741825 bytes/ },
  { name: 'an ERROR of 2 bytes', bytes: Buffer.concat([rawHeader(2, T.ERROR, SID), Buffer.alloc(2)]), rule: /ERROR of 2 bytes/ },
  { name: 'an empty ERROR on sid 0', bytes: rawHeader(0, T.ERROR, 0), rule: /ERROR of 0 bytes/ },
  { name: 'an ERROR over 4100 bytes', bytes: Buffer.concat([rawHeader(5000, T.ERROR, SID), Buffer.alloc(5000)]), rule: /ERROR of 5000 bytes/ },
  { name: 'an END of 5 bytes', bytes: Buffer.concat([rawHeader(5, T.END, SID), Buffer.alloc(5)]), rule: /END of 5 bytes/ },
  { name: 'a DATA over 1 MiB (its header only)', bytes: rawHeader(2 * 1024 * 1024, T.DATA, SID), rule: /DATA of 2097152 bytes/ },
  { name: 'a length of 2^32-1 (its header only)', bytes: rawHeader(0xffffffff, T.OPEN, SID), rule: /OPEN of 4294967295 bytes/ },
  { name: 'an unknown type', bytes: rawHeader(0, 9, SID), rule: /unknown type 9/ },
  { name: 'a type 0', bytes: rawHeader(0, 0, SID), rule: /unknown type 0/ },
  { name: 'version 2', bytes: Buffer.concat([rawHeader(8, T.OPEN, SID, { version: 2 }), Buffer.alloc(8)]), rule: /version 2/ },
  { name: 'flags not 0', bytes: Buffer.concat([rawHeader(8, T.OPEN, SID, { flags: 1 }), Buffer.alloc(8)]), rule: /flags not 0/ },
];

for (const h of hostile) {
  for (const how of ['in one read', 'its header read apart from the rest', 'after a good frame in the same read']) {
    ttest(`data connection: ${h.name}, ${how}, fails the read waiting on it and closes that connection only`, async () => {
      let received;
      let dataSock;
      const d = await fakeDaemon({
        onRequest: (msg, s) => {
          if (msg.method === 'fs.read_stream') {
            s.write(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { stream: SID, size: 10 } }) + '\n');
            // the stream's frames, once the reply is out
            setTimeout(async () => {
              if (how === 'in one read') dataSock.write(h.bytes);
              else if (how === 'after a good frame in the same read') {
                dataSock.write(Buffer.concat([frame(T.OPEN, SID, Buffer.concat([u32(1), u32(0)])), h.bytes]));
              } else {
                dataSock.write(h.bytes.subarray(0, HDR));
                await sleep(30);
                if (h.bytes.length > HDR) dataSock.write(h.bytes.subarray(HDR));
              }
            }, 20);
          } else if (msg.method === 'ping') {
            s.write(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { pong: true } }) + '\n');
          }
        },
        onData: (s, got) => {
          dataSock = s;
          received = got;
        },
      });
      const conn = await Connection.open({ socket: d.path });
      try {
        const dc = await dataConn(conn);
        assert.ok(dc);
        const { chunks } = await dc.readFile(conn, { path: '/x' });
        await assert.rejects(
          (async () => {
            for await (const c of chunks) void c;
          })(),
          (e) => {
            assert.match(e.message, /the daemon sent a bad frame/);
            assert.match(e.message, h.rule);
            return true;
          },
        );
        assert.ok(dc.closed, 'the data connection is closed');
        // the daemon was told why, as the protocol asks: ERROR EPROTO on sid 0
        await sleep(20);
        const told = framesOf(received()).filter((f) => f.type === T.ERROR && f.sid === 0);
        assert.equal(told.length, 1, 'one ERROR on sid 0');
        assert.equal(told[0].payload.readUInt32LE(0), 71);
        assert.match(told[0].payload.subarray(4).toString('utf8'), h.rule);
        // the control connection goes on, and a new data connection is made
        assert.deepEqual(await conn.call('ping', {}), { pong: true });
        const again = await dataConn(conn);
        assert.ok(again && again !== dc && !again.closed);
        noneUncaught();
      } finally {
        conn.close();
        await d.close();
      }
    });
  }
}

ttest('data connection: a header cut short by the end of the connection fails the read, nothing delivered', async () => {
  let dataSock;
  const d = await fakeDaemon({
    onRequest: (msg, s) => {
      if (msg.method !== 'fs.read_stream') return;
      s.write(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { stream: SID, size: 10 } }) + '\n');
      setTimeout(() => {
        dataSock.write(frame(T.OPEN, SID, Buffer.concat([u32(1), u32(0)])).subarray(0, 7));
        setTimeout(() => dataSock.destroy(), 20);
      }, 20);
    },
    onData: (s) => {
      dataSock = s;
    },
  });
  const conn = await Connection.open({ socket: d.path });
  try {
    const dc = await dataConn(conn);
    const { chunks } = await dc.readFile(conn, {});
    const got = [];
    await assert.rejects(
      (async () => {
        for await (const c of chunks) got.push(c);
      })(),
      /closed/,
    );
    assert.equal(got.length, 0);
    noneUncaught();
  } finally {
    conn.close();
    await d.close();
  }
});

ttest('data connection: well-formed frames, whole in one read or cut at every byte, reach their streams', async () => {
  const file = Buffer.from('the file: ' + 'x'.repeat(70000));
  const wire = Buffer.concat([
    frame(T.OPEN, SID, Buffer.concat([u32(1), u32(0)])),
    frame(T.OPEN, 3, Buffer.concat([u32(3), u32(0)])),
    frame(T.DATA, SID, file.subarray(0, 9)),
    frame(T.CREDIT, 9, u32(5)), // another stream's: kept for it
    frame(T.DATA, SID, file.subarray(9)),
    frame(T.END, 3, u64(0)),
    frame(T.END, SID, u64(file.length)),
  ]);
  for (const cut of ['whole', 'bytewise']) {
    let dataSock;
    const d = await fakeDaemon({
      onRequest: (msg, s) => {
        if (msg.method !== 'fs.read_stream') return;
        s.write(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { stream: SID, size: file.length } }) + '\n');
        setTimeout(async () => {
          if (cut === 'whole') {
            dataSock.write(wire);
            return;
          }
          // the first 200 bytes one at a time (headers cut everywhere), the rest whole
          for (let i = 0; i < 200; i++) {
            dataSock.write(wire.subarray(i, i + 1));
            if (i % 4 === 0) await sleep(1);
          }
          dataSock.write(wire.subarray(200));
        }, 20);
      },
      onData: (s) => {
        dataSock = s;
      },
    });
    const conn = await Connection.open({ socket: d.path });
    try {
      const dc = await dataConn(conn);
      const drained = [];
      const proc = dc.drain(3, (b) => { drained.push(Buffer.from(b)); }, 'test');
      const { size, chunks } = await dc.readFile(conn, {});
      assert.equal(size, file.length);
      const got = [];
      for await (const pieces of chunks) got.push(Buffer.concat(pieces));
      assert.ok(Buffer.concat(got).equals(file), `${cut}: the file byte for byte`);
      assert.equal(await proc, 0, `${cut}: the drained stream's END`);
      assert.equal(drained.length, 0);
      assert.ok(!dc.closed);
      noneUncaught();
    } finally {
      conn.close();
      await d.close();
    }
  }
});

// the control connection: JSON lines

for (const [name, line, rule] of [
  ['null', 'null', /not a JSON object/],
  ['a number', '42', /not a JSON object/],
  ['a string', '"hi"', /not a JSON object/],
  ['an array', '[{"id":2,"result":{}}]', /not a JSON object/],
  ['not JSON', '{"id":2,', /not JSON/],
]) {
  ttest(`control connection: a line that is ${name} fails what waits and closes it, no throw`, async () => {
    const d = await fakeDaemon({ onRequest: (msg, s) => s.write(line + '\n') });
    const conn = await Connection.open({ socket: d.path });
    try {
      await assert.rejects(conn.call('anything', {}), rule);
      assert.ok(conn.closed);
      await assert.rejects(conn.call('more', {}), rule); // and says so after
      noneUncaught();
    } finally {
      conn.close();
      await d.close();
    }
  });
}

ttest('control connection: an error that is not an object, an id nobody asked for, a notification of nobody: the connection goes on', async () => {
  const d = await fakeDaemon({
    onRequest: (msg, s) => {
      if (msg.method === 'bad') {
        s.write(`{"jsonrpc":"2.0","id":${msg.id},"error":"boom"}\n{"jsonrpc":"2.0","id":99999,"result":1}\n`);
        s.write('{"jsonrpc":"2.0","method":"process.output","params":"what"}\n{"jsonrpc":"2.0","method":"process.exit","params":null}\n');
      } else s.write(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { ok: msg.method } }) + '\n');
    },
  });
  const conn = await Connection.open({ socket: d.path });
  try {
    await assert.rejects(conn.call('bad', {}), /bad: error/);
    assert.deepEqual(await conn.call('good', {}), { ok: 'good' });
    assert.ok(!conn.closed);
    noneUncaught();
  } finally {
    conn.close();
    await d.close();
  }
});

ttest('control connection: replies cut at every byte (UTF-8 characters split), several in one read, and a line of 3 MiB', async () => {
  const text = 'äö€😀'.repeat(50);
  const big = 'y'.repeat(3 * 1024 * 1024);
  const d = await fakeDaemon({
    onRequest: async (msg, s) => {
      if (msg.method === 'cut') {
        const b = Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { text } }) + '\n');
        for (let i = 0; i < b.length; i++) {
          s.write(b.subarray(i, i + 1));
          if (i % 8 === 0) await sleep(0);
        }
      } else if (msg.method === 'big') {
        s.write(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { big } }) + '\n');
      } else if (msg.method === 'two') {
        // the reply, a notification for a subscriber, and another line: one write
        s.write(
          JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { n: 2 } }) + '\n' +
          JSON.stringify({ jsonrpc: '2.0', method: 'process.exit', params: { sandbox: 'b', pid: 4, exit_code: 3 } }) + '\n' +
          JSON.stringify({ jsonrpc: '2.0', method: 'process.exit', params: { sandbox: 'b', pid: 5, exit_code: 0 } }) + '\n',
        );
      }
    },
  });
  const conn = await Connection.open({ socket: d.path });
  try {
    assert.equal((await conn.call('cut', {})).text, text);
    assert.equal((await conn.call('big', {})).big.length, big.length);
    const seen = [];
    let result;
    await conn.call('two', {}, {
      // runs before the next line is read: the notification after the reply is seen
      onResult: (r) => {
        result = r;
        conn.subscribe('b', 4, (m, p) => seen.push([m, p.exit_code]));
      },
    });
    await sleep(10);
    assert.deepEqual(result, { n: 2 });
    assert.deepEqual(seen, [['process.exit', 3]]);
    assert.equal((await conn.call('cut', {})).text, text, 'after a big line the buffer is read into again');
    noneUncaught();
  } finally {
    conn.close();
    await d.close();
  }
});

ttest('control connection: request deadlines on one timer: a shorter one made later fires first, a longer one keeps waiting', async () => {
  const held = [];
  const d = await fakeDaemon({ onRequest: (msg, s) => held.push([msg, s]) }); // answers nothing (yet)
  const conn = await Connection.open({ socket: d.path, requestTimeoutMs: 0 });
  try {
    const t0 = Date.now();
    const long = conn.call('long', {}, { timeoutMs: 1500 });
    const never = conn.call('never', {}); // requestTimeoutMs 0: no deadline
    const short = conn.call('short', {}, { timeoutMs: 60 });
    await assert.rejects(short, (e) => e instanceof TimeoutError && /short: no answer from the daemon in 60 ms/.test(e.message));
    const tShort = Date.now() - t0;
    assert.ok(tShort >= 55 && tShort < 1000, `the short one at ${tShort} ms`);
    // a second short one, made after the first fired: the timer is armed again
    await assert.rejects(conn.call('short2', {}, { timeoutMs: 40 }), TimeoutError);
    await assert.rejects(long, (e) => e instanceof TimeoutError && /long: no answer from the daemon in 1500 ms/.test(e.message));
    const tLong = Date.now() - t0;
    assert.ok(tLong >= 1490, `the long one at ${tLong} ms`);
    // the one with no deadline still waits: its reply comes late and is taken
    const [msg, s] = held.find(([m]) => m.method === 'never');
    s.write(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { late: true } }) + '\n');
    assert.deepEqual(await never, { late: true });
    noneUncaught();
  } finally {
    conn.close();
    await d.close();
  }
});
