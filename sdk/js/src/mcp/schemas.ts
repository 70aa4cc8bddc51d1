/**
 * The input and output fields the tools share, as zod schema factories.
 * Each call makes a fresh schema: zod-to-json-schema writes a `$ref` for a
 * schema object met twice in one tool, and some model providers' validators
 * refuse `$ref`; fresh objects keep every tool's JSON schema flat.
 */
import { z } from 'zod';

export const sandboxId = () => z.string().min(1).max(128).describe('The id sandbox_create returned.');

export const filePath = (what = "A path inside the sandbox; a relative path is taken from the home of the account the tool acts as (sandbox_create's result says which).") =>
  z
    .string()
    .min(1)
    .max(4096)
    .refine((p) => !p.includes('\0'), 'a path has no NUL byte')
    .describe(what);

export const account = () =>
  z
    .string()
    .min(1)
    .max(32)
    .regex(/^[A-Za-z0-9_][A-Za-z0-9_.-]*$/)
    .describe("The account of the sandbox to act as. Default: the sandbox's default account (sandbox_create's defaultUser); 'root' for system paths such as /etc.");

export const stringMap = (what: string) => z.record(z.string().max(1 << 16)).describe(what);

export const pid = () => z.number().int().min(1).max(2 ** 31).describe('The pid run_command returned for a background command.');

const netRule = () => z.string().min(1).max(512);

/** Network rules (docs/network.md), as sandbox.create takes them. */
export const network = () =>
  z
    .union([
      z.enum(['none', 'all']),
      z
        .object({
          allow: z.array(netRule()).max(256).optional(),
          deny: z.array(netRule()).max(256).optional(),
        })
        .strict(),
    ])
    .describe(
      'What the sandbox may reach: "none" (the default), "all", or {allow, deny} with rules such as "pypi.org", ' +
        '"*.pythonhosted.org:443", "10.1.2.0/24:5432" (deny wins). Commands reach it through the proxy the sandbox is given ($HTTP_PROXY, $ALL_PROXY).',
    );

const size = () => z.union([z.string().min(1).max(32), z.number().int().min(0)]);

export const limits = () =>
  z
    .object({
      memory: size().describe('Memory limit: bytes or "256M", "1G".').optional(),
      cpus: z.number().positive().max(1024).describe('CPU quota in cores, e.g. 0.5.').optional(),
      pids: z.number().int().min(1).max(1 << 22).describe('Most processes and threads at once.').optional(),
      disk: size().describe('Most the sandbox may write: bytes or "1G".').optional(),
    })
    .strict()
    .describe('Resource limits; a limit the host cannot enforce fails the create, naming it.');

/**
 * A recipe: a shipped recipe's name, or a recipe's text.  Never a path: the
 * server reads no file a client names.
 */
export const recipe = () =>
  z
    .union([
      z
        .string()
        .min(1)
        .max(128)
        .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/)
        .refine((s) => !s.endsWith('.lua'), 'a recipe name, not a file (pass its text as {source})'),
      z
        .object({
          source: z.string().min(1).max(1 << 20).describe("The recipe file's text."),
          name: z.string().min(1).max(256).optional().describe('Its file name, for messages (default recipe.lua).'),
          lock: z.string().max(1 << 20).optional().describe("The text of its lockfile, which the create must then honour."),
        })
        .strict(),
    ])
    .describe('Make the sandbox from a recipe (docs/recipes.md): the name of a recipe shipped with the daemon ("default", "alpine", ...) or {source, name, lock}. Not together with image.');

/** What a command result carries: output since an offset, and how it ended. */
export const commandOutputShape = () => ({
  pid: z.number().int().describe('Its pid in the sandbox.'),
  running: z.boolean().describe('True while it runs (poll again with command_output).'),
  exitCode: z.number().int().nullable().describe('Its exit code once it ended, else null.'),
  error: z.string().optional().describe('Why it failed: "exit status 3", "signal: killed", a timeout, ...'),
  timedOut: z.boolean().optional().describe('True when its timeoutMs killed it.'),
  stdout: z.string().describe('Its stdout from stdoutOffset on (cut when long, saying so).'),
  stderr: z.string().describe('Its stderr from stderrOffset on (cut when long, saying so).'),
  stdoutOffset: z.number().int().describe('Where the stdout given ends: pass it as stdoutOffset to read on.'),
  stderrOffset: z.number().int().describe('Where the stderr given ends: pass it as stderrOffset to read on.'),
  truncated: z.boolean().optional().describe('True when stdout or stderr was cut; the marker says how much more there is.'),
  reattached: z.boolean().optional().describe('True when another session started it: its output starts at the last 64 KiB the daemon kept.'),
});
