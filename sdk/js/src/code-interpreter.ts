/**
 * @tupper/sdk/code-interpreter: E2B's code interpreter over tupper.  Its
 * Sandbox is the SDK's Sandbox made from the shipped `code-interpreter`
 * recipe (Debian's python3 with Jupyter's ipykernel, numpy, pandas and
 * matplotlib), with runCode and code contexts on top, so that code written
 * against `@e2b/code-interpreter` moves by changing the import.  Each
 * context is a Jupyter kernel in the sandbox, driven by the recipe's
 * driver (docs/code-interpreter.md).
 */
import { Driver, type DriverEvent, failure } from './code-interpreter-driver';
import { type Context, Execution, ExecutionError, type OutputMessage, Result } from './code-interpreter-result';
import { checkTimeoutMs, InvalidArgumentError, SandboxError, TimeoutError } from './errors';
import { Sandbox as BaseSandbox, linkOf } from './sandbox';
import type { SandboxOpts } from './sandbox-opts';

export { type Context, Execution, ExecutionError, type Logs, type OutputMessage, Result } from './code-interpreter-result';
export { DRIVER_PATH } from './code-interpreter-driver';

/** The shipped recipe a code interpreter sandbox is made from, unless told otherwise. */
export const CODE_INTERPRETER_RECIPE = 'code-interpreter';
/** Default bound of one cell, as E2B: 60 s (0: none). */
export const DEFAULT_RUN_CODE_TIMEOUT_MS = 60_000;
/** Most bytes of UTF-8 in one cell (the driver's own bound). */
export const CODE_MAX_BYTES = 1 << 20;
/** How long past its timeoutMs a cell may take to be interrupted (or its kernel restarted) and report. */
const INTERRUPT_SLACK_MS = 150_000;

/** Options of runCode (E2B's RunCodeOpts). */
export interface RunCodeOpts {
  /** Each chunk of the cell's stdout, as it comes. */
  onStdout?: (output: OutputMessage) => void | Promise<void>;
  /** Each chunk of the cell's stderr, as it comes. */
  onStderr?: (output: OutputMessage) => void | Promise<void>;
  /** Each result (a display, or the cell's value), as it comes. */
  onResult?: (result: Result) => void | Promise<void>;
  /** The cell's error, when it raised. */
  onError?: (error: ExecutionError) => void | Promise<void>;
  /** Environment variables the cell sees (set for this cell, then put back). */
  envs?: Record<string, string>;
  /**
   * Interrupt the cell after this long and reject with TimeoutError; the
   * context keeps its variables.  Default 60000; 0 = no bound.
   */
  timeoutMs?: number;
  /** Accepted for E2B compatibility; the cell's own bound is timeoutMs. */
  requestTimeoutMs?: number;
  /** The language; only 'python' for now.  Not together with `context`. */
  language?: string;
  /** The context to run in (its kernel, its variables); default: the sandbox's default python context. */
  context?: Context;
}

/** Options of createCodeContext (E2B's CreateCodeContextOpts). */
export interface CreateCodeContextOpts {
  /** The kernel's working directory; default the sandbox's working directory (/home/user in the recipe). */
  cwd?: string;
  /** Only 'python' for now. */
  language?: string;
  /** Accepted for E2B compatibility. */
  requestTimeoutMs?: number;
}

function idOf(context: Context | string, what: string): string {
  const id = typeof context === 'string' ? context : context?.id;
  if (typeof id !== 'string' || id === '') throw new InvalidArgumentError(`${what}: context must be a Context or its id`);
  return id;
}

function call(cb: ((x: never) => void | Promise<void>) | undefined, arg: unknown): void {
  if (cb) void Promise.resolve((cb as (x: unknown) => void | Promise<void>)(arg)).catch(() => {});
}

/** @internal the driver of each Sandbox object */
const drivers = new WeakMap<BaseSandbox, Driver>();

function driverOf(s: BaseSandbox): Driver {
  let d = drivers.get(s);
  if (!d) {
    d = new Driver(linkOf(s), s.commands);
    drivers.set(s, d);
  }
  return d;
}

