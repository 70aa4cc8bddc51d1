/**
 * How the tools are registered and what they answer: a result, or a tool
 * error the model reads (never a crash of the server).
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { z } from 'zod';
import { SandboxError } from '../errors';

export type ToolResult = {
  content: Array<{ type: 'text'; text: string }>;
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
};

type Shape = Record<string, z.ZodTypeAny>;

/**
 * server.registerTool without its generic signature: inferring the handler's
 * arguments through the SDK's zod v3/v4 compatibility types takes tsc
 * minutes and gigabytes; z.infer on our own shape gives the same types.
 */
export function tool<S extends Shape>(
  server: McpServer,
  name: string,
  config: { title: string; description: string; inputSchema: S },
  handler: (args: z.infer<z.ZodObject<S>>) => Promise<ToolResult>,
): void {
  const register = server.registerTool.bind(server) as unknown as (
    n: string,
    c: unknown,
    h: (args: unknown) => Promise<ToolResult>,
  ) => unknown;
  register(name, config, (args) => handler(args as z.infer<z.ZodObject<S>>));
}

export function ok(value: Record<string, unknown>): ToolResult {
  return { content: [{ type: 'text', text: JSON.stringify(value, null, 2) }], structuredContent: value };
}

export function fail(text: string, value?: Record<string, unknown>): ToolResult {
  const r: ToolResult = { content: [{ type: 'text', text }], isError: true };
  if (value) r.structuredContent = value;
  return r;
}

/** A thrown error as an MCP tool error: its kind and message, never a crash. */
export function toolError(e: unknown): ToolResult {
  if (e instanceof SandboxError) {
    const errno = e.errnoCode ? ` (${e.errnoCode})` : '';
    return fail(`${e.name}: ${e.message}${errno}`);
  }
  return fail(`Error: ${e instanceof Error ? e.message : String(e)}`);
}
