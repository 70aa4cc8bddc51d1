/**
 * Where the HTTP API listens: --listen's ADDR:PORT, and which hosts are
 * loopback (no token needed there, and the only Host names accepted
 * without one).
 */
import * as net from 'node:net';
import { InvalidArgumentError } from '../errors';

/** Where the server listens unless told: loopback only. */
export const DEFAULT_LISTEN = '127.0.0.1:8787';

/** True for localhost, ::1, 127.x and their IPv4-mapped forms (brackets allowed). */
export function isLoopbackHost(host: string): boolean {
  const h = host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
  if (h === 'localhost' || h === '::1') return true;
  if (net.isIPv4(h)) return h.startsWith('127.');
  if (h.toLowerCase().startsWith('::ffff:')) return isLoopbackHost(h.slice(7));
  return false;
}

/** Parses ADDR:PORT, [V6]:PORT or PORT. */
export function parseListen(s: string): { host: string; port: number } {
  let host = '127.0.0.1';
  let port: string;
  const m6 = /^\[([0-9a-fA-F:.]+)\]:(\d+)$/.exec(s);
  if (m6) {
    host = m6[1];
    port = m6[2];
  } else if (/^\d+$/.test(s)) {
    port = s;
  } else {
    const i = s.lastIndexOf(':');
    if (i <= 0) throw new InvalidArgumentError(`--listen ${s}: want ADDR:PORT, [IPV6]:PORT or PORT`);
    host = s.slice(0, i);
    port = s.slice(i + 1);
    if (host.includes(':')) throw new InvalidArgumentError(`--listen ${s}: write an IPv6 address in brackets, [::1]:8787`);
  }
  const n = Number(port);
  if (!/^\d+$/.test(port) || !Number.isInteger(n) || n < 0 || n > 65535) throw new InvalidArgumentError(`--listen ${s}: bad port`);
  if (host !== 'localhost' && net.isIP(host) === 0) throw new InvalidArgumentError(`--listen ${s}: the address must be an IP address or localhost`);
  return { host, port: n };
}
