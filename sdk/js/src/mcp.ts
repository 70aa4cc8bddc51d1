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
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { z } from 'zod';
import { Connection, type ConnectionOpts } from './connection';
import { CommandExitError, InvalidArgumentError, SandboxError, TimeoutError } from './errors';
import { DEFAULT_SANDBOX_TIMEOUT_MS, Sandbox } from './sandbox';
import type { CommandHandle } from './command-handle';
import { DEFAULT_COMMAND_TIMEOUT_MS } from './commands';

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
  'read_file',
  'write_file',
  'list_files',
] as const;

type ToolResult = {
  content: Array<{ type: 'text'; text: string }>;
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
};

/** How long a create naming an image may take: a first use pulls it. */
const IMAGE_CREATE_TIMEOUT_MS = 30 * 60_000;

type Shape = Record<string, z.ZodTypeAny>;

/**
 * server.registerTool without its generic signature: inferring the handler's
 * arguments through the SDK's zod v3/v4 compatibility types takes tsc
 * minutes and gigabytes; z.infer on our own shape gives the same types.
 */
function tool<S extends Shape>(
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

function ok(value: Record<string, unknown>): ToolResult {
  return { content: [{ type: 'text', text: JSON.stringify(value, null, 2) }], structuredContent: value };
}

function fail(text: string, value?: Record<string, unknown>): ToolResult {
  const r: ToolResult = { content: [{ type: 'text', text }], isError: true };
  if (value) r.structuredContent = value;
  return r;
}

/** A thrown error as an MCP tool error: its kind and message, never a crash. */
function toolError(e: unknown): ToolResult {
  if (e instanceof SandboxError) {
    const errno = e.errnoCode ? ` (${e.errnoCode})` : '';
    return fail(`${e.name}: ${e.message}${errno}`);
  }
  return fail(`Error: ${e instanceof Error ? e.message : String(e)}`);
}

function cut(s: string, max: number): { text: string; truncated: boolean } {
  if (s.length <= max) return { text: s, truncated: false };
  return { text: s.slice(0, max) + `\n[... ${s.length - max} more characters cut]`, truncated: true };
}

const sandboxId = z.string().min(1).max(128).describe('The id sandbox_create returned.');
const filePath = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => !p.includes('\0'), 'a path has no NUL byte')
  .describe("A path inside the sandbox; a relative path is taken from the home of the account the tool acts as (/home/user by default).");
const account = z
  .string()
  .min(1)
  .max(32)
  .regex(/^[A-Za-z0-9_][A-Za-z0-9_.-]*$/)
  .describe(
    "The account of the sandbox to act as. Default: the sandbox's default account, the unprivileged `user` " +
      "(uid 1000, home /home/user) on the default image, as E2B; 'root' for system paths such as /etc.",
  );
const stringMap = z.record(z.string().max(1 << 16));

/**
 * Makes the MCP server and its per-session state.  `close()` kills every
 * sandbox the session made.
 */
