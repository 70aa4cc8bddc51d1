/**
 * What the route groups of one server share: how to reach the daemon, the
 * bounds it was given, its Sandbox objects and its commands.
 */
import type { ConnectionOpts } from '../connection';
import type { BoxCache } from './box-cache';
import type { Processes } from './processes';

export interface ServerContext {
  /** How to reach the daemon (the server's socket and request timeout, if given). */
  readonly conn: ConnectionOpts;
  /** Largest JSON body, bytes. */
  readonly maxJson: number;
  /** Largest raw body (a file upload, stdin), bytes. */
  readonly maxBody: number;
  /** Most output held for one command stream, bytes. */
  readonly maxOutput: number;
  readonly boxes: BoxCache;
  readonly processes: Processes;
}
