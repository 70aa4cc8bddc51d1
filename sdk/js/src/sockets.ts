/**
 * Which socket a client that was given none uses (docs/install.md, "Which
 * socket a client uses"), as the CLI (lua/tupper/util/paths.lua) and the
 * Python SDK decide it: $TUPPER_SOCKET alone when set; root: the system's
 * socket; any other user: its own, then the system's when its own is not
 * there and the system's is, so a member of the tupper group reaches the
 * system daemon with nothing set.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';

/** The system daemon's socket (tupper.socket's). */
export const SYSTEM_SOCKET = '/run/tupper/tupper.sock';

type Env = Record<string, string | undefined>;

/** The system's socket; $TUPPER_SYSTEM_SOCKET moves it, for tests. */
export function systemSocket(env: Env = process.env): string {
  return env.TUPPER_SYSTEM_SOCKET || SYSTEM_SOCKET;
}

/**
 * Where a client given no socket looks, in order: $TUPPER_SOCKET alone;
 * root: the system's; else $XDG_RUNTIME_DIR/tupper.sock (or
 * /tmp/tupper-UID/tupper.sock), then the system's.  uid and env default to
 * this process's.
 */
export function defaultSockets(uid?: number, env: Env = process.env): string[] {
  if (env.TUPPER_SOCKET) return [env.TUPPER_SOCKET];
  const id = uid ?? (typeof process.getuid === 'function' ? process.getuid() : -1);
  const system = systemSocket(env);
  if (id === 0) return [system];
  const own = env.XDG_RUNTIME_DIR ? path.join(env.XDG_RUNTIME_DIR, 'tupper.sock') : `/tmp/tupper-${id}/tupper.sock`;
  return own === system ? [own] : [own, system];
}

function isSocket(p: string): boolean {
  try {
    return fs.statSync(p).isSocket();
  } catch {
    return false;
  }
}

/**
 * The socket to connect to: the first of defaultSockets() that is a
 * socket, else the first; and, for the error when nothing answers, the
 * other places looked at (" nor at PATH (ENOENT)").
 */
export function clientSocket(uid?: number, env: Env = process.env): { path: string; alsoTried: string } {
  const places = defaultSockets(uid, env);
  const found = places.find(isSocket);
  if (found !== undefined) {
    const before = places.slice(0, places.indexOf(found));
    return { path: found, alsoTried: before.map((p) => `, nothing at ${p}`).join('') };
  }
  return { path: places[0], alsoTried: places.slice(1).map((p) => ` nor at ${p} (ENOENT)`).join('') };
}
