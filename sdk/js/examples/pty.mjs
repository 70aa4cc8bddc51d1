// A terminal in the sandbox.  Interactive when run from a terminal (your
// keystrokes go to the sandbox's shell; exit the shell to leave); otherwise
// it types a short session itself.
import { Sandbox } from '../dist/index.js';

const sbx = await Sandbox.create({ timeoutMs: 300_000 });
try {
  const interactive = process.stdin.isTTY && process.stdout.isTTY;
  const size = interactive ? { cols: process.stdout.columns, rows: process.stdout.rows } : { cols: 80, rows: 24 };
  let screen = '';
  const terminal = await sbx.pty.create({
    ...size,
    timeoutMs: 0,
    onData: (data) => {
      process.stdout.write(data);
      screen += Buffer.from(data).toString('utf8');
    },
  });
  const shows = async (text) => {
    while (!screen.includes(text)) await new Promise((r) => setTimeout(r, 20));
  };
  if (interactive) {
    process.stdin.setRawMode(true);
    process.stdin.on('data', (d) => void sbx.pty.sendInput(terminal.pid, d));
    process.stdout.on('resize', () => void sbx.pty.resize(terminal.pid, { cols: process.stdout.columns, rows: process.stdout.rows }));
    await terminal.wait().catch(() => {});
    process.stdin.setRawMode(false);
    process.stdin.pause();
  } else {
    await sbx.pty.sendInput(terminal.pid, 'stty size; tty\n');
    await shows('/dev/pts/');
    await sbx.pty.resize(terminal.pid, { cols: 120, rows: 40 });
    await sbx.pty.sendInput(terminal.pid, 'stty size; exit\n');
    await terminal.wait();
  }
} finally {
  await sbx.kill();
}
