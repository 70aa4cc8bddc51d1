/**
 * run_command, command_output, command_kill: shell commands in a sandbox,
 * waited for (with progress notifications) or run in the background and
 * polled; their output comes back bounded, from an offset on.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { DEFAULT_COMMAND_TIMEOUT_MS } from '../../commands';
import type { CommandHandle } from '../../command-handle';
import { CommandExitError, InvalidArgumentError, NotFoundError, SandboxError, TimeoutError } from '../../errors';
import * as S from '../schemas';
import type { Followed, Session } from '../session';
import { type CallContext, cut, fail, ok, type ToolResult, tool } from '../tool';

interface RunArgs {
  sandboxId: string;
  cmd: string;
  cwd?: string;
  user?: string;
  envs?: Record<string, string>;
  timeoutMs?: number;
  stdin?: string;
  stdinBase64?: string;
  background?: boolean;
}

const MAX_WAIT_MS = 24 * 3600 * 1000;

function stdinBytes(a: RunArgs, max: number): Uint8Array | undefined {
  if (a.stdin !== undefined && a.stdinBase64 !== undefined) throw new InvalidArgumentError('stdin and stdinBase64: give one');
  let b: Buffer | undefined;
  if (a.stdin !== undefined) b = Buffer.from(a.stdin, 'utf8');
  if (a.stdinBase64 !== undefined) {
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(a.stdinBase64) || a.stdinBase64.length % 4 !== 0) throw new InvalidArgumentError('stdinBase64 is not valid base64');
    b = Buffer.from(a.stdinBase64, 'base64');
  }
  if (b && b.length > max) throw new InvalidArgumentError(`stdin is ${b.length} bytes, more than run_command takes (${max})`);
  return b;
}

/** A follower for a handle: counts its output (killing it past maxCapture) and notes how it ended. */
function follower(session: Session, sandboxId: string): { f: Followed & { failure?: string }; count: (d: string) => void; bind: (h: CommandHandle) => void } {
  const { maxCapture } = session.limits;
  let seen = 0;
  const f = { sandboxId, flooded: false, timedOut: false, done: false } as Followed & { failure?: string };
  const count = (d: string) => {
    seen += d.length;
    if (seen > maxCapture && !f.flooded) {
      f.flooded = true;
      void f.handle?.kill().catch(() => false);
    }
  };
  const bind = (h: CommandHandle) => {
    f.handle = h;
    if (f.flooded) void h.kill().catch(() => false);
    f.ended = h
      .wait()
      .then(
        () => {},
        (e: unknown) => {
          if (e instanceof TimeoutError) {
            f.timedOut = h.exitCode !== undefined;
            f.failure = e.message;
          } else if (!(e instanceof CommandExitError)) f.failure = e instanceof Error ? e.message : String(e);
        },
      )
      .finally(() => {
        f.done = true;
      });
  };
  return { f, count, bind };
}

/** Starts the command, followed by the session; one that writes more than maxCapture characters is killed. */
async function start(session: Session, a: RunArgs): Promise<Followed> {
  const { maxFile } = session.limits;
  const input = stdinBytes(a, maxFile);
  const sbx = await session.box(a.sandboxId);
  const o: { cwd?: string; envs?: Record<string, string>; timeoutMs: number; stdin?: boolean; user?: string } = {
    timeoutMs: a.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS,
  };
  if (a.cwd !== undefined) o.cwd = a.cwd;
  if (a.user !== undefined) o.user = a.user;
  if (a.envs !== undefined) o.envs = a.envs;
  if (input !== undefined) o.stdin = true;
  const { f, count, bind } = follower(session, a.sandboxId);
  const h = await sbx.commands.run(a.cmd, { ...o, background: true, onStdout: count, onStderr: count });
  bind(h);
  if (input !== undefined) {
    try {
      await h.sendStdin(input);
      await h.closeStdin();
    } catch (e) {
      // the command may have ended without reading it all: its result says more
      if (h.exitCode === undefined && !(e instanceof SandboxError)) throw e;
    }
  }
  return f;
}

