/**
 * run_code: a cell of Python in a sandbox made from the code-interpreter
 * recipe (sandbox_create with recipe "code-interpreter"), on the same
 * machinery as the SDK's runCode: variables persist between calls, results
 * come back in E2B's shapes, bounded.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { CODE_MAX_BYTES, DEFAULT_RUN_CODE_TIMEOUT_MS, runCodeIn } from '../../code-interpreter';
import type { Execution } from '../../code-interpreter-result';
import { TimeoutError } from '../../errors';
import * as S from '../schemas';
import type { Session } from '../session';
import { type CallContext, fail, ok, type ToolResult, tool, withProgress } from '../tool';

interface RunCodeArgs {
  sandboxId: string;
  code: string;
  language?: string;
  contextId?: string;
  envs?: Record<string, string>;
  timeoutMs?: number;
}

/** The execution as the model reads it: each text field cut to max characters, saying so. */
function report(e: Execution, max: number): Record<string, unknown> {
  let truncated = false;
  const cut = (s: string) => {
    if (s.length <= max) return s;
    truncated = true;
    return s.slice(0, max) + `\n[... ${s.length - max} more characters cut]`;
  };
  const v = e.toJSON();
  const logs = v.logs as { stdout: string[]; stderr: string[] };
  v.logs = { stdout: [cut(logs.stdout.join(''))].filter((s) => s !== ''), stderr: [cut(logs.stderr.join(''))].filter((s) => s !== '') };
  v.results = (v.results as Array<Record<string, unknown>>).map((r) => {
    const o: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(r)) o[k] = typeof x === 'string' ? cut(x) : x;
    return o;
  });
  if (e.text !== undefined) v.text = cut(e.text);
  if (e.error) v.error = { name: e.error.name, value: cut(e.error.value), traceback: cut(e.error.traceback) };
  if (truncated) v.truncated = true;
  return v;
}

async function run(session: Session, a: RunCodeArgs, ctx: CallContext): Promise<ToolResult> {
  const sbx = await session.box(a.sandboxId);
  const opts: Parameters<typeof runCodeIn>[2] = { timeoutMs: a.timeoutMs ?? DEFAULT_RUN_CODE_TIMEOUT_MS };
  if (a.language !== undefined) opts.language = a.language;
  if (a.contextId !== undefined) opts.context = { id: a.contextId, language: 'python', cwd: '' };
  if (a.envs !== undefined) opts.envs = a.envs;
  try {
    const started = Date.now();
    // a long cell keeps a client that resets its timeout on progress waiting
    const e = await withProgress(ctx, 1000, () => `cell running for ${Math.round((Date.now() - started) / 1000)} s`, runCodeIn(sbx, a.code, opts));
    const v = report(e, session.limits.maxOutput);
    if (e.error) return fail(`${e.error.name}: ${e.error.value}\n${JSON.stringify(v, null, 2)}`, v);
    return ok(v);
  } catch (e) {
    if (e instanceof TimeoutError) return fail(`${e.name}: ${e.message}`);
    throw e;
  }
}

export function register(server: McpServer, session: Session): void {
  tool(
    server,
    'run_code',
    {
      title: 'Run Python code',
      description:
        'Runs a cell of Python in a Jupyter kernel inside a sandbox made with sandbox_create and recipe "code-interpreter" ' +
        '(numpy, pandas, matplotlib installed). Variables persist between calls (per context). Returns results ' +
        '(the value of the last expression and what was displayed: text, html, png as base64, ...), logs (stdout, stderr) ' +
        'and error {name, value, traceback}. A cell that raises is a tool error carrying the same. The cell is interrupted ' +
        `after timeoutMs (default ${DEFAULT_RUN_CODE_TIMEOUT_MS}); its variables stay. While it runs, progress notifications are sent when the request has a progressToken. Text over ${session.limits.maxOutput} characters per field is cut.`,
      inputSchema: {
        sandboxId: S.sandboxId(),
        code: z.string().max(CODE_MAX_BYTES).describe('The Python code of the cell.'),
        language: z.string().max(32).optional().describe('Only "python" for now.'),
        contextId: z.string().min(1).max(64).optional().describe('A code context (its own kernel); default: the sandbox\'s default context.'),
        envs: S.stringMap('Environment variables the cell sees.').optional(),
        timeoutMs: z
          .number()
          .int()
          .min(1)
          .max(24 * 3600 * 1000)
          .optional()
          .describe(`Interrupt the cell after this many milliseconds (default ${DEFAULT_RUN_CODE_TIMEOUT_MS}).`),
      },
      outputSchema: {
        results: z
          .array(z.record(z.unknown()))
          .describe('What the cell displayed and its last expression\'s value, each in the formats the kernel gave (text, html, png as base64, svg, json, ...); isMainResult marks the value.'),
        logs: z.object({ stdout: z.array(z.string()), stderr: z.array(z.string()) }).describe("The cell's output streams."),
        error: z.object({ name: z.string(), value: z.string(), traceback: z.string() }).optional().describe('The exception the cell raised.'),
        text: z.string().optional().describe("The main result's text."),
        executionCount: z.number().int().optional(),
        truncated: z.boolean().optional().describe('Some text was cut to the server\'s bound.'),
      },
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    },
    (args, ctx) => session.guarded(() => run(session, args as RunCodeArgs, ctx)),
  );
}
