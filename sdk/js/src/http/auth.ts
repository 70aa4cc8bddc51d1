/**
 * Who may call: with a token, every request carries it (compared in
 * constant time); without one, nothing a browser could send on a web
 * page's behalf (an Origin header, a Host that is not loopback: DNS
 * rebinding).
 */
import * as crypto from 'node:crypto';
import type * as http from 'node:http';
import { InvalidArgumentError } from '../errors';
import { isLoopbackHost } from './address';
import { sendJson } from './body';

/** Shortest bearer token accepted. */
export const MIN_TOKEN_LENGTH = 16;

function digest(s: string): Buffer {
  return crypto.createHash('sha256').update(s, 'utf8').digest();
}

/**
 * The gate of a server with this token (or none): a function that answers
 * a request it refuses (401, 403) and says true, or says false.
 */
export function gate(token: string | undefined): (req: http.IncomingMessage, res: http.ServerResponse) => boolean {
  if (token !== undefined && token.length < MIN_TOKEN_LENGTH) {
    throw new InvalidArgumentError(`the bearer token must be at least ${MIN_TOKEN_LENGTH} characters`);
  }
  const tokenDigest = token !== undefined ? digest(token) : undefined;
  return (req, res) => {
    if (tokenDigest) {
      const h = req.headers.authorization ?? '';
      const m = /^Bearer ([\x21-\x7e]+)$/.exec(h);
      const given = digest(m ? m[1] : '');
      // both are SHA-256 digests: equal lengths, compared in constant time
      if (!m || !crypto.timingSafeEqual(given, tokenDigest)) {
        sendJson(res, 401, { error: { type: 'AuthenticationError', message: 'a valid Authorization: Bearer token is required' } }, { 'www-authenticate': 'Bearer' });
        return true;
      }
      return false;
    }
    if (req.headers.origin !== undefined) {
      sendJson(res, 403, { error: { type: 'AuthenticationError', message: 'requests from web pages (with an Origin header) are refused without a bearer token' } });
      return true;
    }
    const host = (req.headers.host ?? '').replace(/:\d+$/, '');
    if (!isLoopbackHost(host)) {
      sendJson(res, 403, { error: { type: 'AuthenticationError', message: `Host ${host} is not a loopback name: refused without a bearer token` } });
      return true;
    }
    return false;
  };
}
