/**
 * Typed errors, named as in E2B's SDK so that `catch (e) { if (e instanceof
 * NotFoundError) ... }` moves over unchanged.  Every error of this SDK is a
 * SandboxError; when the daemon answered with a JSON-RPC error, `code` and
 * `data` say what it said.
 */

/** JSON-RPC error codes of the daemon (docs/protocol.md). */
export const ErrorCode = {
  ParseError: -32700,
  InvalidRequest: -32600,
  MethodNotFound: -32601,
  InvalidParams: -32602,
  Internal: -32603,
  NotFound: -32000,
  Sandbox: -32001,
  File: -32002,
  Process: -32003,
  Busy: -32004,
  PolicyDenied: -32005,
} as const;

/** `data` of a file or process error: the errno and its name, e.g. ENOENT. */
export interface ErrnoData {
  errno: number;
  code: string;
}

/** Base class of every error this SDK throws. */
export class SandboxError extends Error {
  /** The daemon's JSON-RPC error code, when the daemon said it. */
  readonly code?: number;
  /** The daemon's error data (for file and process errors: `{errno, code}`). */
  readonly data?: unknown;
  /** E2B's HTTP status of the API answer behind it: tupper has no HTTP API under the SDK; set by RateLimitError (429) only. */
  statusCode?: number;

  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'SandboxError';
    if (opts.code !== undefined) this.code = opts.code;
    if (opts.data !== undefined) this.data = opts.data;
  }

  /** The errno name (`ENOENT`, `EACCES`, ...) of a file or process error. */
  get errnoCode(): string | undefined {
    const d = this.data as Partial<ErrnoData> | undefined;
    return d && typeof d.code === 'string' ? d.code : undefined;
  }
}

/**
 * Something took too long: a command ran past its `timeoutMs`, a request got
 * no answer in `requestTimeoutMs`, or the sandbox is gone (killed, or its
 * lifetime ran out) while something waited on it, which E2B reports as a
 * timeout too.
 */
export class TimeoutError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'TimeoutError';
  }
}

/** No such sandbox, process, file or directory (-32000, or ENOENT). */
export class NotFoundError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'NotFoundError';
  }
}

/** No such file or directory in the sandbox (ENOENT of a file call), as E2B's FileNotFoundError. */
export class FileNotFoundError extends NotFoundError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'FileNotFoundError';
  }
}

/** No such sandbox (it never was, was killed, or its lifetime ran out), as E2B's SandboxNotFoundError. */
export class SandboxNotFoundError extends NotFoundError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'SandboxNotFoundError';
  }
}

/** The daemon refused for now: too many requests in flight on the connection (-32004), as E2B's RateLimitError. */
export class RateLimitError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'RateLimitError';
    this.statusCode = 429;
  }
}

/** A bad argument, found by the SDK or by the daemon (-32602). */
export class InvalidArgumentError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'InvalidArgumentError';
  }
}

/** The sandbox's disk is full or its disk limit reached (ENOSPC, EDQUOT). */
export class NotEnoughSpaceError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'NotEnoughSpaceError';
  }
}

/**
 * The box's permissions refused a file operation or a command's start
 * (EACCES, EPERM): the account it acted as may not do that (tupper's own,
 * as E2B reports it with a plain SandboxError).
 */
export class PermissionError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'PermissionError';
  }
}

/**
 * E2B's errors of its API that tupper's SDK never throws (there is no API
 * key, capacity service, envd version or remote build under it), exported
 * so that code catching them runs unchanged.  SandboxErrors here, as every
 * error of this SDK.
 */
export class AuthenticationError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'AuthenticationError';
  }
}
/** E2B's HTTP 503 "service busy": never thrown (the daemon answers RateLimitError when busy). */
export class ServiceBusyError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'ServiceBusyError';
    this.statusCode = 503;
  }
}
/** E2B's "template's envd too old": never thrown (tupper's agent comes with the daemon). */
export class TemplateError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'TemplateError';
  }
}
/** E2B's remote template build failed: never thrown (Template.build fails with the daemon's error). */
export class BuildError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'BuildError';
  }
}
/** E2B's upload of a template's files failed: never thrown (a recipe's files are read locally). */
export class FileUploadError extends BuildError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'FileUploadError';
  }
}

/** A policy file refused the operation (-32005); the message names the file and the rule. */
export class PolicyError extends SandboxError {
  constructor(message: string, opts: { code?: number; data?: unknown; cause?: unknown } = {}) {
    super(message, opts);
    this.name = 'PolicyError';
  }
}

