/**
 * The MCP server on stdin/stdout, for as long as the client is there.
 */
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { askDaemon, createMcpServer, type McpServerOpts } from './server';

/**
 * Serves MCP on stdin/stdout until stdin closes or a signal comes, then
 * kills the session's sandboxes.  Resolves when the session is over.
 */
export async function runMcpStdio(opts: McpServerOpts = {}): Promise<void> {
  // the descriptions say what the daemon has
  const facts = opts.facts ?? (await askDaemon(opts));
  const { server, close } = createMcpServer({ ...opts, facts });
  const transport = new StdioServerTransport();
  let done!: () => void;
  const over = new Promise<void>((resolve) => {
    done = resolve;
  });
  let ending = false;
  const end = () => {
    if (ending) return;
    ending = true;
    void close().finally(done);
  };
  transport.onclose = end;
  process.stdin.once('end', end);
  process.stdin.once('close', end);
  const signals: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];
  for (const s of signals) process.on(s, end);
  // a closed stdout (the client went away) ends the session too
  process.stdout.on('error', end);
  await server.connect(transport);
  await over;
  for (const s of signals) process.off(s, end);
}
