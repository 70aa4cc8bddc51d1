/**
 * The MCP server: the session's state and the tools, by area (tools/).
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { type ConnectionOpts, connectionOpts } from '../connection';
import { Session } from './session';
import * as code from './tools/code';
import * as commands from './tools/commands';
import * as files from './tools/files';
import * as sandboxes from './tools/sandboxes';

export interface McpServerOpts extends ConnectionOpts {
  /** Most sandboxes one session may have at once (default 16). */
  maxSandboxes?: number;
  /** Most characters of stdout and of stderr a command result carries (default 100000); the rest is cut, saying so. */
  maxOutputChars?: number;
  /**
   * Most characters a command may write (stdout and stderr together) before
   * it is killed (default 1 MiB): the SDK keeps a command's whole output
   * while it runs, and the server must stay bounded.
   */
  maxCaptureChars?: number;
  /** Largest file read_file returns or write_file accepts, in bytes (default 1 MiB). */
  maxFileBytes?: number;
}

/** The tools, by name: handy for clients and for the tests. */
export const MCP_TOOLS = [
  'sandbox_create',
  'sandbox_list',
  'sandbox_kill',
  'run_command',
  'run_code',
  'read_file',
  'write_file',
  'list_files',
] as const;

/**
 * Makes the MCP server and its per-session state.  `close()` kills every
 * sandbox the session made.
 */
export function createMcpServer(opts: McpServerOpts = {}): { server: McpServer; close: () => Promise<void> } {
  const session = new Session(connectionOpts(opts), {
    maxSandboxes: opts.maxSandboxes ?? 16,
    maxOutput: opts.maxOutputChars ?? 100_000,
    maxFile: opts.maxFileBytes ?? 1 << 20,
    maxCapture: opts.maxCaptureChars ?? 1 << 20,
  });

  const server = new McpServer(
    { name: 'tupper', version: '0.1.0' },
    {
      instructions:
        'tupper sandboxes: isolated Linux boxes (busybox userland) to run untrusted code in. ' +
        'Create one with sandbox_create, use its id with run_command and the file tools, and kill it ' +
        'with sandbox_kill when done. Every sandbox of this session is killed when the session ends. ' +
        'Commands and file tools act as the unprivileged account `user` in its home /home/user (as E2B; ' +
        'root in / on an image without that account); pass user "root" to change system files.',
    },
  );

  // in MCP_TOOLS' order
  sandboxes.register(server, session);
  commands.register(server, session);
  code.register(server, session);
  files.register(server, session);

  async function close(): Promise<void> {
    if (!(await session.close())) return;
    await server.close().catch(() => {});
  }

  return { server, close };
}