/**
 * Every error type name, one set for the SDK, the MCP server and the HTTP
 * API (docs/http.md and openapi.json list them; a test checks that the
 * servers use no other).  The first eight are this SDK's error classes
 * (an MCP tool error's text starts with one, an HTTP error's `type` is
 * one); the last three only a server reports: a request refused before it
 * reached a sandbox (no or a wrong token, a web page's request), one turned
 * away because the server is at a bound, and a bug of the server.  E2B's
 * names where E2B has one.
 */
export const ERROR_TYPES = [
  'SandboxError',
  'TimeoutError',
  'NotFoundError',
  'InvalidArgumentError',
  'NotEnoughSpaceError',
  'PermissionError',
  'PolicyError',
  'CommandExitError',
  'AuthenticationError',
  'RateLimitError',
  'InternalError',
] as const;

export type ErrorType = (typeof ERROR_TYPES)[number];

/**
 * The type name the servers answer for an SDK error: its class's name, or
 * that of the nearest ancestor in ERROR_TYPES (E2B's FileNotFoundError and
 * SandboxNotFoundError are NotFoundError there), else SandboxError.
 */
export function errorType(e: SandboxError): ErrorType {
  for (let p: object | null = Object.getPrototypeOf(e); p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = (p.constructor as { name?: string } | undefined)?.name;
    if (name && (ERROR_TYPES as readonly string[]).includes(name)) return name as ErrorType;
  }
  return 'SandboxError';
}

/** A timeoutMs the caller gave: a finite number, 0 or more; else InvalidArgumentError naming `what`. */
export function checkTimeoutMs(ms: unknown, what: string): number {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) throw new InvalidArgumentError(`${what}: bad timeoutMs ${String(ms)}`);
  return ms;
}

/** What a finished command gave: E2B's CommandResult. */
export interface CommandResult {
  exitCode: number;
  /** Why it failed, when it did: "exit status 3", "signal: killed", ... */
  error?: string;
  stdout: string;
  stderr: string;
  /** With maxOutputBytes: whether older output was dropped, and how many bytes per stream. */
  truncated?: boolean;
  stdoutDroppedBytes?: number;
  stderrDroppedBytes?: number;
}

/**
 * A command exited with a non-zero code (or was killed by a signal): thrown
 * by `commands.run` and `CommandHandle.wait`, as in E2B.
 */
export class CommandExitError extends SandboxError implements CommandResult {
  readonly result: CommandResult;

  constructor(result: CommandResult) {
    super(result.error ?? `exit status ${result.exitCode}`);
    this.name = 'CommandExitError';
    this.result = result;
  }

  get exitCode(): number {
    return this.result.exitCode;
  }
  get error(): string | undefined {
    return this.result.error;
  }
  get stdout(): string {
    return this.result.stdout;
  }
  get stderr(): string {
    return this.result.stderr;
  }
}

/** Turns a JSON-RPC error object of the daemon into a typed error. */
export function fromRpcError(err: { code?: unknown; message?: unknown; data?: unknown }, method: string): SandboxError {
  const code = typeof err.code === 'number' ? err.code : undefined;
  const msg = `${method}: ${typeof err.message === 'string' ? err.message : 'error'}`;
  const opts = { code, data: err.data };
  const errno = (err.data as Partial<ErrnoData> | undefined)?.code;
  switch (code) {
    case ErrorCode.NotFound:
      // "no sandbox 'ID'": whatever call named a sandbox there is none of
      // (E2B's message first: code matches on "Sandbox ID not found")
      {
        const m = /: no sandbox '([^']*)'/.exec(msg);
        if (m) return new SandboxNotFoundError(`Sandbox ${m[1]} not found (${msg})`, opts);
      }
      return new NotFoundError(msg, opts);
    case ErrorCode.Busy:
      return new RateLimitError(msg, opts);
    case ErrorCode.InvalidParams:
      return new InvalidArgumentError(msg, opts);
    case ErrorCode.PolicyDenied:
      return new PolicyError(msg, opts);
    case ErrorCode.File:
    case ErrorCode.Process:
      if (errno === 'ENOENT') return code === ErrorCode.File ? new FileNotFoundError(msg, opts) : new NotFoundError(msg, opts);
      if (errno === 'ENOSPC' || errno === 'EDQUOT') return new NotEnoughSpaceError(msg, opts);
      if (errno === 'EACCES' || errno === 'EPERM') return new PermissionError(msg, opts);
      return new SandboxError(msg, opts);
    default:
      return new SandboxError(msg, opts);
  }
}