export function createMcpServer(opts: McpServerOpts = {}): { server: McpServer; close: () => Promise<void> } {
  const conn: ConnectionOpts = {};
  if (opts.socket !== undefined) conn.socket = opts.socket;
  if (opts.requestTimeoutMs !== undefined) conn.requestTimeoutMs = opts.requestTimeoutMs;
  const maxSandboxes = opts.maxSandboxes ?? 16;
  const maxOutput = opts.maxOutputChars ?? 100_000;
  const maxFile = opts.maxFileBytes ?? 1 << 20;
  const maxCapture = opts.maxCaptureChars ?? 1 << 20;
  const boxes = new Map<string, Sandbox>();
  let session: Connection | undefined;
  let closed = false;

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

  async function sessionConn(): Promise<Connection> {
    if (!session || session.closed) session = await Connection.open(conn);
    return session;
  }

  async function box(id: string): Promise<Sandbox> {
    const s = boxes.get(id);
    if (!s) {
      throw new InvalidArgumentError(
        `no sandbox ${id} in this session (this server only works on sandboxes it created; see sandbox_list)`,
      );
    }
    // the daemon drops a connection that falls 64 MiB behind (a flood of
    // output): the sandbox lives on, so a new connection takes over
    const c = (s as unknown as { conn?: { closed?: boolean } }).conn;
    if (c?.closed !== true) return s;
    const fresh = await Sandbox.connect(id, conn);
    if (boxes.get(id) !== s) {
      // killed meanwhile by another call: let go of the new connection
      (fresh as unknown as { conn?: { close?: () => void } }).conn?.close?.();
      throw new InvalidArgumentError(`no sandbox ${id} in this session any more`);
    }
    boxes.set(id, fresh);
    return fresh;
  }

  async function guarded(fn: () => Promise<ToolResult>): Promise<ToolResult> {
    if (closed) return fail('the session is closing');
    try {
      return await fn();
    } catch (e) {
      return toolError(e);
    }
  }

  tool(
    server,
    'sandbox_create',
    {
      title: 'Create a sandbox',
      description:
        'Creates a new isolated Linux sandbox (its own filesystem, processes and network namespace) and returns its id. ' +
        'It lives timeoutMs (default 300000 = 5 minutes; 0 = until killed or the session ends).',
      inputSchema: {
        image: z
          .string()
          .min(1)
          .max(512)
          .optional()
          .describe('The image, e.g. "default" (busybox, the default) or a registry reference such as "python:3.12-slim" (pulled on first use, which may take minutes).'),
        envs: stringMap.optional().describe('Environment variables of every command in the sandbox.'),
        metadata: stringMap.optional().describe('Free-form labels, returned by sandbox_list.'),
        timeoutMs: z
          .number()
          .int()
          .min(0)
          .max(7 * 24 * 3600 * 1000)
          .optional()
          .describe('Lifetime in milliseconds (default 300000).'),
        memory: z.string().max(32).optional().describe('Memory limit, e.g. "256M" or "1G".'),
        cpus: z.number().positive().max(1024).optional().describe('CPU quota in cores, e.g. 0.5.'),
      },
    },
    ({ image, envs, metadata, timeoutMs, memory, cpus }) =>
      guarded(async () => {
        if (boxes.size >= maxSandboxes) {
          throw new InvalidArgumentError(`this session already has ${boxes.size} sandboxes (at most ${maxSandboxes}); kill one first`);
        }
        const limits: Record<string, unknown> = { timeout: (timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS) / 1000 };
        if (memory !== undefined) limits.memory = memory;
        if (cpus !== undefined) limits.cpus = cpus;
        const params: Record<string, unknown> = { limits, kill_on_disconnect: true };
        if (image !== undefined) params.image = image;
        if (envs !== undefined) params.env = envs;
        if (metadata !== undefined) params.metadata = metadata;
        const c = await sessionConn();
        // an image not pulled yet is pulled by this create: give it time
        const r = await c.call<{ id: string }>('sandbox.create', params, image !== undefined ? { timeoutMs: IMAGE_CREATE_TIMEOUT_MS } : {});
        let sbx: Sandbox;
        try {
          sbx = await Sandbox.connect(r.id, conn);
        } catch (e) {
          await c.call('sandbox.kill', { id: r.id }).catch(() => {});
          throw e;
        }
        if (closed) {
          await sbx.kill().catch(() => false);
          throw new SandboxError('the session closed');
        }
        boxes.set(r.id, sbx);
        const info = await sbx.getInfo();
        return ok({ sandboxId: r.id, endAt: info.endAt?.toISOString() ?? null });
      }),
  );

  tool(
    server,
    'sandbox_list',
    {
      title: 'List sandboxes',
      description: 'Lists the sandboxes this session created and still has.',
      inputSchema: {},
    },
    () =>
      guarded(async () => {
        const out: Array<Record<string, unknown>> = [];
        for (const [id, sbx] of [...boxes]) {
          try {
            const i = await sbx.getInfo();
            out.push({ sandboxId: id, state: i.state, startedAt: i.startedAt.toISOString(), endAt: i.endAt?.toISOString() ?? null, metadata: i.metadata });
          } catch {
            // gone (its lifetime ran out): forget it
            boxes.delete(id);
            await sbx.kill().catch(() => false);
          }
        }
        return ok({ sandboxes: out });
      }),
  );

  tool(
    server,
    'sandbox_kill',
    {
      title: 'Kill a sandbox',
      description: 'Kills a sandbox of this session: every process and file in it is gone.',
      inputSchema: { sandboxId },
    },
    ({ sandboxId: id }) =>
      guarded(async () => {
        const sbx = await box(id);
        boxes.delete(id);
        const killed = await sbx.kill();
        return ok({ sandboxId: id, killed });
      }),
  );

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
    ({ sandboxId: id, cmd, cwd, envs, timeoutMs, stdin, user }) =>
      guarded(async () => {
        const sbx = await box(id);
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
      }),
  );

  tool(
    server,
    'read_file',
    {
      title: 'Read a file',
      description: `Reads a whole file of a sandbox (at most ${maxFile} bytes): as UTF-8 text (the default) or base64. Acts as the sandbox's default account (\`user\`) unless user says otherwise.`,
      inputSchema: {
        sandboxId,
        path: filePath,
        encoding: z.enum(['utf8', 'base64']).optional().describe('utf8 (default) or base64 for binary files.'),
        user: account.optional(),
      },
    },
    ({ sandboxId: id, path, encoding, user }) =>
      guarded(async () => {
        const sbx = await box(id);
        const info = await sbx.files.getInfo(path, { user });
        if (info.type === 'dir') throw new InvalidArgumentError(`${path} is a directory: use list_files`);
        if (info.size > maxFile) {
          throw new InvalidArgumentError(`${path} is ${info.size} bytes, more than read_file returns (${maxFile}); use run_command (head, tail, grep) to look at parts of it`);
        }
        const bytes = await sbx.files.read(path, { format: 'bytes', user });
        if (bytes.length > maxFile) throw new InvalidArgumentError(`${path} grew past ${maxFile} bytes while being read`);
        if (encoding === 'base64') return ok({ path, size: bytes.length, encoding: 'base64', content: Buffer.from(bytes).toString('base64') });
        let text: string;
        try {
          text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
        } catch {
          throw new InvalidArgumentError(`${path} is not valid UTF-8: read it with encoding "base64"`);
        }
        return { content: [{ type: 'text', text }], structuredContent: { path, size: bytes.length, encoding: 'utf8', content: text } };
      }),
  );

  tool(
    server,
    'write_file',
    {
      title: 'Write a file',
      description: `Writes a file in a sandbox, replacing it; missing parent directories are created. At most ${maxFile} bytes. Acts as the sandbox's default account (\`user\`: the file is its own, and it cannot write where it has no permission, e.g. /etc) unless user says otherwise.`,
      inputSchema: {
        sandboxId,
        path: filePath,
        content: z.string().max(Math.ceil((maxFile * 4) / 3) + 4).describe('The content: text, or base64 when encoding is base64.'),
        encoding: z.enum(['utf8', 'base64']).optional().describe('utf8 (default) or base64.'),
        user: account.optional(),
      },
    },
    ({ sandboxId: id, path, content, encoding, user }) =>
      guarded(async () => {
        const sbx = await box(id);
        let bytes: Buffer;
        if (encoding === 'base64') {
          if (!/^[A-Za-z0-9+/]*={0,2}$/.test(content) || content.length % 4 !== 0) throw new InvalidArgumentError('content is not valid base64');
          bytes = Buffer.from(content, 'base64');
        } else {
          bytes = Buffer.from(content, 'utf8');
        }
        if (bytes.length > maxFile) throw new InvalidArgumentError(`content is ${bytes.length} bytes, more than write_file accepts (${maxFile})`);
        await sbx.files.write(path, bytes, { user });
        return ok({ path, size: bytes.length });
      }),
  );

  tool(
    server,
    'list_files',
    {
      title: 'List a directory',
      description: "Lists the entries of a directory in a sandbox, sorted by name: name, type (file, dir, symlink, other), size, permissions. Acts as the sandbox's default account (`user`) unless user says otherwise.",
      inputSchema: { sandboxId, path: filePath, user: account.optional() },
    },
    ({ sandboxId: id, path, user }) =>
      guarded(async () => {
        const sbx = await box(id);
        const entries = await sbx.files.list(path, { user });
        return ok({
          path,
          entries: entries.map((e) => {
            const v: Record<string, unknown> = { name: e.name, type: e.type, size: e.size, permissions: e.permissions };
            if (e.symlinkTarget !== undefined) v.symlinkTarget = e.symlinkTarget;
            return v;
          }),
        });
      }),
  );

  async function close(): Promise<void> {
    if (closed) return;
    closed = true;
    const all = [...boxes.values()];
    boxes.clear();
    await Promise.all(all.map((s) => s.kill().catch(() => false)));
    session?.close();
    await server.close().catch(() => {});
  }

  return { server, close };
}

/**
 * Serves MCP on stdin/stdout until stdin closes or a signal comes, then
 * kills the session's sandboxes.  Resolves when the session is over.
 */
export async function runMcpStdio(opts: McpServerOpts = {}): Promise<void> {
  const { server, close } = createMcpServer(opts);
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
