/**
 * The data plane (docs/protocol.md, "Stream frames"): file bytes, and a
 * process's stdout, stderr, stdin and terminal ("Process streams"), as binary
 * frames on a second connection to the daemon's socket, with credit both
 * ways, instead of base64 inside JSON.  Node cannot pass file descriptors
 * over unix sockets, so the data connection is opened with a token
 * (stream.channel on the JSON connection, then stream.attach as the only
 * JSON line of the new one); after the attach's reply it carries frames:
 *
 *   u32 len | u8 version (1) | u8 type | u16 flags (0) | u32 sid | payload
 *
 * One data connection per Connection, made on first use; a daemon without
 * the data plane (no stream.channel) makes `dataConn` resolve to null and
 * the callers keep the JSON path.
 */
import * as net from 'node:net';

import type { Connection } from './connection';
import { fromRpcError, SandboxError } from './errors';

export const STREAMS_VERSION = 1;
/** hello's `process_streams` this SDK speaks: process.start/connect and pty.create take `streams`. */
export const PROCESS_STREAMS = 1;
export const HDR = 12;
export const DATA_MAX = 1024 * 1024;
export const WINDOW = 4 * 1024 * 1024;
export const T = { OPEN: 1, DATA: 2, END: 3, ERROR: 4, CREDIT: 5 } as const;
/** a drained stream's credit goes back in pieces of at least this (or a
 * quarter of the window): the daemon keeps three quarters of it meanwhile */
const CREDIT_AT = 256 * 1024;
/** the attach's reply is a short line: a daemon that sends more without a newline is cut off */
const ATTACH_REPLY_MAX = 64 * 1024;
/** one socket read's buffer, where the bytes do not go straight into a reader's own */
const READ_SIZE = 64 * 1024;
/**
 * Node's `onread` (a read lands in a buffer we choose): Node only; Bun and
 * Deno get the bytes as 'data' events, as before.
 */
const ONREAD = typeof process !== 'undefined' && !!process.versions?.node && !('bun' in process.versions) && !('Deno' in globalThis);

const ERRNO_NAMES: Record<number, string> = {
  1: 'EPERM', 2: 'ENOENT', 5: 'EIO', 13: 'EACCES', 17: 'EEXIST', 20: 'ENOTDIR', 21: 'EISDIR',
  22: 'EINVAL', 28: 'ENOSPC', 71: 'EPROTO', 104: 'ECONNRESET', 110: 'ETIMEDOUT', 122: 'EDQUOT',
};

type Ev = { kind: 'data'; pieces: Buffer[]; n: number } | { kind: 'end'; size?: number } | { kind: 'error'; errno: number; msg: string } | { kind: 'credit' };

interface StreamState {
  queue: Ev[];
  credit: number;
  wake?: () => void;
  /** a process's stdin or terminal we write: credit wakes `cwake`, not the queue */
  input?: boolean;
  cwake?: () => void;
  /** why the stream takes no more (its END or ERROR, the connection's end) */
  over?: string;
  /** drained (a process's output): a DATA frame's payload goes to the sink in
   * the pieces the socket gives, before the frame is whole, never joined */
  pieces?: boolean;
  /** payload bytes of the DATA frames handed on so far */
  got: number;
  /** a read as bytes: the buffer the whole file goes into, from offset 0;
   * a socket read in the middle of a DATA frame lands in it at `got` plus
   * what came of the frame, so the reader finds those bytes in place */
  into?: Buffer;
}

/** The stream ids process.start's reply gives (`streams`). */
export interface ProcessStreamIds {
  stdout?: number;
  stderr?: number;
  stdin?: number;
  pty?: number;
}

/** What goes to a process's stdin (or terminal) stream. */
export interface ProcessInput {
  /** Sends bytes within the stream's credit (waits for more); rejects once the process takes no more. */
  write(b: Buffer): Promise<void>;
  /** The end of the input: the process's stdin closes once it read what came. */
  end(): void;
}

