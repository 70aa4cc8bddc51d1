/**
 * The HTTP API's errors: an HttpError carries its status; an SDK error gets
 * the status that fits it (docs/http.md lists them).
 */
import {
  errorType,
  ErrorCode,
  type ErrorType,
  InvalidArgumentError,
  NotEnoughSpaceError,
  NotFoundError,
  PermissionError,
  PolicyError,
  SandboxError,
  TimeoutError,
} from '../errors';

/** An error with an HTTP status, answered as JSON; its type is one of ERROR_TYPES. */
export class HttpError extends Error {
  readonly status: number;
  readonly type: ErrorType;
  constructor(status: number, type: ErrorType, message: string) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

const ERRNO_STATUS: Record<string, number> = {
  ENOENT: 404,
  EISDIR: 409,
  ENOTDIR: 409,
  EEXIST: 409,
  ENOTEMPTY: 409,
  EBUSY: 409,
  EACCES: 403,
  EPERM: 403,
  EROFS: 403,
  EINVAL: 400,
  ENAMETOOLONG: 400,
  ELOOP: 400,
  EFBIG: 413,
  ENOSPC: 507,
  EDQUOT: 507,
  EAGAIN: 503,
};

/** The status and JSON body of an error. */
export function errorResponse(e: unknown): { status: number; body: { error: Record<string, unknown> } } {
  const err: Record<string, unknown> = {};
  let status = 500;
  if (e instanceof HttpError) {
    status = e.status;
    err.type = e.type;
    err.message = e.message;
  } else if (e instanceof SandboxError) {
    // a subclass of ours the list does not name answers as its base class
    err.type = errorType(e);
    err.message = e.message;
    if (e.errnoCode) err.code = e.errnoCode;
    if (e instanceof NotFoundError) status = 404;
    else if (e instanceof InvalidArgumentError) status = 400;
    else if (e instanceof TimeoutError) status = 504;
    else if (e instanceof NotEnoughSpaceError) status = 507;
    else if (e instanceof PolicyError || e instanceof PermissionError) status = 403;
    else if (e.code === -32004) status = 503; // busy: too many requests in flight on one connection
    else if (e.code === -32006) status = 422; // an image error (none such, refused, too big)
    else if (e.errnoCode && ERRNO_STATUS[e.errnoCode]) status = ERRNO_STATUS[e.errnoCode];
    else if (e.code === ErrorCode.Sandbox) status = 409;
    else if (e.code === undefined) status = 502; // the daemon could not be reached
  } else {
    err.type = 'InternalError';
    err.message = e instanceof Error ? e.message : String(e);
  }
  return { status, body: { error: err } };
}

/** A 400 InvalidArgumentError: what most validation throws. */
export function badRequest(message: string): HttpError {
  return new HttpError(400, 'InvalidArgumentError', message);
}
