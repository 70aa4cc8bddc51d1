/**
 * Policy files (docs/policy.md): a `tupper.lua` next to an agent project
 * says what its sandboxes may do.  `Sandbox.create` sends one to the daemon,
 * which evaluates it in its locked-down Lua VM and enforces it for the
 * sandbox's whole life.
 */
import { open } from 'node:fs/promises';
import * as path from 'node:path';
import { InvalidArgumentError } from './errors';

/** The file name looked for from the working directory upward. */
export const POLICY_FILENAME = 'tupper.lua';
/** The largest policy file the daemon takes over the socket. */
export const POLICY_MAX_BYTES = 256 * 1024;

/**
 * What `Sandbox.create({policy})` takes: a path to a policy file, its text
 * (`{source, name}`), or `false` for none.  Left out, the nearest
 * `tupper.lua` from `process.cwd()` upward is sent, as the CLI does.
 */
export type PolicyOpt = string | { source: string; name?: string } | false;

/**
 * Reads at most max bytes of file as UTF-8 (InvalidArgumentError, naming
 * `what` and the file, past that); undefined when the file does not exist.
 * Shared by policy and recipe files.
 */
export async function readFileCapped(file: string, max: number, what: string): Promise<string | undefined> {
  let fh;
  try {
    fh = await open(file, 'r');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
  try {
    const buf = Buffer.alloc(max + 1);
    let len = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, len, buf.length - len, null);
      if (bytesRead === 0) break;
      len += bytesRead;
      if (len > max) throw new InvalidArgumentError(`${what} ${file}: larger than ${max} bytes`);
    }
    return buf.subarray(0, len).toString('utf8');
  } finally {
    await fh.close();
  }
}

/** The nearest tupper.lua at or above dir, or undefined. */
export async function findPolicy(dir: string = process.cwd()): Promise<string | undefined> {
  let d = path.resolve(dir);
  for (;;) {
    const candidate = path.join(d, POLICY_FILENAME);
    try {
      const fh = await open(candidate, 'r');
      await fh.close();
      return candidate;
    } catch {
      /* not here */
    }
    const up = path.dirname(d);
    if (up === d) return undefined;
    d = up;
  }
}

/** The `policy` param of sandbox.create for opt, or undefined for none. */
export async function policyParam(opt: PolicyOpt | undefined): Promise<{ source: string; name: string } | undefined> {
  if (opt === false) return undefined;
  if (typeof opt === 'object' && opt !== null) {
    if (typeof opt.source !== 'string') throw new InvalidArgumentError('policy.source must be a string');
    if (Buffer.byteLength(opt.source) > POLICY_MAX_BYTES) {
      throw new InvalidArgumentError(`policy: larger than ${POLICY_MAX_BYTES} bytes`);
    }
    return { source: opt.source, name: opt.name ?? POLICY_FILENAME };
  }
  if (opt !== undefined && typeof opt !== 'string') throw new InvalidArgumentError('policy must be a path, {source} or false');
  const file = opt === undefined ? await findPolicy() : path.resolve(opt);
  if (file === undefined) return undefined;
  const source = await readFileCapped(file, POLICY_MAX_BYTES, 'policy');
  if (source === undefined) throw new InvalidArgumentError(`policy ${file}: no such file`);
  return { source, name: file };
}