/** A frame's header, for a payload of len bytes. */
function header(type: number, sid: number, len: number): Buffer {
  const h = Buffer.alloc(HDR);
  h.writeUInt32LE(len, 0);
  h.writeUInt8(STREAMS_VERSION, 4);
  h.writeUInt8(type, 5);
  h.writeUInt16LE(0, 6);
  h.writeUInt32LE(sid, 8);
  return h;
}

/** One frame as bytes. */
export function frame(type: number, sid: number, payload?: Buffer): Buffer {
  const len = payload ? payload.length : 0;
  const h = header(type, sid, len);
  return payload && len > 0 ? Buffer.concat([h, payload]) : h;
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n, 0);
  return b;
}

const EPROTO = 71;
/** the most a CREDIT may give */
const CREDIT_MAX = 2 ** 30;

/**
 * Why the header at off of b (len, type read from it) breaks the frame rules
 * (docs/protocol.md, "Frames"), else undefined: the version and flags, the
 * type, and the payload's size for the type.  A frame that passes has a
 * payload its reader can read in full without looking again.
 */
export function badHeader(b: Buffer, off: number, len: number, type: number): string | undefined {
  if (b[off + 4] !== STREAMS_VERSION) return `version ${b[off + 4]}, not ${STREAMS_VERSION}`;
  if (b[off + 6] !== 0 || b[off + 7] !== 0) return 'flags not 0';
  switch (type) {
    case T.DATA:
      return len > DATA_MAX ? `DATA of ${len} bytes (at most ${DATA_MAX})` : undefined;
    case T.OPEN:
      return len === 8 ? undefined : `OPEN of ${len} bytes (8)`;
    case T.CREDIT:
      return len === 4 ? undefined : `CREDIT of ${len} bytes (4)`;
    case T.END:
      return len === 0 || len === 8 ? undefined : `END of ${len} bytes (0 or 8)`;
    case T.ERROR:
      return len >= 4 && len <= 4100 ? undefined : `ERROR of ${len} bytes (4 to 4100)`;
    default:
      return `unknown type ${type}`;
  }
}

function streamError(ev: { errno: number; msg: string }, method: string): SandboxError {
  return fromRpcError({ code: -32002, message: ev.msg, data: { errno: ev.errno, code: ERRNO_NAMES[ev.errno] ?? `E${ev.errno}` } }, method);
}

/** A data connection: frames in both directions, streams by id. */
export class DataConn {
  private readonly sock: net.Socket;
  private readonly streams = new Map<number, StreamState>();
  /** the last ids forgotten by a handle's end (their late frames are dropped) */
  private readonly gone = new Set<number>();
  private parts: Buffer[] = [];
  private have = 0;
  /** what `have` must reach for the next step: a header, then (hdr set) its payload */
  private need = HDR;
  private hdr?: Buffer;
  /** credit a drained stream owes the daemon goes back once this much gathered */
  private creditAt = CREDIT_AT;
  private closedWith?: string;
  private active = 0;
  private readonly feedBound = (b: Buffer): void => this.feed(b);
  /** where the socket's bytes go: the attach's reply line, then feed() */
  private onBytes: (b: Buffer) => void = this.feedBound;
  /** the generic buffer of the next socket read, and the slice of a reader's buffer it went to instead */
  private rbuf?: Buffer;
  private direct?: Buffer;

  private constructor(sock: net.Socket) {
    this.sock = sock;
  }