/**
 * The session's background command pid; in a kept sandbox, a command still
 * running that another session started is attached to (its output from
 * the last 64 KiB the daemon kept on, the offsets counted from there).
 */
async function followed(session: Session, id: string, pid: number): Promise<Followed> {
  const mine = session.commands.get(`${id}/${pid}`);
  if (mine) return mine;
  const sbx = await session.box(id);
  if (!session.kept.has(id)) return session.followed(id, pid);
  const { f, count, bind } = follower(session, id);
  let h: CommandHandle;
  try {
    h = await sbx.commands.connect(pid, { onStdout: count, onStderr: count });
  } catch (e) {
    if (e instanceof NotFoundError) throw new NotFoundError(`no command ${pid} running in sandbox ${id} (one that ended in another session is not kept)`);
    throw e;
  }
  bind(h);
  f.reattached = true;
  session.follow(f);
  return f;
}

/** Where the command stands, its output from the offsets on. */
function report(session: Session, f: Followed & { failure?: string }, outFrom = 0, errFrom = 0): Record<string, unknown> {
  const { maxOutput, maxCapture } = session.limits;
  const h = f.handle;
  if (outFrom > h.stdout.length || errFrom > h.stderr.length) {
    throw new InvalidArgumentError(`offset past the output (stdout has ${h.stdout.length} characters, stderr ${h.stderr.length})`);
  }
  const out = cut(h.stdout, outFrom, maxOutput);
  const err = cut(h.stderr, errFrom, maxOutput);
  const v: Record<string, unknown> = {
    pid: h.pid,
    running: !f.done,
    exitCode: f.done ? (h.exitCode ?? null) : null,
    stdout: out.text,
    stderr: err.text,
    stdoutOffset: out.next,
    stderrOffset: err.next,
  };
  const error = f.flooded ? `killed: it wrote more than ${maxCapture} characters (redirect big output to a file)` : (f.failure ?? h.error);
  if (f.done && error) v.error = error;
  if (f.timedOut) v.timedOut = true;
  if (out.truncated || err.truncated) v.truncated = true;
  if (f.reattached) v.reattached = true;
  return v;
}

/** Waits for f's end, at most ms, sending progress meanwhile; false when it still runs. */
async function waitFor(session: Session, f: Followed, ms: number, ctx: CallContext): Promise<boolean> {
  if (f.done) return true;
  const t0 = Date.now();
  const h = f.handle;
  let timer: NodeJS.Timeout | undefined;
  let tick: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  try {
    await Promise.race([
      f.ended,
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, ms);
        onAbort = () => resolve();
        ctx.signal.addEventListener('abort', onAbort);
      }),
      new Promise<never>(() => {
        if (ctx.wantsProgress) {
          tick = setInterval(() => {
            const s = Math.round((Date.now() - t0) / 1000);
            ctx.progress(`pid ${h.pid} running for ${s} s: ${h.stdout.length} characters of stdout, ${h.stderr.length} of stderr`);
          }, session.limits.progressIntervalMs);
        }
      }),
    ]);
  } finally {
    clearTimeout(timer);
    clearInterval(tick);
    if (onAbort) ctx.signal.removeEventListener('abort', onAbort);
  }
  return f.done;
}

/** run_command: in the background, its pid at once; else waited for, killed when the request is cancelled. */
async function run(session: Session, a: RunArgs, ctx: CallContext): Promise<ToolResult> {
  const f = await start(session, a);
  if (a.background) {
    session.follow(f);
    return ok(report(session, f));
  }
  await waitFor(session, f, MAX_WAIT_MS, ctx);
  if (!f.done) {
    // the client cancelled (or gave up): a foreground command goes too
    await f.handle.kill().catch(() => false);
    await f.ended;
  }
  const v = report(session, f);
  if (v.exitCode === 0 && !v.error) return ok(v);
  if (v.timedOut) return fail('TimeoutError: the command ran past its timeoutMs and was killed', v);
  return fail(`CommandExitError: ${String(v.error ?? `exit status ${String(v.exitCode)}`)}`, v);
}

