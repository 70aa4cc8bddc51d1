/**
 * What a Sandbox object lends its modules (commands, files, terminals): its
 * id, its connection, and its accounts.
 */
import type { AccountInfo } from './account';
import type { Connection } from './connection';

export interface SandboxLink extends AccountInfo {
  readonly sandboxId: string;
  readonly conn: Connection;
  /** True once this SDK killed the sandbox. */
  readonly killed: boolean;
}