  /** Opens the data connection of conn; rejects when the daemon has none. */
  static async open(conn: Connection, window = WINDOW): Promise<DataConn> {
    const { token } = await conn.call<{ token: string }>('stream.channel', {});
    let dc: DataConn | undefined;
    let early: Buffer[] = []; // before dc exists (none: the daemon speaks after the attach)
    const onread = ONREAD
      ? {
          buffer: (): Buffer => (dc ? dc.nextBuffer() : Buffer.allocUnsafe(READ_SIZE)),
          callback: (n: number, buf: Buffer): boolean => {
            if (dc) dc.onRead(n, buf);
            else early.push(Buffer.from(buf.subarray(0, n)));
            return true;
          },
        }
      : undefined;
    const sock = await new Promise<net.Socket>((resolve, reject) => {
      const s = net.createConnection(onread ? { path: conn.socketPath, onread } : { path: conn.socketPath });
      s.once('error', reject);
      s.once('connect', () => {
        s.off('error', reject);
        resolve(s);
      });
    });
    sock.setNoDelay?.(true);
    const d = (dc = new DataConn(sock));
    d.creditAt = Math.min(CREDIT_AT, Math.floor(window / 4));
    await new Promise<void>((resolve, reject) => {
      let line: Buffer[] = [];
      const onData = (chunk: Buffer): void => {
        line.push(chunk);
        const all = Buffer.concat(line);
        const nl = all.indexOf(0x0a);
        if (nl < 0) {
          line = [all];
          if (all.length > ATTACH_REPLY_MAX) {
            sock.destroy();
            reject(new SandboxError(`stream.attach: the daemon's reply is over ${ATTACH_REPLY_MAX} bytes`));
          }
          return;
        }
        if (!onread) sock.off('data', onData);
        d.onBytes = d.feedBound;
        let reply: { result?: unknown; error?: { message?: unknown } } | null;
        try {
          reply = JSON.parse(all.subarray(0, nl).toString('utf8'));
        } catch {
          reply = { error: { message: 'not JSON' } };
        }
        if (typeof reply !== 'object' || reply === null || !reply.result) {
          sock.destroy();
          const m = reply?.error?.message;
          reject(new SandboxError(`stream.attach: ${typeof m === 'string' ? m : 'no reply'}`));
          return;
        }
        d.listen(!onread);
        if (nl + 1 < all.length) d.feed(all.subarray(nl + 1));
        resolve();
      };
      d.onBytes = onData;
      if (onread) {
        for (const b of early) onData(b);
        early = [];
      } else {
        sock.on('data', onData);
      }
      sock.once('close', () => reject(new SandboxError('stream.attach: the daemon closed the connection')));
      sock.write(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'stream.attach', params: { token, window } }) + '\n');
    });
    // ref'd until attached (the attach is a request in flight: a script whose
    // only wait it is must not end there); from now on only a stream in
    // progress keeps Node alive
    if (d.active === 0) sock.unref();
    return d;
  }

  private listen(data: boolean): void {
    if (data) {
      this.sock.on('data', (c: Buffer) => {
        try {
          this.feed(c);
        } catch (e) {
          this.down(`reading the data connection failed: ${(e as Error).message}`);
        }
      });
    }
    this.sock.on('close', () => this.down('the data connection closed'));
    this.sock.on('error', (e) => this.down(e.message));
  }

  /**
   * The buffer the next socket read goes into (Node's `onread`): in the
   * middle of a DATA frame of a stream read into one buffer, the slice of
   * that buffer where the frame's next bytes belong, no longer than the
   * frame's rest (so the read never takes the next frame's header); else a
   * buffer of READ_SIZE.
   */
  private nextBuffer(): Buffer {
    this.direct = undefined;
    const h = this.hdr;
    if (h !== undefined && h[5] === T.DATA && !this.closedWith) {
      const s = this.streams.get(h.readUInt32LE(8));
      if (s?.into && !s.pieces) {
        const at = s.got + this.have; // the frame's bytes that came are still in parts
        const n = Math.min(this.need - this.have, s.into.length - at);
        if (n > 0) return (this.direct = s.into.subarray(at, at + n));
      }
    }
    this.rbuf ??= Buffer.allocUnsafe(READ_SIZE);
    return this.rbuf;
  }

  /** n bytes read into buf (nextBuffer's); never throws (it runs in Node's read callback). */
  private onRead(n: number, buf: Buffer): void {
    if (n <= 0) return;
    try {
      this.readInto(n, buf);
    } catch (e) {
      this.down(`reading the data connection failed: ${(e as Error).message}`);
    }
  }

  private readInto(n: number, buf: Buffer): void {
    if (buf === this.direct) {
      this.direct = undefined;
      this.onBytes(buf.subarray(0, n)); // in place already: the reader skips its copy
      return;
    }
    let off = 0;
    if (this.parts.length === 0 && this.hdr === undefined && this.onBytes === this.feedBound) {
      // frames other than DATA that the read holds whole are read where they
      // are (a command's OPENs and ENDs): no copy, no slice
      while (n - off >= HDR) {
        const len = buf.readUInt32LE(off);
        const type = buf[off + 5];
        const bad = badHeader(buf, off, len, type);
        if (bad !== undefined) {
          this.bad(bad);
          return;
        }
        if (type === T.DATA || n - off - HDR < len) break;
        this.frame(type, buf.readUInt32LE(off + 8), buf, off + HDR, len);
        if (this.closedWith) return;
        off += HDR + len;
      }
      if (off === n) return;
    }
    let b: Buffer;
    if (off === 0 && n >= READ_SIZE / 2) {
      b = buf.subarray(0, n); // handed on: the next read gets a new buffer
      if (buf === this.rbuf) this.rbuf = undefined;
    } else {
      b = Buffer.allocUnsafe(n - off); // a small read is copied out: the buffer is read into again
      buf.copy(b, 0, off, n);
    }
    this.onBytes(b);
  }

  private state(sid: number): StreamState {
    let s = this.streams.get(sid);
    if (!s) {
      s = { queue: [], credit: 0, got: 0 };
      // a late frame of a stream we let go of is not kept
      if (!this.gone.has(sid)) this.streams.set(sid, s);
    }
    return s;
  }

  private push(sid: number, ev: Ev): void {
    const s = this.state(sid);
    s.queue.push(ev);
    const w = s.wake;
    s.wake = undefined;
    w?.();
  }

  private feed(chunk: Buffer): void {
    this.parts.push(chunk);
    this.have += chunk.length;
    // a frame arrives in many socket reads: a DATA frame's payload is handed
    // on as those reads (no join: a read as bytes copies each once, into its
    // result), a process's output even before its frame is whole; any other
    // frame is joined once it is whole
    while (this.have >= this.need || (this.hdr !== undefined && this.have > 0)) {
      if (this.hdr === undefined) {
        const h = this.take(HDR);
        const len = h.readUInt32LE(0);
        const bad = badHeader(h, 0, len, h[5]);
        if (bad !== undefined) {
          this.bad(bad);
          return;
        }
        this.hdr = h;
        this.need = len;
        continue;
      }
      const h = this.hdr;
      const type = h[5];
      const sid = h.readUInt32LE(8);
      if (type === T.DATA && this.streams.get(sid)?.pieces) {
        // a process's output goes on as it comes, before its frame is whole
        const k = Math.min(this.have, this.need);
        if (k > 0) this.pushData(sid, this.pieces(k), k);
        this.need -= k;
        if (this.need > 0) return;
        this.hdr = undefined;
        this.need = HDR;
      } else {
        if (this.have < this.need) return; // the rest of the frame is still to come
        const len = this.need;
        this.hdr = undefined;
        this.need = HDR;
        if (type === T.DATA) this.pushData(sid, this.pieces(len), len);
        else this.frame(type, sid, this.take(len), 0, len);
      }
      if (this.closedWith) return;
    }
  }

  private pushData(sid: number, pieces: Buffer[], n: number): void {
    this.state(sid).got += n;
    this.push(sid, { kind: 'data', pieces, n });
  }

  /** The next n bytes received, as slices of the socket's reads. */
  private pieces(n: number): Buffer[] {
    const out: Buffer[] = [];
    this.have -= n;
    while (n > 0) {
      const p = this.parts[0];
      if (p.length <= n) {
        out.push(p);
        this.parts.shift();
        n -= p.length;
      } else {
        out.push(p.subarray(0, n));
        this.parts[0] = p.subarray(n);
        n = 0;
      }
    }
    return out;
  }

  /** The next n bytes received, as one buffer. */
  private take(n: number): Buffer {
    const ps = this.pieces(n);
    return ps.length === 1 ? ps[0] : Buffer.concat(ps, n);
  }

  private wakeInput(s: StreamState): void {
    const w = s.cwake;
    s.cwake = undefined;
    w?.();
  }

  /**
   * A whole frame other than DATA, its payload the len bytes of b at off
   * (badHeader passed it: the sizes are the protocol's, every read below is
   * within them).
   */
  private frame(type: number, sid: number, b: Buffer, off: number, len: number): void {
    switch (type) {
      case T.OPEN: {
        const s = this.state(sid);
        s.credit = b.readUInt32LE(off + 4);
        if (s.input) this.wakeInput(s);
        else if (!s.pieces) this.push(sid, { kind: 'credit' }); // a drained stream sends nothing
        break;
      }
      case T.END: {
        const s = this.state(sid);
        s.over ??= 'the process takes no more input';
        this.wakeInput(s);
        this.push(sid, { kind: 'end', size: len === 8 ? Number(b.readBigUInt64LE(off)) : undefined });
        break;
      }
      case T.ERROR: {
        const errno = b.readUInt32LE(off);
        const msg = b.toString('utf8', off + 4, off + len);
        if (sid === 0) {
          this.down(msg || 'the daemon closed the data connection', errno);
        } else {
          const s = this.state(sid);
          s.over = msg || 'the stream failed';
          this.wakeInput(s);
          this.push(sid, { kind: 'error', errno, msg });
        }
        break;
      }
      case T.CREDIT: {
        const n = b.readUInt32LE(off);
        if (n === 0 || n > CREDIT_MAX) {
          this.bad(`CREDIT of ${n} bytes on stream ${sid} (1 to 2^30)`);
          return;
        }
        const s = this.state(sid);
        s.credit += n;
        if (s.input) this.wakeInput(s);
        else if (!s.pieces) this.push(sid, { kind: 'credit' });
        break;
      }
      default:
        break;
    }
  }

  /**
   * The daemon broke the frame rules (docs/protocol.md, "Frames"): it hears
   * why (ERROR EPROTO on sid 0, as it would say it), the connection closes
   * and every stream on it fails with that reason.
   */
  private bad(rule: string): void {
    if (this.closedWith) return;
    const why = `the daemon sent a bad frame: ${rule}`;
    try {
      this.sock.write(frame(T.ERROR, 0, Buffer.concat([u32(EPROTO), Buffer.from(why)])));
    } catch {
      // the connection is going anyway
    }
    this.down(why, EPROTO);
  }

  private down(why: string, errno = 104): void {
    if (this.closedWith) return;
    this.closedWith = why;
    this.sock.destroy();
    for (const [sid, s] of this.streams) {
      s.over ??= why;
      this.wakeInput(s);
      this.push(sid, { kind: 'error', errno, msg: why });
    }
  }

  get closed(): boolean {
    return this.closedWith !== undefined;
  }

  private async next(sid: number): Promise<Ev> {
    const s = this.state(sid);
    while (s.queue.length === 0) {
      if (this.closedWith) return { kind: 'error', errno: 104, msg: this.closedWith };
      await new Promise<void>((r) => {
        s.wake = r;
      });
    }
    return s.queue.shift() as Ev;
  }

  private async send(b: Buffer): Promise<void> {
    if (this.closedWith) throw new SandboxError(this.closedWith);
    if (!this.sock.write(b)) await new Promise<void>((r) => this.sock.once('drain', () => r()));
  }

  /**
   * Sends a DATA frame of b with its header as one writev, b not copied:
   * the caller keeps b unchanged until the write resolves (writeFile's
   * caller awaits the whole file).
   */
  private async sendData(sid: number, b: Buffer): Promise<void> {
    if (this.closedWith) throw new SandboxError(this.closedWith);
    this.sock.cork();
    this.sock.write(header(T.DATA, sid, b.length));
    const ok = this.sock.write(b);
    this.sock.uncork();
    if (!ok) await new Promise<void>((r) => this.sock.once('drain', () => r()));
  }

  private begin(): void {
    if (this.active++ === 0) this.sock.ref();
  }

  private finish(sid: number): void {
    this.streams.delete(sid);
    if (--this.active === 0 && !this.closedWith) this.sock.unref();
  }

  /**
   * Reads a file (params as fs.read_stream's) as an async iterator of
   * chunks; credit for each chunk goes back once the consumer took it, so
   * no more than the window is ever ahead of the reader.
   */
  async readFile(
    conn: Connection,
    params: Record<string, unknown>,
  ): Promise<{ size: number; chunks: AsyncIterable<Buffer[]>; into: (b: Buffer) => void }> {
    const r = await conn.call<{ stream: number; size: number }>('fs.read_stream', params);
    const sid = r.stream;
    this.begin();
    const self = this;
    // a reader that gathers the whole file gives its buffer: the socket reads
    // into it where they can (a piece of a chunk that is a view of it at the
    // reader's offset is there already)
    const into = (b: Buffer): void => {
      const s = self.state(sid);
      if (!s.over && !self.closedWith) s.into = b;
    };
    async function* chunks(): AsyncGenerator<Buffer[]> {
      let ended = false;
      try {
        for (;;) {
          const ev = await self.next(sid);
          if (ev.kind === 'data') {
            yield ev.pieces;
            await self.send(frame(T.CREDIT, sid, u32(ev.n)));
          } else if (ev.kind === 'end') {
            ended = true;
            return;
          } else if (ev.kind === 'error') {
            ended = true;
            throw streamError(ev, 'files.read');
          }
        }
      } finally {
        // a consumer that stopped early: the daemon ends the stream
        if (!ended && !self.closedWith) self.sock.write(frame(T.ERROR, sid, Buffer.concat([u32(125), Buffer.from('the reader stopped')])));
        self.finish(sid);
      }
    }
    return { size: r.size, chunks: chunks(), into };
  }

  /** Writes the chunks to a file (params as fs.write_stream's); resolves with the bytes written. */
  async writeFile(conn: Connection, params: Record<string, unknown>, data: AsyncIterable<Uint8Array>): Promise<number> {
    const r = await conn.call<{ stream: number }>('fs.write_stream', params);
    const sid = r.stream;
    const s = this.state(sid);
    this.begin();
    try {
      const failed = (): Ev | undefined => s.queue.find((e) => e.kind === 'error');
      for await (const piece of data) {
        let b = Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
        while (b.length > 0) {
          const f = failed();
          if (f && f.kind === 'error') throw streamError(f, 'files.write');
          while (s.credit === 0) {
            const ev = await this.next(sid);
            if (ev.kind === 'error') throw streamError(ev, 'files.write');
          }
          const n = Math.min(b.length, s.credit, DATA_MAX);
          s.credit -= n;
          await this.sendData(sid, b.subarray(0, n));
          b = b.subarray(n);
        }
      }
      await this.send(frame(T.END, sid));
      for (;;) {
        const ev = await this.next(sid);
        if (ev.kind === 'end') return ev.size ?? 0;
        if (ev.kind === 'error') throw streamError(ev, 'files.write');
      }
    } finally {
      this.finish(sid);
    }
  }

  /**
   * Reads a process's stream (stdout, stderr or its terminal) into sink; the
   * daemon gets credit for a chunk once sink is done with it (a sink that
   * returns a promise is waited for), so a slow sink slows the process down
   * and loses nothing.  Resolves with the bytes read (END's size).
   */
  async drain(sid: number, sink: (b: Buffer) => void | Promise<void>, method: string): Promise<number> {
    this.begin();
    const st = this.state(sid);
    st.pieces = true;
    st.queue = st.queue.filter((e) => e.kind !== 'credit'); // its OPEN may be in already
    let owed = 0;
    try {
      for (;;) {
        const ev = await this.next(sid);
        if (ev.kind === 'data') {
          for (const b of ev.pieces) await sink(b);
          // the credit goes back in pieces of creditAt: the daemon has at
          // least window - creditAt to send on meanwhile, so it never waits for it
          owed += ev.n;
          if (owed >= this.creditAt && !this.closedWith) {
            const n = owed;
            owed = 0;
            await this.send(frame(T.CREDIT, sid, u32(n)));
          }
        } else if (ev.kind === 'end') {
          return ev.size ?? 0;
        } else if (ev.kind === 'error') {
          throw streamError(ev, method);
        }
      }
    } finally {
      const s = this.streams.get(sid);
      if (s && !s.input) this.streams.delete(sid);
      if (--this.active === 0 && !this.closedWith) this.sock.unref();
    }
  }

  /** Stops reading a process's stream: the daemon ends it (the process's output then goes unread). */
  cancel(sid: number, why: string): void {
    const s = this.streams.get(sid);
    if (this.closedWith || !s || s.over) return; // over already (its END came): nothing to stop
    this.sock.write(frame(T.ERROR, sid, Buffer.concat([u32(125), Buffer.from(why)])));
    s.over = why;
    this.push(sid, { kind: 'error', errno: 125, msg: why });
  }

  /** Drops what is kept of stream sid (a handle's end: its stdin's state goes too). */
  forget(sid: number): void {
    this.streams.delete(sid);
    this.gone.add(sid);
    if (this.gone.size > 64) this.gone.delete(this.gone.values().next().value as number);
  }

  /** The writer of a process's stdin or terminal stream sid. */
  input(sid: number): ProcessInput {
    const s = this.state(sid);
    s.input = true;
    s.queue = s.queue.filter((e) => e.kind !== 'credit'); // its OPEN may be in already
    return {
      write: async (b: Buffer): Promise<void> => {
        let off = 0;
        while (off < b.length) {
          while (s.credit === 0 && !s.over && !this.closedWith) {
            await new Promise<void>((r) => {
              s.cwake = r;
            });
          }
          if (s.over || this.closedWith) throw new SandboxError(`stdin: ${s.over ?? this.closedWith}`);
          const n = Math.min(b.length - off, s.credit, DATA_MAX);
          s.credit -= n;
          await this.send(frame(T.DATA, sid, b.subarray(off, off + n)));
          off += n;
        }
      },
      end: (): void => {
        if (s.over || this.closedWith) return;
        this.sock.write(frame(T.END, sid));
      },
    };
  }

  close(): void {
    this.down('closed');
  }
}

const conns = new WeakMap<Connection, Promise<DataConn | null>>();

/**
 * The data connection of conn, made on first use; null when the daemon has
 * no data plane (the JSON path is used then).  A data connection that went
 * down is made again on the next call.
 */
export async function dataConn(conn: Connection): Promise<DataConn | null> {
  let p = conns.get(conn);
  if (p) {
    const dc = await p;
    if (dc === null || !dc.closed) return dc;
  }
  p = DataConn.open(conn).catch((e: unknown) => {
    const code = (e as { code?: unknown }).code;
    if (code === -32601) return null; // an older daemon: no stream.channel
    throw e;
  });
  conns.set(conn, p);
  return p;
}