export function register(server: McpServer, session: Session): void {
  const { maxOutput, maxFile, maxCapture } = session.limits;
  const defaults = "It runs as the sandbox's default account, in its home (sandbox_create's result says which), unless user or cwd say otherwise.";
  tool(
    server,
    'run_command',
    {
      title: 'Run a command',
      description:
        'Runs a shell command (/bin/sh -c) in a sandbox. ' +
        defaults +
        ' By default it waits for the end and returns exitCode, stdout and stderr; a non-zero exit is a tool error carrying them. ' +
        'While it waits, it sends progress notifications when the request has a progressToken (so a client that resets its timeout on progress waits on). ' +
        'With background: true it returns the pid at once: poll or wait with command_output, stop it with command_kill. ' +
        `The command is killed after timeoutMs (default ${DEFAULT_COMMAND_TIMEOUT_MS}), or when it writes more than ${maxCapture} characters. ` +
        `A result carries at most ${maxOutput} characters per stream, ending with "[truncated, N bytes more]" when cut.`,
      inputSchema: {
        sandboxId: S.sandboxId(),
        cmd: z.string().min(1).max(1 << 20).describe('The shell command line.'),
        cwd: S.filePath("Working directory (default: the account's home).").optional(),
        user: S.account().optional(),
        envs: S.stringMap('Environment variables added for this command.').optional(),
        timeoutMs: z
          .number()
          .int()
          .min(1)
          .max(MAX_WAIT_MS)
          .optional()
          .describe(`Kill the command after this many milliseconds (default ${DEFAULT_COMMAND_TIMEOUT_MS}).`),
        stdin: z.string().max(maxFile).optional().describe("Text written to the command's stdin, which is then closed."),
        stdinBase64: z.string().max(Math.ceil((maxFile * 4) / 3) + 4).optional().describe("Bytes (base64) written to the command's stdin, which is then closed."),
        background: z.boolean().optional().describe('Return at once with the pid; the output is kept for command_output.'),
      },
      outputSchema: S.commandOutputShape(),
      annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: true },
    },
    (args, ctx) => session.guarded(() => run(session, args, ctx)),
  );

  tool(
    server,
    'command_output',
    {
      title: 'Poll or wait for a background command',
      description:
        'The output of a background command (from run_command with background: true) from stdoutOffset and stderrOffset on, and whether it still runs. ' +
        'waitMs > 0 waits that long at most for its end first (sending progress notifications when the request has a progressToken). ' +
        'Pass the returned offsets to the next call to read on. A command that ended non-zero is reported here as data (exitCode), not as a tool error. ' +
          'In a kept (named) sandbox, a command another session started is attached to while it runs (reattached: its output from the last 64 KiB the daemon kept).',
      inputSchema: {
        sandboxId: S.sandboxId(),
        pid: S.pid(),
        stdoutOffset: z.number().int().min(0).optional().describe('Read stdout from this offset on (default 0).'),
        stderrOffset: z.number().int().min(0).optional().describe('Read stderr from this offset on (default 0).'),
        waitMs: z.number().int().min(0).max(MAX_WAIT_MS).optional().describe('Wait this long at most for the end first (default 0: answer now).'),
      },
      outputSchema: S.commandOutputShape(),
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    ({ sandboxId: id, pid, stdoutOffset, stderrOffset, waitMs }, ctx) =>
      session.guarded(async () => {
        const f = await followed(session, id, pid);
        if (waitMs) await waitFor(session, f, waitMs, ctx);
        return ok(report(session, f, stdoutOffset ?? 0, stderrOffset ?? 0));
      }),
  );

  tool(
    server,
    'command_kill',
    {
      title: 'Kill a background command',
      description: 'Kills a background command of this session and everything it started (SIGKILL); its output stays readable with command_output.',
      inputSchema: { sandboxId: S.sandboxId(), pid: S.pid() },
      outputSchema: { sandboxId: z.string(), pid: z.number().int(), killed: z.boolean().describe('False when it had ended already.') },
      annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
    },
    ({ sandboxId: id, pid }) =>
      session.guarded(async () => {
        const f = await followed(session, id, pid);
        const killed = f.done ? false : await f.handle.kill();
        await f.ended;
        return ok({ sandboxId: id, pid, killed });
      }),
  );
}
