/**
 * @tupper/sdk: tupper's sandboxes from TypeScript, shaped like E2B's SDK so
 * that code written against E2B's `Sandbox` moves by changing the import.
 */
export { Sandbox, DEFAULT_SANDBOX_TIMEOUT_MS, type SandboxConnectOpts, type SandboxPauseOpts } from './sandbox';
export { Volume, VolumeFileType, type VolumeInfo, type VolumeAndToken, type VolumeEntryStat, type VolumeMetadataOpts, type VolumeWriteOpts, type VolumeCreateOpts } from './volume';
export { SandboxPaginator, type SandboxListOpts, type SandboxListOrder } from './paginator';
export { SnapshotPaginator, FORK_MAX, type SnapshotInfo, type CreateSnapshotOpts, type SandboxForkOpts } from './snapshot';
export { type SandboxInfo, type SandboxState, type SandboxMetrics, type SandboxMetricsOpts } from './sandbox-info';
export {
  ALL_TRAFFIC,
  type SandboxNetworkOpts,
  type SandboxNetworkUpdate,
  type SandboxNetworkSelector,
  type SandboxNetworkSelectorContext,
} from './e2b-network';
export {
  type SandboxOpts,
  type SandboxConnectionOpts,
  type SandboxLimits,
  type NetworkRules,
  type NetworkLogEntry,
} from './sandbox-opts';
export {
  Commands,
  DEFAULT_COMMAND_TIMEOUT_MS,
  type CommandStartOpts,
  type CommandRunOpts,
  type CommandConnectOpts,
  type CommandRequestOpts,
  type ProcessInfo,
} from './commands';
export { CommandHandle, AbortError } from './command-handle';
export { Pty, DEFAULT_PTY_TIMEOUT_MS, PTY_DIM_MAX, type PtyCreateOpts, type PtyConnectOpts, type PtySize } from './pty';
export {
  Filesystem,
  type ByteStream,
  type WriteEntry,
  type ReadFormat,
  type FilesystemRequestOpts,
  type FilesystemReadOpts,
  type FilesystemListOpts,
  type FilesystemWriteOpts,
  type FilesystemCopyOpts,
} from './filesystem';
export { FileType, type EntryInfo, type WriteInfo } from './entry';
export { FilesystemEventType, WatchHandle, DEFAULT_WATCH_TIMEOUT_MS, type FilesystemEvent, type WatchOpts } from './watch';
export {
  SandboxError,
  TimeoutError,
  NotFoundError,
  FileNotFoundError,
  SandboxNotFoundError,
  RateLimitError,
  AuthenticationError,
  ServiceBusyError,
  TemplateError,
  BuildError,
  FileUploadError,
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
export { Template, TemplateBuilder, ReadyCmd, LogEntry, waitForPort, waitForURL, waitForProcess, waitForFile, waitForTimeout, type TemplateOptions, type TemplateBuildOpts, type BuildInfo } from './template';
export { defaultSocket, type ConnectionOpts } from './connection';
export { defaultSockets } from './sockets';

import { Sandbox } from './sandbox';
export default Sandbox;
