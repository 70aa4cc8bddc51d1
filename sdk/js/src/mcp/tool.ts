/**
 * How the tools are registered and what they answer: a result, or a tool
 * error the model reads (never a crash of the server).
 *
 * Every tool has an outputSchema; a result's data is its structuredContent,
 * and its one text block is the same JSON, compact, once (the 2025-06-18
 * spec: "a tool that returns structured content SHOULD also return the
 * serialized JSON in a TextContent block"). A client hands the model one of
 * the two. An error is a one-line text, followed by its data's JSON when it
 * has some (a failed command's output), the data then in structuredContent.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { errorType, SandboxError } from '../errors';

export type ToolResult = {
  content: Array<{ type: 'text'; text: string }>;
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
};

type Shape = Record<string, z.ZodTypeAny>;

/** MCP's tool annotations (hints for the client; never trusted for safety). */
export interface Annotations {
  readOnlyHint?: boolean;
  destructiveHint?: boolean;
  idempotentHint?: boolean;
  openWorldHint?: boolean;
}

/** What a handler gets besides its arguments: progress for the request, and its cancellation. */
export interface CallContext {
  /** Aborted when the client cancels the request (or the session ends). */
  signal: AbortSignal;
  /** True when the client asked for progress (a `_meta.progressToken`). */
  wantsProgress: boolean;
  /** Sends a progress notification, when the client asked for them; never throws. */
  progress: (message: string, progress?: number, total?: number) => void;
}

interface Extra {
  signal: AbortSignal;
  _meta?: { progressToken?: string | number };
  sendNotification: (n: { method: string; params: Record<string, unknown> }) => Promise<void>;
}

function callContext(extra: Extra): CallContext {
  const token = extra._meta?.progressToken;
  let n = 0;
  return {
    signal: extra.signal,
    wantsProgress: token !== undefined,
    progress(message, progress, total) {
      if (token === undefined) return;
      // progress must increase with every notification (the spec)
      n = Math.max(n + 1, progress ?? 0);
      const params: Record<string, unknown> = { progressToken: token, progress: n, message };
      if (total !== undefined) params.total = total;
      void extra.sendNotification({ method: 'notifications/progress', params }).catch(() => {});
    },
  };
}

/**
 * server.registerTool without its generic signature: inferring the handler's
 * arguments through the SDK's zod v3/v4 compatibility types takes tsc
 * minutes and gigabytes; z.infer on our own shape gives the same types.
 * The input is a strict object: an unknown argument is an error, as the
 * schema's `additionalProperties: false` says.
 */
export function tool<S extends Shape, O extends Shape>(
  server: McpServer,
  name: string,
  config: { title: string; description: string; inputSchema: S; outputSchema: O; annotations: Annotations },
  handler: (args: z.infer<z.ZodObject<S>>, ctx: CallContext) => Promise<ToolResult>,
): void {
  const register = server.registerTool.bind(server) as unknown as (
    n: string,
    c: unknown,
    h: (args: unknown, extra: Extra) => Promise<ToolResult>,
  ) => unknown;
  const { title, description, annotations } = config;
  register(
    name,
    {
      title,
      description,
      inputSchema: z.object(config.inputSchema).strict(),
      outputSchema: z.object(config.outputSchema),
      annotations: { title, ...annotations },
    },
    (args, extra) => handler(args as z.infer<z.ZodObject<S>>, callContext(extra)),
  );
}

export function ok(value: Record<string, unknown>): ToolResult {
  return { content: [{ type: 'text', text: JSON.stringify(value) }], structuredContent: value };
}

/**
 * A tool error: a one-line text; with data (a failed command's output), the
 * data as structuredContent and its JSON once after that line.
 */
export function fail(text: string, value?: Record<string, unknown>): ToolResult {
  if (!value) return { content: [{ type: 'text', text }], isError: true };
  return { content: [{ type: 'text', text: `${text}\n${JSON.stringify(value)}` }], structuredContent: value, isError: true };
}

/**
 * A thrown error as an MCP tool error, never a crash: its type (one of
 * ERROR_TYPES, the names the SDK and the HTTP API use) and message.
 */
export function toolError(e: unknown): ToolResult {
  if (e instanceof SandboxError) {
    const errno = e.errnoCode ? ` (${e.errnoCode})` : '';
    const type = errorType(e);
    return fail(`${type}: ${e.message}${errno}`);
  }
  return fail(`InternalError: ${e instanceof Error ? e.message : String(e)}`);
}

/**
 * Cuts s (from its character `from` on) to at most max characters; the
 * marker says how many bytes (UTF-8) more there are and where to go on.
 */
export function cut(s: string, from: number, max: number): { text: string; next: number; truncated: boolean } {
  const rest = s.slice(from);
  if (rest.length <= max) return { text: rest, next: s.length, truncated: false };
  // never between the two halves of a surrogate pair
  let n = max;
  const c = rest.charCodeAt(n - 1);
  if (n > 1 && c >= 0xd800 && c <= 0xdbff) n--;
  const more = Buffer.byteLength(rest.slice(n), 'utf8');
  return { text: `${rest.slice(0, n)}\n[truncated, ${more} bytes more]`, next: from + n, truncated: true };
}

/**
 * Sends a progress notification every intervalMs while p runs (when the
 * client asked for them), so that a client that resets its timeout on
 * progress keeps waiting; `what()` says where things stand.
 */
export async function withProgress<T>(ctx: CallContext, intervalMs: number, what: () => string, p: Promise<T>): Promise<T> {
  if (!ctx.wantsProgress) return p;
  const t = setInterval(() => ctx.progress(what()), intervalMs);
  try {
    return await p;
  } finally {
    clearInterval(t);
  }
}
