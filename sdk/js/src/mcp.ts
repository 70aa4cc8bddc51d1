/**
 * An MCP server (Model Context Protocol, over stdio) that gives a model
 * tupper's sandboxes: create one, run commands in it, read, write and list
 * its files, kill it.  Built on the official @modelcontextprotocol/sdk and on
 * this package's Sandbox.
 *
 * A session only sees the sandboxes it created.  They are created with the
 * daemon's `kill_on_disconnect` over a connection the session holds open, so
 * they die with the session however it ends: stdin closed, a signal, or the
 * server killed outright; on a clean end the server also kills them itself.
 *
 * The code is in mcp/: server.ts makes the server, session.ts holds a
 * session's sandboxes, tools/ the tools by area, stdio.ts serves it.  This
 * module is the package's `@tupper/sdk/mcp`.
 */
export { askDaemon, createMcpServer, MCP_TOOLS, type McpServerOpts } from './mcp/server';
export { runMcpStdio } from './mcp/stdio';
