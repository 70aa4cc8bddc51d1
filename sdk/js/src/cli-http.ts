#!/usr/bin/env node
/**
 * `tupper-http` (and `tupper http`): the HTTP API in the foreground.
 */
import { DEFAULT_LISTEN, listenHttp, type HttpServerOpts } from './http';

const USAGE = `usage: tupper http [--listen ADDR:PORT] [--token TOKEN] [--socket PATH]
                   [--max-body BYTES] [--max-json BYTES]

Serves tupper's HTTP API (sdk/js/openapi.json, also at /openapi.json).
  --listen ADDR:PORT  where to listen (default ${DEFAULT_LISTEN}); any
                      address but loopback needs a token
  --token TOKEN       every request must carry Authorization: Bearer TOKEN
                      (at least 16 characters; default: $TUPPER_HTTP_TOKEN)
  --socket PATH       the daemon's socket (default: $TUPPER_SOCKET or the
                      daemon's default)
  --max-body BYTES    largest file upload or stdin body (default 1 GiB)
  --max-json BYTES    largest JSON body (default 1 MiB)
`;

function bytes(v: string | undefined, what: string): number {
  if (v === undefined || !/^\d{1,15}$/.test(v) || Number(v) < 1) throw new Error(`${what} wants a positive number of bytes`);
  return Number(v);
}

async function main(argv: string[]): Promise<number> {
  const opts: HttpServerOpts & { listen?: string } = {};
  const env = process.env.TUPPER_HTTP_TOKEN;
  if (env !== undefined && env !== '') opts.token = env;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = argv[i + 1];
    if (a === '--help' || a === '-h') {
      process.stdout.write(USAGE);
      return 0;
    }
    if (v === undefined) throw new Error(`unknown or incomplete option ${a}\n${USAGE}`);
    if (a === '--listen') opts.listen = v;
    else if (a === '--token') opts.token = v;
    else if (a === '--socket') opts.socket = v;
    else if (a === '--max-body') opts.maxBodyBytes = bytes(v, a);
    else if (a === '--max-json') opts.maxJsonBytes = bytes(v, a);
    else throw new Error(`unknown option ${a}\n${USAGE}`);
    i++;
  }
  const s = await listenHttp(opts);
  process.stderr.write(`tupper http: listening on ${s.url}${opts.token ? ' (bearer token required)' : ''}\n`);
  await new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
    process.on('SIGHUP', stop);
  });
  await s.close();
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    process.stderr.write(`tupper http: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exitCode = 2;
  },
);
