/**
 * @tupper/sdk: tupper's sandboxes from TypeScript, shaped like E2B's SDK so
 * that code written against E2B's `Sandbox` moves by changing the import.
 */
export {
  Sandbox,
  SandboxPaginator,
  DEFAULT_SANDBOX_TIMEOUT_MS,
  type SandboxOpts,
  type SandboxConnectionOpts,
  type SandboxLimits,
  type SandboxInfo,
  type SandboxState,
  type SandboxMetrics,
  type SandboxListOpts,
  type NetworkRules,
  type NetworkLogEntry,
} from './sandbox';
export {
  Commands,
  CommandHandle,
  DEFAULT_COMMAND_TIMEOUT_MS,
  type CommandStartOpts,
  type CommandRunOpts,
  type CommandConnectOpts,
  type ProcessInfo,
} from './commands';
export { Pty, DEFAULT_PTY_TIMEOUT_MS, PTY_DIM_MAX, type PtyCreateOpts, type PtySize } from './pty';
export {
  Filesystem,
  FileType,
  FilesystemEventType,
  WatchHandle,
  DEFAULT_WATCH_TIMEOUT_MS,
  type FilesystemEvent,
  type WatchOpts,
  type ByteStream,
  type EntryInfo,
  type WriteInfo,
  type WriteEntry,
  type ReadFormat,
  type FilesystemRequestOpts,
} from './filesystem';
export {
  SandboxError,
  TimeoutError,
  NotFoundError,
  InvalidArgumentError,
  NotEnoughSpaceError,
  CommandExitError,
  PolicyError,
  PermissionError,
  ErrorCode,
  type CommandResult,
  type ErrnoData,
} from './errors';
export { findPolicy, POLICY_FILENAME, type PolicyOpt } from './policy';
export { lockPath, RECIPE_MAX_BYTES, type RecipeOpt } from './recipe';
export { defaultSocket, type ConnectionOpts } from './connection';

import { Sandbox } from './sandbox';
export default Sandbox;
