// bench/bytes's SDK file rows: files.write of the file argv[3] (read into
// memory first, outside the timing) to the new path argv[4] in the box
// named by argv[2] on $TUPPER_SOCKET, or with argv[5] = 'read' files.read of
// argv[4] as bytes, checked byte for byte against argv[3]; with argv[5] =
// 'host' Node's own fs.readFileSync of argv[3] on the host (no box, no
// daemon): the floor of any read into a new Buffer of that size, since the
// Buffer's pages are faulted in as the bytes arrive.  Prints the wall ms of
// the one call, or fails.
import { readFileSync } from 'node:fs';
import { Sandbox } from '../sdk/js/dist/index.js';

const [id, src, path, mode] = process.argv.slice(2);
const data = readFileSync(src);
if (mode === 'host') {
  const t0 = process.hrtime.bigint();
  const back = readFileSync(src);
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (!back.equals(data)) process.exit(1);
  console.log(Math.round(ms));
  process.exit(0);
}
const sbx = await Sandbox.connect(id);
const t0 = process.hrtime.bigint();
if (mode === 'read') {
  const back = await sbx.files.read(path, { format: 'bytes' });
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (!Buffer.from(back.buffer, back.byteOffset, back.byteLength).equals(data)) {
    console.error(`bench: files.read of ${path} is not the source (${back.length} bytes)`);
    process.exit(1);
  }
  console.log(Math.round(ms));
} else {
  await sbx.files.write(path, data);
  console.log(Math.round(Number(process.hrtime.bigint() - t0) / 1e6));
}
process.exit(0);
