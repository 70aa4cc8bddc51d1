/**
 * @tupper/mastra: a tupper sandbox as a Mastra workspace: TupperSandbox (a
 * WorkspaceSandbox on MastraSandbox) runs commands and processes in the box,
 * TupperFilesystem (a WorkspaceFilesystem on MastraFilesystem) reads and
 * writes its files.  Hand both to `new Workspace({ sandbox, filesystem })`.
 */
export {
  TupperSandbox,
  TupperProcessManager,
  TupperProcessHandle,
  DEFAULT_COMMAND_TIMEOUT_MS,
  toInvocation,
  type TupperSandboxOptions,
} from './sandbox';
export { TupperFilesystem, type TupperFilesystemOptions } from './filesystem';
