/**
 * How the daemon's replies and notifications carry bytes and a process's
 * end (docs/protocol.md): read the same way by the SDK's handles, its
 * files and the HTTP API's streams.
 */

/** The bytes of a `data` field: UTF-8 text when `encoding` says utf8, else base64. */
export function decodeData(data: unknown, encoding: unknown): Buffer {
  return Buffer.from(typeof data === 'string' ? data : '', encoding === 'utf8' ? 'utf8' : 'base64');
}

/** The stream a process.output notification belongs to. */
export function outputStream(p: Record<string, unknown>): 'stdout' | 'stderr' {
  return p.stream === 'stderr' ? 'stderr' : 'stdout';
}

/** A process.exit notification: its exit code, signal, and the error a result reports, if any. */
export function exitStatus(p: Record<string, unknown>): { exitCode: number; signal: number; error?: string } {
  const exitCode = typeof p.exit_code === 'number' ? p.exit_code : -1;
  const signal = typeof p.signal === 'number' ? p.signal : 0;
  const out: { exitCode: number; signal: number; error?: string } = { exitCode, signal };
  if (signal) out.error = signal === 9 ? 'signal: killed' : `signal: ${signal}`;
  else if (exitCode !== 0) out.error = `exit status ${exitCode}`;
  // the sandbox's memory limit killed it (docs/limits.md)
  if (p.oom_killed === true) out.error = 'out of memory: killed by the sandbox\'s memory limit';
  return out;
}
