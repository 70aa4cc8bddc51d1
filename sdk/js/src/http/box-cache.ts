/**
 * The Sandbox objects the server uses: one (one daemon connection) per
 * sandbox it was asked about, forgotten when the sandbox is gone.
 */
import type { ConnectionOpts } from '../connection';
import { ErrorCode, NotFoundError } from '../errors';
import { dropConnection, Sandbox } from '../sandbox';
import { HttpError } from './errors';

export class BoxCache {
  private readonly conn: ConnectionOpts;
  private readonly boxes = new Map<string, Promise<Sandbox>>();
  /** What else forgets a sandbox when it is gone (its commands), before its Sandbox object goes. */
  private readonly onEvict: (id: string) => void;

  constructor(conn: ConnectionOpts, onEvict: (id: string) => void) {
    this.conn = conn;
    this.onEvict = onEvict;
  }

  /** The ids of the sandboxes held. */
  ids(): string[] {
    return [...this.boxes.keys()];
  }

  /** True when a Sandbox object is held (or being made) for id. */
  has(id: string): boolean {
    return this.boxes.has(id);
  }

  /** Holds s (or the Sandbox it will be) for id; one that fails is let go. */
  remember(id: string, s: Promise<Sandbox>): void {
    this.boxes.set(id, s);
    s.catch(() => this.boxes.delete(id));
  }

  /** The Sandbox of id; 409 when it is paused (Sandbox.connect would resume it: only POST .../resume may). */
  box(id: string): Promise<Sandbox> {
    let p = this.boxes.get(id);
    if (!p) {
      p = Sandbox.getInfo(id, this.conn).then((info) => {
        if (info.state === 'paused') throw new HttpError(409, 'SandboxError', `sandbox ${id} is paused: POST /sandboxes/${id}/resume first`);
        return Sandbox.connect(id, this.conn);
      });
      this.remember(id, p);
    }
    return p;
  }

  /** fn on the Sandbox of id; a NotFoundError from it makes sure the sandbox still is. */
  async onBox<T>(id: string, fn: (s: Sandbox) => Promise<T>): Promise<T> {
    const s = await this.box(id);
    try {
      return await fn(s);
    } catch (e) {
      this.checkGone(id, e);
      throw e;
    }
  }

  /** After a NotFoundError: forget the sandbox if it is gone (and not just a process or file). */
  checkGone(id: string, e: unknown): void {
    if (!(e instanceof NotFoundError) || e.code !== ErrorCode.NotFound) return;
    void Sandbox.getInfo(id, this.conn).then(
      () => {},
      (err: unknown) => {
        if (err instanceof NotFoundError) this.evict(id);
      },
    );
  }

  /** Forgets a sandbox that is gone: its commands, then its Sandbox object and connection. */
  evict(id: string): void {
    this.onEvict(id);
    const p = this.boxes.get(id);
    if (!p) return;
    this.boxes.delete(id);
    void p.then(dropConnection, () => {});
  }

  /** Lets go of every Sandbox object (the sandboxes stay). */
  async close(): Promise<void> {
    const all = [...this.boxes.values()];
    this.boxes.clear();
    for (const p of all) await p.then(dropConnection, () => {});
  }
}
