/**
 * Sandbox.list(): the daemon's sandboxes, filtered here and handed out page
 * by page, as E2B's paginator: newest first unless `order: 'asc'`, a page
 * token that is a cursor (the last sandbox handed out), so that sandboxes
 * created or killed between pages neither repeat nor skip the others.
 */
import { withConnection } from './connection';
import { InvalidArgumentError } from './errors';
import { checkKeys } from './options';
import { type SandboxInfo, type SandboxState, toInfo } from './sandbox-info';
import type { SandboxConnectionOpts } from './sandbox-opts';

/** Order by start time (E2B's): 'desc', newest first, is the default. */
export type SandboxListOrder = 'asc' | 'desc';

export interface SandboxListOpts extends SandboxConnectionOpts {
  /**
   * Filters, combined with AND: every metadata pair must match; state among
   * these (default both); started at or after `startedAfter` (and, tupper's,
   * before `startedBefore`); made from the image (E2B's template) `template`.
   */
  query?: {
    metadata?: Record<string, string>;
    state?: SandboxState[];
    startedAfter?: Date;
    startedBefore?: Date;
    template?: string;
  };
  /** By start time, across the whole list before paging: 'desc' (default) or 'asc'. */
  order?: SandboxListOrder;
  /** Page size (default 100). */
  limit?: number;
  /** Where to start: the `nextToken` of an earlier page. */
  nextToken?: string;
}

const LIST_KEYS = new Set([
  'socket', 'requestTimeoutMs', 'apiKey', 'accessToken', 'domain', 'debug', 'validateApiKey', 'apiUrl', 'retries',
  'logger', 'headers', 'proxy', 'apiHeaders', 'query', 'order', 'limit', 'nextToken',
]);
const QUERY_KEYS = new Set(['metadata', 'state', 'startedAfter', 'startedBefore', 'template']);

interface Cursor {
  t: number;
  id: string;
}

function encodeCursor(c: Cursor): string {
  return Buffer.from(JSON.stringify([c.t, c.id]), 'utf8').toString('base64url');
}

function decodeCursor(token: string): Cursor {
  try {
    const v = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as unknown;
    if (Array.isArray(v) && v.length === 2 && Number.isFinite(v[0]) && typeof v[1] === 'string') return { t: v[0], id: v[1] };
  } catch {
    // below
  }
  throw new InvalidArgumentError(`Sandbox.list: bad nextToken ${JSON.stringify(token)}`);
}

/**
 * Pages over Sandbox.list(), as E2B's SandboxPaginator: `hasNext` is true
 * until the last page was returned by `nextItems()`.
 */
export class SandboxPaginator {
  private readonly opts: SandboxListOpts;
  private readonly limit: number;
  private readonly order: SandboxListOrder;
  private cursor?: Cursor;
  private more = true;

  /** @internal */
  constructor(opts: SandboxListOpts = {}) {
    checkKeys(opts, LIST_KEYS, 'Sandbox.list');
    for (const k of Object.keys(opts.query ?? {})) {
      if (!QUERY_KEYS.has(k)) throw new InvalidArgumentError(`Sandbox.list: unknown query field '${k}'`);
    }
    const states = opts.query?.state;
    if (states !== undefined && (!Array.isArray(states) || states.some((s) => s !== 'running' && s !== 'paused'))) {
      throw new InvalidArgumentError(`Sandbox.list: query.state must list 'running' and/or 'paused'`);
    }
    this.opts = opts;
    this.limit = opts.limit ?? 100;
    if (!Number.isInteger(this.limit) || this.limit < 1) throw new InvalidArgumentError(`Sandbox.list: bad limit ${opts.limit}`);
    this.order = opts.order ?? 'desc';
    if (this.order !== 'asc' && this.order !== 'desc') throw new InvalidArgumentError(`Sandbox.list: order must be 'asc' or 'desc'`);
    if (opts.nextToken !== undefined) this.cursor = decodeCursor(opts.nextToken);
  }

  get hasNext(): boolean {
    return this.more;
  }

  /** The token of the next page, while there is one. */
  get nextToken(): string | undefined {
    return this.more && this.cursor ? encodeCursor(this.cursor) : undefined;
  }

  /** The next page of sandboxes. */
  async nextItems(): Promise<SandboxInfo[]> {
    if (!this.more) throw new InvalidArgumentError('No more items to fetch');
    const r = await withConnection(this.opts, (c) => c.call<{ sandboxes: Array<Record<string, unknown>> }>('sandbox.list', {}));
    const q = this.opts.query ?? {};
    const sign = this.order === 'asc' ? 1 : -1;
    const key = (s: SandboxInfo): Cursor => ({ t: s.startedAt.getTime(), id: s.sandboxId });
    const cmp = (a: Cursor, b: Cursor) => sign * (a.t - b.t || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    const all = r.sandboxes
      .map(toInfo)
      .filter((s) => {
        if (q.state && !q.state.includes(s.state)) return false;
        if (q.startedAfter && s.startedAt.getTime() < q.startedAfter.getTime()) return false;
        if (q.startedBefore && s.startedAt.getTime() >= q.startedBefore.getTime()) return false;
        if (q.template !== undefined && s.templateId !== q.template) return false;
        for (const [k, v] of Object.entries(q.metadata ?? {})) if (s.metadata[k] !== v) return false;
        return true;
      })
      .sort((a, b) => cmp(key(a), key(b)));
    const after = this.cursor;
    const rest = after ? all.filter((s) => cmp(key(s), after) > 0) : all;
    const page = rest.slice(0, this.limit);
    if (page.length > 0) this.cursor = key(page[page.length - 1]);
    this.more = rest.length > page.length;
    return page;
  }
}
