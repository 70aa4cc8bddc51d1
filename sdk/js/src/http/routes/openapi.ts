/**
 * GET /openapi.json: the API's own description, sdk/js/openapi.json.
 */
import * as fs from 'node:fs';
import * as nodePath from 'node:path';
import type { Router } from '../router';

/** The spec served at /openapi.json: sdk/js/openapi.json. */
export function openApiPath(): string {
  // this file runs as dist/http/routes/openapi.js
  return nodePath.join(__dirname, '..', '..', '..', 'openapi.json');
}

export function register(router: Router): void {
  let spec: string | undefined;
  router.route('GET', '/openapi.json', async (c) => {
    spec ??= fs.readFileSync(openApiPath(), 'utf8');
    c.res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
    c.res.end(spec);
  });
}
