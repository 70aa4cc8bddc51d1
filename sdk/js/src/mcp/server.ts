/**
 * The MCP server: the session's state and the tools, by area (tools/).
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { type ConnectionOpts, connectionOpts } from '../connection';
import { type DaemonFacts, daemonFacts, imagesText } from './facts';
import { Session } from './session';
import * as code from './tools/code';
import * as commands from './tools/commands';
import * as files from './tools/files';
import * as sandboxes from './tools/sandboxes';
import * as volumes from './tools/volumes';
import * as snapshots from './tools/snapshots';

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
  /** Most background commands one session follows at once (default 64). */
  maxCommands?: number;
  /** How often a long call sends a progress notification when asked for them, ms (default 1000). */
  progressIntervalMs?: number;
  /** What the daemon has (its images), for the descriptions; runMcpStdio asks it. */
  facts?: DaemonFacts;
}

/** The tools, by name: handy for clients and for the tests. */
export const MCP_TOOLS = [
  'sandbox_create',
  'sandbox_wait',
  'sandbox_list',
  'sandbox_kill',
  'sandbox_port',
  'sandbox_snapshot',
  'sandbox_fork',
  'sandbox_restore',
  'snapshot_list',
  'snapshot_delete',
  'run_command',
  'command_output',
  'command_kill',
  'run_code',
  'read_file',
  'write_file',
  'list_files',
  'volume_create',
  'volume_list',
  'volume_destroy',
] as const;

/** What the daemon has, for createMcpServer's descriptions. */
export function askDaemon(opts: ConnectionOpts = {}): Promise<DaemonFacts> {
  return daemonFacts(connectionOpts(opts));
}

/**
 * Makes the MCP server and its per-session state.  `close()` kills every
 * sandbox the session made (kept ones live on).
 */
export function createMcpServer(opts: McpServerOpts = {}): { server: McpServer; close: () => Promise<void> } {
  const facts = opts.facts ?? { images: [] };
  const session = new Session(
    connectionOpts(opts),
    {
      maxSandboxes: opts.maxSandboxes ?? 16,
      maxOutput: opts.maxOutputChars ?? 100_000,
      maxFile: opts.maxFileBytes ?? 1 << 20,
      maxCapture: opts.maxCaptureChars ?? 1 << 20,
      maxCommands: opts.maxCommands ?? 64,
      progressIntervalMs: opts.progressIntervalMs ?? 1000,
    },
    facts,
  );

  const server = new McpServer(
    { name: 'tupper', version: '0.1.0' },
    {
      instructions:
        `tupper sandboxes${facts.version ? ` (daemon ${facts.version})` : ''}: isolated Linux boxes to run untrusted code in. ` +
        `Images: ${imagesText(facts)}. ` +
        'Create one with sandbox_create (it returns the id, the account commands act as and its home), use its id with run_command and the file tools, ' +
        'and kill it with sandbox_kill when done. Every sandbox of this session is killed when the session ends, unless it was created with a name. ' +
        'A long command: run_command with background: true, then command_output (waitMs to wait, offsets to read on). ' +
        'Commands and file tools act as the sandbox\'s default account; pass user "root" to change system files.',
    },
  );

  // in MCP_TOOLS' order
  sandboxes.register(server, session);
  snapshots.register(server, session);
  commands.register(server, session);
  code.register(server, session);
  files.register(server, session);
  volumes.register(server, session);

  async function close(): Promise<void> {
    if (!(await session.close())) return;
    await server.close().catch(() => {});
  }

  return { server, close };
}