/**
 * Runs one cell in a sandbox: what runCode and the MCP and HTTP servers call.
 * Resolves with the Execution; a cell that raised resolves too, with
 * `error` set (as E2B).  Rejects with TimeoutError when timeoutMs ran out
 * (the cell was interrupted), InvalidArgumentError for bad input,
 * NotFoundError for a context that is gone.
 */
export async function runCodeIn(sbx: BaseSandbox, code: string, opts: RunCodeOpts = {}): Promise<Execution> {
  if (typeof code !== 'string') throw new InvalidArgumentError('runCode: code must be a string');
  const size = Buffer.byteLength(code, 'utf8');
  if (size > CODE_MAX_BYTES) {
    throw new InvalidArgumentError(`runCode: the cell is ${size} bytes; at most ${CODE_MAX_BYTES} bytes`);
  }
  if (opts.context !== undefined && opts.language !== undefined) {
    throw new InvalidArgumentError('runCode: give a context or a language, not both (a context has its language)');
  }
  const timeoutMs = checkTimeoutMs(opts.timeoutMs ?? DEFAULT_RUN_CODE_TIMEOUT_MS, 'runCode');
  const params: Record<string, unknown> = { code };
  if (opts.context !== undefined) params.context = idOf(opts.context, 'runCode');
  if (opts.language !== undefined) params.language = opts.language;
  if (timeoutMs > 0) params.timeout = timeoutMs / 1000;
  if (opts.envs !== undefined) params.envs = opts.envs;
  const exec = new Execution();
  const onEvent = (e: DriverEvent) => {
    if (e.type === 'stdout' || e.type === 'stderr') {
      const text = String(e.text ?? '');
      const msg: OutputMessage = { line: text, timestamp: Date.now() * 1000, error: e.type === 'stderr' };
      exec.logs[e.type].push(text);
      call(e.type === 'stdout' ? opts.onStdout : opts.onStderr, msg);
    } else if (e.type === 'result') {
      const r = new Result((e.data ?? {}) as Record<string, unknown>, e.main === true);
      exec.results.push(r);
      call(opts.onResult, r);
    } else if (e.type === 'error') {
      exec.error = new ExecutionError(String(e.name ?? ''), String(e.value ?? ''), String(e.traceback ?? ''));
      call(opts.onError, exec.error);
    }
  };
  const driver = driverOf(sbx);
  let timer: NodeJS.Timeout | undefined;
  const pending = driver.request('execute', params, onEvent);
  const bounded =
    timeoutMs > 0
      ? Promise.race([
          pending,
          new Promise<never>((_, reject) => {
            // the driver interrupts the cell itself; this only guards against a driver that hangs
            timer = setTimeout(() => {
              void driver.stop();
              reject(new TimeoutError(`runCode: no answer ${timeoutMs + INTERRUPT_SLACK_MS} ms after the start; the interpreter was stopped`));
            }, timeoutMs + INTERRUPT_SLACK_MS);
            timer.unref();
          }),
        ])
      : pending;
  let end: DriverEvent;
  try {
    end = await bounded;
  } finally {
    clearTimeout(timer);
  }
  if (end.type === 'fail') throw failure(end, 'runCode');
  if (end.type === 'timeout') {
    throw new TimeoutError(
      end.waited === true
        ? `runCode: the cell waited past timeoutMs (${timeoutMs} ms) for the context's previous cell to end; it did not run`
        : end.restarted === true
        ? `runCode: the cell ran past timeoutMs (${timeoutMs} ms) and did not stop when interrupted; its context was restarted, its variables are gone`
        : `runCode: the cell ran past timeoutMs (${timeoutMs} ms) and was interrupted; the context keeps its variables`,
    );
  }
  if (typeof end.execution_count === 'number') exec.executionCount = end.execution_count;
  return exec;
}

