/**
 * run_command: a shell command in a sandbox, waited for; its output comes
 * back bounded.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import type { CommandHandle } from '../../command-handle';
import { DEFAULT_COMMAND_TIMEOUT_MS } from '../../commands';
import { CommandExitError, SandboxError, TimeoutError } from '../../errors';
import { account, filePath, sandboxId, stringMap } from '../schemas';
import type { Session } from '../session';
import { fail, ok, type ToolResult, tool } from '../tool';

interface RunArgs {
  sandboxId: string;
  cmd: string;
  cwd?: string;
  user?: string;
  envs?: Record<string, string>;
  timeoutMs?: number;
  stdin?: string;
}

function cut(s: string, max: number): { text: string; truncated: boolean } {
  if (s.length <= max) return { text: s, truncated: false };
  return { text: s.slice(0, max) + `\n[... ${s.length - max} more characters cut]`, truncated: true };
}

/** Runs the command; one that writes more than maxCapture characters is killed. */
async function run(session: Session, { sandboxId: id, cmd, cwd, envs, timeoutMs, stdin, user }: RunArgs): Promise<ToolResult> {
  const { maxOutput, maxCapture } = session.limits;
  const sbx = await session.box(id);
  const o: { cwd?: string; envs?: Record<string, string>; timeoutMs: number; stdin?: boolean; user?: string } = {
    timeoutMs: timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS,
  };
  if (cwd !== undefined) o.cwd = cwd;
  if (user !== undefined) o.user = user;
  if (envs !== undefined) o.envs = envs;
  if (stdin !== undefined) o.stdin = true;
  let seen = 0;
  let flooded = false;
  let started: CommandHandle | undefined;
  const count = (d: string) => {
    seen += d.length;
    if (seen > maxCapture && !flooded) {
      flooded = true;
      void started?.kill().catch(() => false);
    }
  };
  const h = await sbx.commands.run(cmd, { ...o, background: true, onStdout: count, onStderr: count });
  started = h;
  if (flooded) void h.kill().catch(() => false);
  if (stdin !== undefined) {
    try {
      await h.sendStdin(stdin);
      await h.closeStdin();
    } catch (e) {
      // the command may have ended without reading it all: its result says more
      if (h.exitCode === undefined && !(e instanceof SandboxError)) throw e;
    }
  }
  const report = (exitCode: number | undefined, error: string | undefined) => {
    const out = cut(h.stdout, maxOutput);
    const err = cut(h.stderr, maxOutput);
    const v: Record<string, unknown> = { exitCode: exitCode ?? null, stdout: out.text, stderr: err.text };
    if (error) v.error = error;
    if (out.truncated || err.truncated) v.truncated = true;
    if (flooded) v.error = `killed: it wrote more than ${maxCapture} characters`;
    return v;
  };
  try {
    const r = await h.wait();
    return ok(report(r.exitCode, undefined));
  } catch (e) {
    if (e instanceof CommandExitError) {
      const v = report(e.exitCode, e.error);
      return fail(`the command failed (${e.error ?? `exit status ${e.exitCode}`})\n${JSON.stringify(v, null, 2)}`, v);
    }
    if (e instanceof TimeoutError) {
      const v = report(h.exitCode, e.message);
      v.timedOut = true;
      return fail(`${e.name}: ${e.message}\n${JSON.stringify(v, null, 2)}`, v);
    }
    throw e;
  }
}

export function register(server: McpServer, session: Session): void {
  const { maxOutput, maxFile } = session.limits;
  tool(
    server,
    'run_command',
    {
      title: 'Run a command',
      description:
        'Runs a shell command (/bin/sh -c, busybox) in a sandbox and waits for its end; returns exitCode, stdout and stderr. ' +
        "It runs as the sandbox's default account (the unprivileged `user`, in /home/user, as E2B) unless user says otherwise. " +
        'A non-zero exit code is reported as a tool error carrying the output. The command is killed after timeoutMs ' +
        `(default ${DEFAULT_COMMAND_TIMEOUT_MS}). Output over ${maxOutput} characters per stream is cut.`,
      inputSchema: {
        sandboxId,
        cmd: z.string().min(1).max(1 << 20).describe('The shell command line.'),
        cwd: filePath.optional().describe("Working directory (default: the account's home, /home/user by default)."),
        user: account.optional(),
        envs: stringMap.optional().describe('Environment variables added for this command.'),
        timeoutMs: z
          .number()
          .int()
          .min(1)
          .max(24 * 3600 * 1000)
          .optional()
          .describe(`Kill the command after this many milliseconds (default ${DEFAULT_COMMAND_TIMEOUT_MS}).`),
        stdin: z.string().max(maxFile).optional().describe('Text written to the command\'s stdin, which is then closed.'),
      },
    },
    (args) => session.guarded(() => run(session, args)),
  );
}
