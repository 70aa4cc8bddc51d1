/**
 * Bytes in the pieces the daemon takes: fs.read and fs.write move at most
 * 1 MiB per call.  Shared by files.write and the HTTP API's uploads.
 */

/** Most raw bytes in one fs.read or fs.write. */
export const CHUNK = 1 << 20;

function joined(parts: Uint8Array[]): Uint8Array {
  return parts.length === 1 ? parts[0] : Buffer.concat(parts);
}

/**
 * The bytes of source, re-cut: whole pieces of `size` bytes as soon as they
 * are there, then the rest; an empty source gives one empty piece (an empty
 * file is still written).  The next piece is read only once the consumer
 * took the last one: a stream is read as fast as it is written, never whole.
 */
export async function* inChunks(source: AsyncIterable<Uint8Array>, size = CHUNK): AsyncGenerator<Uint8Array> {
  let pending: Uint8Array[] = [];
  let pendingLen = 0;
  let gave = false;
  for await (const chunk of source) {
    let c = chunk;
    while (pendingLen + c.length >= size) {
      const take = size - pendingLen;
      pending.push(c.subarray(0, take));
      const piece = joined(pending);
      pending = [];
      pendingLen = 0;
      c = c.subarray(take);
      gave = true;
      yield piece;
    }
    if (c.length > 0) {
      pending.push(c);
      pendingLen += c.length;
    }
  }
  if (pendingLen > 0 || !gave) yield joined(pending);
}

/** A Buffer over the same bytes (no copy). */
export function asBuffer(b: Uint8Array): Buffer {
  return Buffer.from(b.buffer, b.byteOffset, b.byteLength);
}
