/**
 * Sandbox.list(): the daemon's sandboxes, filtered here and handed out page
 * by page, as E2B's paginator.
 */
import { withConnection } from './connection';
import { InvalidArgumentError } from './errors';
import { type SandboxInfo, type SandboxState, toInfo } from './sandbox-info';
import type { SandboxConnectionOpts } from './sandbox-opts';

export interface SandboxListOpts extends SandboxConnectionOpts {
  /**
   * Filter on the client side: every metadata pair must match; state among
   * these; started at or after `startedAfter` and before `startedBefore`.
   */
  query?: { metadata?: Record<string, string>; state?: SandboxState[]; startedAfter?: Date; startedBefore?: Date };
  /** Page size (default 100). */
  limit?: number;
  /** Where to start: a token from an earlier page. */
  nextToken?: string;
}

/**
 * Pages over Sandbox.list(), as E2B's SandboxPaginator: `hasNext` is true
 * until the last page was returned by `nextItems()`.
 */
export class SandboxPaginator {
  private readonly opts: SandboxListOpts;
  private readonly limit: number;
  private offset: number;
  private more = true;

  /** @internal */
  constructor(opts: SandboxListOpts = {}) {
    this.opts = opts;
    this.limit = opts.limit ?? 100;
    if (!Number.isInteger(this.limit) || this.limit < 1) throw new InvalidArgumentError(`Sandbox.list: bad limit ${opts.limit}`);
    this.offset = opts.nextToken ? Number.parseInt(opts.nextToken, 10) : 0;
    if (!Number.isInteger(this.offset) || this.offset < 0) throw new InvalidArgumentError(`Sandbox.list: bad nextToken ${opts.nextToken}`);
  }

  get hasNext(): boolean {
    return this.more;
  }

  /** The token of the next page, while there is one. */
  get nextToken(): string | undefined {
    return this.more ? String(this.offset) : undefined;
  }

  /** The next page of sandboxes, oldest first. */
  async nextItems(): Promise<SandboxInfo[]> {
    if (!this.more) throw new InvalidArgumentError('Sandbox.list: no more items to fetch');
    const r = await withConnection(this.opts, (c) => c.call<{ sandboxes: Array<Record<string, unknown>> }>('sandbox.list', {}));
    const q = this.opts.query ?? {};
    const all = r.sandboxes.map(toInfo).filter((s) => {
      if (q.state && !q.state.includes(s.state)) return false;
      if (q.startedAfter && s.startedAt.getTime() < q.startedAfter.getTime()) return false;
      if (q.startedBefore && s.startedAt.getTime() >= q.startedBefore.getTime()) return false;
      for (const [k, v] of Object.entries(q.metadata ?? {})) if (s.metadata[k] !== v) return false;
      return true;
    });
    const page = all.slice(this.offset, this.offset + this.limit);
    this.offset += page.length;
    this.more = this.offset < all.length;
    return page;
  }
}
