// The data connection's frame reader (src/stream.ts, DataConn.feed) on its
// own, no daemon: frames of two drained process streams, interleaved, cut
// into random pieces (headers cut too), must reach each stream's sink byte
// for byte and in order, with the credit given back adding up.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DataConn, frame, T, HDR } from '../dist/stream.js';

function rng(seed) {
  let x = seed >>> 0 || 1;
  return (n) => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x % n;
  };
}

function fakeSocket(writes) {
  return {
    ref() {}, unref() {}, destroy() {}, on() {}, once() {}, off() {},
    write(b) { writes.push(Buffer.from(b)); return true; },
  };
}

function endFrame(sid, size) {
  const p = Buffer.alloc(8);
  p.writeBigUInt64LE(BigInt(size));
  return frame(T.END, sid, p);
}

test('frames cut into random pieces reach each drained stream whole and in order', async () => {
  for (let round = 0; round < 40; round++) {
    const r = rng(round * 7919 + 17);
    const writes = [];
    const dc = new DataConn(fakeSocket(writes));
    const sids = [3, 4];
    const want = { 3: [], 4: [] };
    const got = { 3: [], 4: [] };
    const drains = sids.map((sid) => dc.drain(sid, (b) => { got[sid].push(Buffer.from(b)); }, 'test'));
    const frames = [];
    for (let i = 0; i < 12; i++) {
      const sid = sids[r(2)];
      const n = 1 + r(i % 3 === 0 ? 1024 * 1024 : 70000);
      const b = Buffer.alloc(n);
      for (let k = 0; k < n; k++) b[k] = (k * 31 + i * 7 + sid) & 0xff;
      want[sid].push(b);
      frames.push(frame(T.DATA, sid, b));
      if (r(4) === 0) frames.push(frame(T.CREDIT, 9, Buffer.from([1, 0, 0, 0]))); // another stream's
    }
    const total = (sid) => want[sid].reduce((a, b) => a + b.length, 0);
    for (const sid of sids) frames.push(endFrame(sid, total(sid)));
    const all = Buffer.concat(frames);
    for (let off = 0; off < all.length;) {
      const k = Math.min(all.length - off, r(3) === 0 ? 1 + r(HDR + 2) : 1 + r(150000));
      dc.feed(all.subarray(off, off + k));
      off += k;
      if (r(3) === 0) await new Promise((res) => setImmediate(res)); // the sinks run meanwhile
    }
    const sizes = await Promise.all(drains);
    for (const [i, sid] of sids.entries()) {
      assert.equal(sizes[i], total(sid), `round ${round}: END's size of stream ${sid}`);
      assert.ok(Buffer.concat(got[sid]).equals(Buffer.concat(want[sid])), `round ${round}: stream ${sid} byte for byte`);
    }
    // every write is a CREDIT of a drained stream; none gives more than came
    const credit = { 3: 0, 4: 0 };
    for (const w of writes) {
      assert.equal(w.length, HDR + 4);
      assert.equal(w[5], T.CREDIT);
      credit[w.readUInt32LE(8)] += w.readUInt32LE(HDR);
    }
    for (const sid of sids) assert.ok(credit[sid] <= total(sid), `round ${round}: credit of ${sid} within what came`);
  }
});

// A read as bytes (files.read): Node's `onread` lets each socket read land in
// a buffer the data connection picks (nextBuffer); in the middle of a DATA
// frame of a file read into one buffer, that is the slice of the reader's
// buffer where the bytes belong.  Reads of random sizes, frames of a process
// stream and CREDITs between, the first frames before the reader gave its
// buffer, and a file longer than the size the open saw: the result must be
// the file byte for byte, and some reads must have landed in place.
test('a file read into its buffer by the socket reads themselves', async () => {
  const { gather } = await import('../dist/filesystem.js');
  for (let round = 0; round < 30; round++) {
    const r = rng(round * 104729 + 5);
    const writes = [];
    const dc = new DataConn(fakeSocket(writes));
    const fileSid = 7;
    const size = 1 + r(3 * 1024 * 1024);
    const grew = r(4) === 0 ? 1 + r(300000) : 0; // bytes past the size the open saw
    const file = Buffer.alloc(size + grew);
    for (let k = 0; k < file.length; k++) file[k] = (k * 131 + round) & 0xff;
    const out = [];
    const drained = dc.drain(3, (b) => { out.push(Buffer.from(b)); }, 'test');
    const conn = { call: async () => ({ stream: fileSid, size }) };
    const { chunks, into } = await dc.readFile(conn, {});
    const frames = [];
    const other = [];
    for (let off = 0; off < file.length;) {
      const n = Math.min(file.length - off, 1 + r(1024 * 1024));
      frames.push(frame(T.DATA, fileSid, file.subarray(off, off + n)));
      off += n;
      if (r(3) === 0) {
        const b = Buffer.alloc(1 + r(5000), round);
        other.push(b);
        frames.push(frame(T.DATA, 3, b));
      }
      if (r(4) === 0) frames.push(frame(T.CREDIT, 9, Buffer.from([1, 0, 0, 0])));
    }
    frames.push(endFrame(fileSid, file.length));
    frames.push(endFrame(3, other.reduce((a, b) => a + b.length, 0)));
    const all = Buffer.concat(frames);
    // the reader's buffer comes once a random part of the stream came
    const givenAt = r(2) === 0 ? 0 : r(all.length);
    let given;
    let inPlace = 0;
    let result;
    const start = () => {
      result = gather(chunks, size, (b) => {
        given = b;
        into(b);
      });
    };
    if (givenAt === 0) start();
    for (let off = 0; off < all.length;) {
      if (!result && off >= givenAt) start();
      const buf = dc.nextBuffer();
      const k = Math.min(all.length - off, buf.length, r(2) === 0 ? 1 + r(HDR + 3) : 1 + r(400000));
      all.copy(buf, 0, off, off + k);
      if (given && buf.buffer === given.buffer) inPlace++;
      dc.onRead(k, buf);
      off += k;
      if (r(5) === 0) await new Promise((res) => setImmediate(res));
    }
    if (!result) start();
    const got = await result;
    assert.ok(got.equals(file), `round ${round}: the file byte for byte (${got.length} of ${file.length})`);
    await drained;
    assert.ok(Buffer.concat(out).equals(Buffer.concat(other)), `round ${round}: the process stream byte for byte`);
    if (givenAt < all.length / 2 && size > 100000) assert.ok(inPlace > 0, `round ${round}: no read landed in place`);
  }
});
