// bench/bytes's SDK row: MIB MiB of stdout through commands.run's onStdout
// (process streams on the data connection), in a box named by argv[2] on
// $TUPPER_SOCKET.  Prints the wall ms, or fails when a byte is missing.
import { Sandbox } from '../sdk/js/dist/index.js';

const id = process.argv[2];
const bytes = Number(process.argv[3]);
const sbx = await Sandbox.connect(id);
let got = 0;
const t0 = process.hrtime.bigint();
await sbx.commands.run(`head -c ${bytes} /dev/zero`, {
  timeoutMs: 0,
  maxOutputBytes: 0, // count, keep nothing: the measurement is the path, not a 1 GiB string
  onStdout: (s) => {
    got += Buffer.byteLength(s, 'utf8');
  },
});
const ms = Number(process.hrtime.bigint() - t0) / 1e6;
if (got !== bytes) {
  console.error(`bench: the SDK got ${got} bytes of ${bytes}`);
  process.exit(1);
}
console.log(Math.round(ms));
process.exit(0);
