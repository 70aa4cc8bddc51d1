#!/usr/bin/env node
/**
 * `tupper-mcp` (and `tupper mcp`): the MCP server on stdin/stdout.
 * Options: --socket PATH (else $TUPPER_SOCKET or the daemon's default).
 */
import { runMcpStdio, type McpServerOpts } from './mcp';

const USAGE = `usage: tupper mcp [--socket PATH]

Serves the Model Context Protocol on stdin/stdout: tools to create tupper
sandboxes, run commands in them, read, write and list their files, and kill
them. Every sandbox the session created is killed when it ends.
`;

function main(argv: string[]): number | Promise<number> {
  const opts: McpServerOpts = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--help' || a === '-h') {
      process.stdout.write(USAGE);
      return 0;
    }
    if (a === '--socket' && argv[i + 1] !== undefined) {
      opts.socket = argv[++i];
      continue;
    }
    process.stderr.write(`tupper mcp: unknown or incomplete option ${a}\n${USAGE}`);
    return 2;
  }
  return runMcpStdio(opts).then(
    () => 0,
    (e: unknown) => {
      process.stderr.write(`tupper mcp: ${e instanceof Error ? e.message : String(e)}\n`);
      return 1;
    },
  );
}

void Promise.resolve(main(process.argv.slice(2))).then((code) => {
  process.exitCode = code;
});
