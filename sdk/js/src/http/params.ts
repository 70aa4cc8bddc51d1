/**
 * What a client sends, checked: path parameters, query parameters and the
 * fields of JSON bodies.  Everything refused is a 400 naming the field.
 */
import type { SandboxLimits } from '../sandbox-opts';
import { badRequest } from './errors';
import type { Exchange } from './router';

const SANDBOX_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const PID = /^[1-9][0-9]{0,9}$/;
const MAX_PATH = 4096;

export function checkPath(v: unknown, what: string): string {
  if (typeof v !== 'string' || v === '') throw badRequest(`${what}: a non-empty path is needed`);
  if (v.length > MAX_PATH) throw badRequest(`${what}: longer than ${MAX_PATH} characters`);
  if (v.includes('\0')) throw badRequest(`${what}: a path has no NUL byte`);
  return v;
}

export function stringMap(v: unknown, what: string): Record<string, string> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw badRequest(`${what} must be an object of strings`);
  const out: Record<string, string> = {};
  for (const [k, x] of Object.entries(v)) {
    if (typeof x !== 'string') throw badRequest(`${what}.${k} must be a string`);
    out[k] = x;
  }
  return out;
}

export function nonNegInt(v: unknown, what: string, max = 1e13): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > max) throw badRequest(`${what} must be an integer from 0 to ${max}`);
  return v;
}

export function boolean(v: unknown, what: string): boolean {
  if (typeof v !== 'boolean') throw badRequest(`${what} must be a boolean`);
  return v;
}

export function onlyKeys(body: Record<string, unknown>, allowed: string[], what: string): void {
  for (const k of Object.keys(body)) {
    if (!allowed.includes(k)) throw badRequest(`${what}: unknown field ${JSON.stringify(k)} (known: ${allowed.join(', ')})`);
  }
}

function sizeValue(v: unknown, what: string): number | string {
  if (typeof v === 'string' && v.length <= 32) return v;
  if (typeof v === 'number' && Number.isFinite(v) && v >= 0) return v;
  throw badRequest(`${what} must be a size: bytes, or a string like "256M"`);
}

export function limitsValue(v: unknown): SandboxLimits {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw badRequest('limits must be an object');
  const l = v as Record<string, unknown>;
  onlyKeys(l, ['memory', 'cpus', 'pids', 'disk'], 'limits');
  const out: SandboxLimits = {};
  if (l.memory !== undefined) out.memory = sizeValue(l.memory, 'limits.memory');
  if (l.disk !== undefined) out.disk = sizeValue(l.disk, 'limits.disk');
  if (l.cpus !== undefined) {
    if (typeof l.cpus !== 'number' || !(l.cpus > 0) || l.cpus > 4096) throw badRequest('limits.cpus must be a positive number');
    out.cpus = l.cpus;
  }
  if (l.pids !== undefined) out.pids = nonNegInt(l.pids, 'limits.pids', 1 << 22);
  return out;
}

/** An account name (`user` of a body or query), as the daemon accepts them. */
export function userParam(v: unknown, what: string): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string' || !/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$/.test(v)) {
    throw badRequest(`${what} must be an account name (letters, digits, _ . -; at most 32)`);
  }
  return v;
}

/** The {id} of the path. */
export function sandboxParam(c: Exchange): string {
  const id = c.params.id;
  if (!SANDBOX_ID.test(id)) throw badRequest('bad sandbox id');
  return id;
}

/** The {pid} of the path. */
export function pidParam(c: Exchange): number {
  if (!PID.test(c.params.pid)) throw badRequest('bad pid');
  return Number(c.params.pid);
}

export function pathQuery(c: Exchange, name = 'path'): string {
  return checkPath(c.query.get(name) ?? undefined, `query parameter ${name}`);
}

export function userQuery(c: Exchange): string | undefined {
  return userParam(c.query.get('user') ?? undefined, 'query parameter user');
}
