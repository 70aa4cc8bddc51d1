/**
 * An HTTP API over tupper's sandboxes (node:http, no framework), built on
 * this package's Sandbox.  REST routes for sandboxes, commands (output
 * streamed as NDJSON or server-sent events) and files (raw bodies, streamed
 * in 1 MiB chunks both ways: a file never sits whole in memory).  The routes
 * are HTTP_ROUTES; openapi.json documents each of them (a test checks it).
 *
 * Security: it binds 127.0.0.1 unless told otherwise, and refuses to listen
 * on any other address without a bearer token, which every request must
 * then carry.  Without a token it refuses requests a browser could send on
 * a web page's behalf: any request with an Origin header, or whose Host is
 * not a loopback name (DNS rebinding).  Bodies are bounded (JSON and raw
 * ones separately), and everything from the client is validated.
 *
 * The code is in http/: server.ts makes the server, routes/ holds one
 * module per group of routes (sandboxes, commands, files, the spec).  This
 * module is the package's `@tupper/sdk/http`.
 */
export { DEFAULT_LISTEN, parseListen } from './http/address';
export { MIN_TOKEN_LENGTH } from './http/auth';
export { errorResponse, HttpError } from './http/errors';
export { ERROR_TYPES, type ErrorType } from './errors';
export { HTTP_ROUTES } from './http/router';
export { openApiPath } from './http/routes/openapi';
export { createHttpServer, type HttpServerOpts, listenHttp, type TupperHttpServer } from './http/server';
