/**
 * Request bodies in (JSON ones and raw ones, each bounded) and JSON
 * responses out.
 */
import type * as http from 'node:http';
import { badRequest, HttpError } from './errors';

export function sendJson(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': String(Buffer.byteLength(text)),
    'cache-control': 'no-store',
    ...headers,
  });
  res.end(text);
}

/** Waits until the response can take more, or is gone. */
export function drained(res: http.ServerResponse): Promise<void> {
  if (!res.writableNeedDrain || res.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/** The JSON object of the body, at most max bytes; `optional`: no body at all is {}. */
export async function readJson(req: http.IncomingMessage, max: number, optional = false): Promise<Record<string, unknown>> {
  const len = req.headers['content-length'];
  const chunked = req.headers['transfer-encoding'] !== undefined;
  if (optional && !chunked && (len === undefined || len === '0')) return {};
  const type = req.headers['content-type'] ?? '';
  if (!/^application\/json\s*(;|$)/i.test(type)) throw new HttpError(415, 'InvalidArgumentError', 'send the body as Content-Type: application/json');
  if (len !== undefined && Number(len) > max) throw new HttpError(413, 'InvalidArgumentError', `a JSON body is at most ${max} bytes`);
  const parts: Buffer[] = [];
  let n = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > max) throw new HttpError(413, 'InvalidArgumentError', `a JSON body is at most ${max} bytes`);
    parts.push(chunk);
  }
  let v: unknown;
  try {
    v = JSON.parse(Buffer.concat(parts).toString('utf8'));
  } catch {
    throw badRequest('the body is not valid JSON');
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw badRequest('the body must be a JSON object');
  return v as Record<string, unknown>;
}

/** Refuses a raw body whose Content-Length says it is over max bytes (before reading any of it). */
export function checkRawLength(req: http.IncomingMessage, max: number): void {
  const len = req.headers['content-length'];
  if (len !== undefined && Number(len) > max) throw new HttpError(413, 'InvalidArgumentError', `a body is at most ${max} bytes`);
}
