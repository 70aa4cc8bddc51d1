/**
 * Option objects as E2B's SDK takes them: an option this SDK does not know
 * is an InvalidArgumentError naming it and the known ones, in JavaScript
 * as in TypeScript (where the types refuse it already), never dropped.
 */
import { AbortError } from './command-handle';
import { InvalidArgumentError } from './errors';

/**
 * What every request of commands, files and pty takes besides its own
 * options, as E2B's `CommandRequestOpts` / `FilesystemRequestOpts`.
 */
export interface RequestOpts {
  /** Accepted for E2B compatibility; requests are bounded by the sandbox's requestTimeoutMs. */
  requestTimeoutMs?: number;
  /**
   * E2B's per-request AbortSignal.  A request is one short exchange on the
   * daemon's socket: one already aborted is not sent (AbortError); one
   * aborted while under way still completes.
   */
  signal?: AbortSignal;
}

/** The keys of RequestOpts. */
export const REQUEST_KEYS = ['requestTimeoutMs', 'signal'] as const;

/**
 * InvalidArgumentError for every key of opts not in known (a key whose
 * value is undefined is no option), or one in `unsupported`, with its
 * reason.  Not an object at all: InvalidArgumentError too.
 */
export function checkKeys(
  opts: unknown,
  known: ReadonlySet<string> | readonly string[],
  what: string,
  unsupported: Readonly<Record<string, string>> = {},
): void {
  if (opts === undefined || opts === null) return;
  if (typeof opts !== 'object' || Array.isArray(opts)) throw new InvalidArgumentError(`${what}: options must be an object`);
  const set: ReadonlySet<string> = known instanceof Set ? known : new Set(known as readonly string[]);
  for (const k of Object.keys(opts)) {
    if ((opts as Record<string, unknown>)[k] === undefined) continue;
    if (Object.prototype.hasOwnProperty.call(unsupported, k)) {
      throw new InvalidArgumentError(`${what}: option '${k}' is not supported: ${unsupported[k]}`);
    }
    if (!set.has(k)) {
      throw new InvalidArgumentError(`${what}: unknown option '${k}' (known: ${[...set].sort().join(', ')})`);
    }
  }
}

/**
 * checkKeys with the request keys added, then the request's signal: not an
 * AbortSignal is InvalidArgumentError, one already aborted AbortError.
 */
export function checkRequestOpts(opts: unknown, known: readonly string[], what: string): void {
  checkKeys(opts, [...known, ...REQUEST_KEYS], what);
  checkSignal((opts as RequestOpts | undefined)?.signal, what);
}

/** A request's signal: an AbortSignal (else InvalidArgumentError) not yet aborted (else AbortError). */
export function checkSignal(signal: unknown, what: string): void {
  if (signal === undefined) return;
  if (typeof signal !== 'object' || signal === null || typeof (signal as AbortSignal).aborted !== 'boolean') {
    throw new InvalidArgumentError(`${what}: signal must be an AbortSignal`);
  }
  if ((signal as AbortSignal).aborted) throw new AbortError(`${what}: aborted before the request was sent`, (signal as AbortSignal).reason);
}
