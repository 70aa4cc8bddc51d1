/**
 * /sandboxes/{id}/commands: run a command (its output streamed, or kept
 * here for a background one), list, follow and kill commands, feed and
 * close their stdin.
 */
import { checkRawLength, readJson, sendJson } from '../body';
import type { ServerContext } from '../context';
import { badRequest, HttpError } from '../errors';
import { type Event, EventWriter, isEnd } from '../events';
import { boolean, checkPath, nonNegInt, onlyKeys, pidParam, sandboxParam, stringMap, userParam } from '../params';
import type { StartOpts } from '../processes';
import type { Exchange, Router } from '../router';

/**
 * The command and its options, from the body of POST .../commands.  stdin:
 * true keeps it open for POST .../stdin; text (`stdin`) or bytes
 * (`stdinBase64`) are written to it, which is then closed.
 */
function runBody(b: Record<string, unknown>): { cmd: string; o: StartOpts; background: boolean; input?: Buffer } {
  onlyKeys(b, ['cmd', 'cwd', 'envs', 'timeoutMs', 'stdin', 'stdinBase64', 'background', 'user'], 'body');
  if (typeof b.cmd !== 'string' || b.cmd === '') throw badRequest('cmd must be a non-empty string');
  const o: StartOpts = {};
  if (b.cwd !== undefined) o.cwd = checkPath(b.cwd, 'cwd');
  if (b.user !== undefined) o.user = userParam(b.user, 'user');
  if (b.envs !== undefined) o.envs = stringMap(b.envs, 'envs');
  if (b.timeoutMs !== undefined) o.timeoutMs = nonNegInt(b.timeoutMs, 'timeoutMs');
  let input: Buffer | undefined;
  if (b.stdin !== undefined && b.stdinBase64 !== undefined) throw badRequest('stdin and stdinBase64: give one');
  if (typeof b.stdin === 'string') input = Buffer.from(b.stdin, 'utf8');
  else if (b.stdin !== undefined) o.stdin = boolean(b.stdin, 'stdin (true, false, or text)');
  if (b.stdinBase64 !== undefined) {
    const t = b.stdinBase64;
    if (typeof t !== 'string' || !/^[A-Za-z0-9+/]*={0,2}$/.test(t) || t.length % 4 !== 0) throw badRequest('stdinBase64 must be base64');
    input = Buffer.from(t, 'base64');
  }
  if (input !== undefined) o.stdin = true;
  const background = b.background !== undefined && boolean(b.background, 'background');
  return { cmd: b.cmd, o, background, input };
}

/** Writes input to the command's stdin and closes it; a command that ended first is no error. */
async function feed(ctx: ServerContext, id: string, pid: number, input: Buffer): Promise<void> {
  try {
    const s = await ctx.boxes.box(id);
    if (input.length) await s.commands.sendStdin(pid, input);
    await s.commands.closeStdin(pid);
  } catch {
    // it ended (or its sandbox went) without reading it all: its exit says more
  }
}

/** Runs cmd, its output streamed to the client; a client that leaves or reads too slowly kills it. */
async function runForeground(ctx: ServerContext, c: Exchange, id: string, cmd: string, o: StartOpts, input: Buffer | undefined): Promise<void> {
  const { processes, maxOutput } = ctx;
  const out = new EventWriter(c.req, c.res, maxOutput);
  let pid = 0;
  let ended = false;
  let overflow = false;
  const kill = () => void processes.kill(id, pid).catch(() => {});
  let finish!: (e: Event) => void;
  const end = new Promise<Event>((resolve) => (finish = resolve));
  pid = await processes.start(id, cmd, o, (e) => {
    if (isEnd(e)) {
      ended = true;
      finish(e);
    } else if (!overflow && !out.send(e)) {
      // the reader does not keep up: the command is killed rather than
      // its output piling up here without bound
      overflow = true;
      out.send({ type: 'error', error: { type: 'RateLimitError', message: `the client read too slowly (over ${maxOutput} bytes waiting): the command was killed` } });
      kill();
    }
  });
  out.start({ type: 'start', pid });
  if (input !== undefined) void feed(ctx, id, pid, input);
  c.res.on('close', () => {
    // the client went away before the end: a foreground command goes too
    if (!ended) kill();
  });
  const ev = await end;
  if (!overflow) out.send(ev);
  out.end();
}

