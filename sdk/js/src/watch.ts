/**
 * files.watchDir: a directory watched in a sandbox; its events arrive as
 * fs.event notifications on the connection that asked.
 */
import { DEADLINE_HINT } from './command-handle';
import { SandboxError, TimeoutError } from './errors';
import type { EntryInfo } from './entry';
import type { SandboxLink } from './link';

/** What watchDir reports, as E2B's FilesystemEventType (plus tupper's OVERFLOW). */
export const FilesystemEventType = {
  CHMOD: 'chmod',
  CREATE: 'create',
  REMOVE: 'remove',
  RENAME: 'rename',
  WRITE: 'write',
  /** Events were lost, or a new directory could not be watched (tupper's own). */
  OVERFLOW: 'overflow',
} as const;
export type FilesystemEventType = (typeof FilesystemEventType)[keyof typeof FilesystemEventType];

export interface FilesystemEvent {
  /** The path relative to the watched directory. */
  name: string;
  type: FilesystemEventType;
  /** Why, for an OVERFLOW. */
  message?: string;
  /** The exact bytes of a name that is not UTF-8 (`name` then shows U+FFFD). */
  nameRaw?: Uint8Array;
  /** With watchDir's `includeEntry`: what is at the path now (not for a removal, nor once it is gone again). */
  entry?: EntryInfo;
}

export interface WatchOpts {
  /** Also every subdirectory, and each new one as it appears. Default false. */
  recursive?: boolean;
  /** Stop watching after this long (onExit gets a TimeoutError); 0 = never. Default 60000, as E2B. */
  timeoutMs?: number;
  /** Called once when the watch ends: no argument after stop(), an error otherwise. */
  onExit?: (err?: Error) => void | Promise<void>;
  /** The account it watches as (default: the sandbox's default account); see FilesystemRequestOpts. */
  user?: string;
  requestTimeoutMs?: number;
  /** E2B's request signal: one already aborted starts no watch (AbortError). */
  signal?: AbortSignal;
  /** E2B's: each event but a removal carries its EntryInfo (fetched with files.getInfo as it comes). */
  includeEntry?: boolean;
  /** Accepted (E2B refuses network mounts without it): tupper watches what inotify sees in the box. */
  allowNetworkMounts?: boolean;
}

/** Default duration of a watch, as E2B: 60 s. */
export const DEFAULT_WATCH_TIMEOUT_MS = 60_000;

/** A directory being watched (files.watchDir). */
export class WatchHandle {
  private readonly link: SandboxLink;
  /** The daemon's id of this watch. */
  readonly watchId: number;
  private readonly onExit?: (err?: Error) => void | Promise<void>;
  private readonly forget: (h: WatchHandle) => void;
  private ended = false;
  private timer?: NodeJS.Timeout;
  private dropClose: () => void = () => {};

  /** @internal */
  constructor(
    link: SandboxLink,
    watchId: number,
    onEvent: (e: FilesystemEvent) => void | Promise<void>,
    opts: WatchOpts,
    forget: (h: WatchHandle) => void,
  ) {
    this.link = link;
    this.watchId = watchId;
    this.forget = forget;
    this.onExit = opts.onExit;
    link.conn.hold();
    link.conn.subscribeWatch(link.sandboxId, watchId, (_method, p) => {
      if (this.ended) return;
      const type = String(p.type);
      if (type === 'end') {
        this.finish(new SandboxError(`watch ${watchId}: ${typeof p.message === 'string' ? p.message : 'ended'}`));
        return;
      }
      const e: FilesystemEvent = { name: String(p.name ?? ''), type: type as FilesystemEventType };
      if (typeof p.message === 'string') e.message = p.message;
      if (typeof p.name_raw === 'string') e.nameRaw = new Uint8Array(Buffer.from(p.name_raw, 'base64'));
      void Promise.resolve(onEvent(e)).catch(() => {});
    });
    this.dropClose = link.conn.onClose((e) => this.finish(new SandboxError(`watch ${watchId}: ${e.message}`, { cause: e })));
    const timeoutMs = opts.timeoutMs ?? DEFAULT_WATCH_TIMEOUT_MS;
    if (timeoutMs > 0) {
      this.timer = setTimeout(() => {
        void this.stopWith(new TimeoutError(`[deadline_exceeded] watch ${watchId} ran for its timeoutMs (${timeoutMs} ms): ${DEADLINE_HINT}`));
      }, timeoutMs);
    }
  }

  /** @internal the sandbox was killed */
  _sandboxGone(why: string): void {
    this.finish(new SandboxError(`watch ${this.watchId}: the sandbox is gone (${why})`));
  }

  /** Stops watching; no event comes after it resolves. */
  async stop(): Promise<void> {
    await this.stopWith(undefined);
  }

  private async stopWith(err: Error | undefined): Promise<void> {
    if (this.ended) return;
    this.finish(err);
    try {
      await this.link.conn.call('fs.unwatch', { sandbox: this.link.sandboxId, watch: this.watchId });
    } catch {
      // the watch or the sandbox ended meanwhile: nothing left to stop
    }
  }

  private finish(err: Error | undefined): void {
    if (this.ended) return;
    this.ended = true;
    this.forget(this);
    if (this.timer) clearTimeout(this.timer);
    this.link.conn.unsubscribeWatch(this.link.sandboxId, this.watchId);
    this.dropClose();
    this.link.conn.release();
    if (this.onExit) void Promise.resolve(this.onExit(err)).catch(() => {});
  }
}
