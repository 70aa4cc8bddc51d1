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