/** The output of a background command: what is kept, then the rest as it comes. */
async function follow(ctx: ServerContext, c: Exchange): Promise<void> {
  const id = sandboxParam(c);
  const pid = pidParam(c);
  const rec = ctx.processes.followed(id, pid);
  if (!rec) {
    throw new HttpError(404, 'NotFoundError', `no background command ${pid} started through this server in sandbox ${id} (or it ended over 10 minutes ago)`);
  }
  const out = new EventWriter(c.req, c.res, ctx.maxOutput);
  out.start();
  if (rec.dropped > 0) out.send({ type: 'dropped', bytes: rec.dropped });
  for (const e of rec.events) out.send(e);
  if (rec.done) return out.end();
  await new Promise<void>((resolve) => {
    const reader = (e: Event) => {
      if (!out.send(e)) {
        out.send({ type: 'error', error: { type: 'RateLimitError', message: 'the client read too slowly; the command runs on' } });
        finish();
      } else if (isEnd(e)) finish();
    };
    const finish = () => {
      rec.readers.delete(reader);
      out.end();
      resolve();
    };
    rec.readers.add(reader);
    c.res.once('close', finish);
  });
}

export function register(router: Router, ctx: ServerContext): void {
  const { boxes, processes, maxBody } = ctx;

  router.route('POST', '/sandboxes/{id}/commands', async (c) => {
    const id = sandboxParam(c);
    const { cmd, o, background, input } = runBody(await readJson(c.req, ctx.maxJson));
    if (!background) return runForeground(ctx, c, id, cmd, o, input);
    const pid = await processes.startBackground(id, cmd, o);
    if (input !== undefined) await feed(ctx, id, pid, input);
    sendJson(c.res, 201, { pid });
  });

  router.route('GET', '/sandboxes/{id}/commands', async (c) => {
    const id = sandboxParam(c);
    const procs = await boxes.onBox(id, (s) => s.commands.list());
    sendJson(c.res, 200, { processes: procs });
  });

  router.route('GET', '/sandboxes/{id}/commands/{pid}', (c) => follow(ctx, c));

  router.route('DELETE', '/sandboxes/{id}/commands/{pid}', async (c) => {
    const id = sandboxParam(c);
    const pid = pidParam(c);
    const killed = await boxes.onBox(id, (s) => s.commands.kill(pid));
    if (!killed) throw new HttpError(404, 'NotFoundError', `no process ${pid} in sandbox ${id}`);
    sendJson(c.res, 200, { killed: true });
  });

  router.route('POST', '/sandboxes/{id}/commands/{pid}/stdin', async (c) => {
    const id = sandboxParam(c);
    const pid = pidParam(c);
    checkRawLength(c.req, maxBody);
    const s = await boxes.box(id);
    let n = 0;
    for await (const chunk of c.req as AsyncIterable<Buffer>) {
      n += chunk.length;
      if (n > maxBody) throw new HttpError(413, 'InvalidArgumentError', `a body is at most ${maxBody} bytes (the first ${n - chunk.length} were written)`);
      await boxes.onBox(id, () => s.commands.sendStdin(pid, chunk));
    }
    sendJson(c.res, 200, { written: n });
  });

  router.route('DELETE', '/sandboxes/{id}/commands/{pid}/stdin', async (c) => {
    const id = sandboxParam(c);
    const pid = pidParam(c);
    await boxes.onBox(id, (s) => s.commands.closeStdin(pid));
    sendJson(c.res, 200, { closed: true });
  });
}