async function contextOp(sbx: BaseSandbox, op: string, params: Record<string, unknown>, what: string): Promise<unknown> {
  const end = await driverOf(sbx).request(op, params);
  if (end.type === 'fail') throw failure(end, what);
  if (end.type !== 'reply') throw new SandboxError(`${what}: unexpected answer ${end.type}`);
  return end.value;
}

function toContext(v: unknown): Context {
  const o = (v ?? {}) as Record<string, unknown>;
  return { id: String(o.id), language: String(o.language), cwd: String(o.cwd ?? '') };
}

/** Makes a new context (its own kernel) in a sandbox. */
export async function createCodeContextIn(sbx: BaseSandbox, opts: CreateCodeContextOpts = {}): Promise<Context> {
  const params: Record<string, unknown> = { cwd: opts.cwd ?? sbx.workdir ?? sbx.home };
  if (opts.language !== undefined) params.language = opts.language;
  return toContext(await contextOp(sbx, 'create_context', params, 'createCodeContext'));
}

/** The contexts of a sandbox's interpreter (the default one once it was used). */
export async function listCodeContextsIn(sbx: BaseSandbox): Promise<Context[]> {
  const v = await contextOp(sbx, 'list_contexts', {}, 'listCodeContexts');
  return Array.isArray(v) ? v.map(toContext) : [];
}

/** Restarts a context's kernel: its variables are gone. */
export async function restartCodeContextIn(sbx: BaseSandbox, context: Context | string): Promise<void> {
  await contextOp(sbx, 'restart_context', { context: idOf(context, 'restartCodeContext') }, 'restartCodeContext');
}

/** Removes a context and stops its kernel. */
export async function removeCodeContextIn(sbx: BaseSandbox, context: Context | string): Promise<void> {
  await contextOp(sbx, 'remove_context', { context: idOf(context, 'removeCodeContext') }, 'removeCodeContext');
}

/**
 * E2B's code interpreter Sandbox: `Sandbox.create()` makes a sandbox from
 * the shipped `code-interpreter` recipe (unless the options name another
 * recipe or an image); everything of the SDK's Sandbox is there too.
 */
export class Sandbox extends BaseSandbox {
  static override async create(opts?: SandboxOpts): Promise<Sandbox>;
  static override async create(template: string, opts?: SandboxOpts): Promise<Sandbox>;
  static override async create(templateOrOpts?: string | SandboxOpts, maybeOpts?: SandboxOpts): Promise<Sandbox> {
    const opts: SandboxOpts =
      typeof templateOrOpts === 'string' ? { ...maybeOpts, image: templateOrOpts } : { ...templateOrOpts };
    if (opts.recipe === undefined && opts.image === undefined) opts.recipe = CODE_INTERPRETER_RECIPE;
    return (await super.create(opts)) as Sandbox;
  }

  static override async connect(...args: Parameters<typeof BaseSandbox.connect>): Promise<Sandbox> {
    return (await super.connect(...args)) as Sandbox;
  }

  /**
   * Runs a cell (E2B's runCode) and resolves with its Execution: results,
   * logs and error.  A cell that raised resolves with `error` set; one
   * that runs past timeoutMs is interrupted and rejects with TimeoutError,
   * its context keeping its variables.
   */
  async runCode(code: string, opts: RunCodeOpts = {}): Promise<Execution> {
    return runCodeIn(this, code, opts);
  }

  /** A new context: its own kernel, its own variables. */
  async createCodeContext(opts: CreateCodeContextOpts = {}): Promise<Context> {
    return createCodeContextIn(this, opts);
  }

  /** The contexts there are (the default python context once a cell ran in it). */
  async listCodeContexts(): Promise<Context[]> {
    return listCodeContextsIn(this);
  }

  /** Restarts a context's kernel: its variables are gone, the context stays. */
  async restartCodeContext(context: Context | string): Promise<void> {
    return restartCodeContextIn(this, context);
  }

  /** Removes a context and stops its kernel; later cells in it reject with NotFoundError. */
  async removeCodeContext(context: Context | string): Promise<void> {
    return removeCodeContextIn(this, context);
  }
}

export default Sandbox;
