/**
 * One MCP session's state: the sandboxes it may use, the connection that
 * holds them, the background commands it follows, and its bounds.
 *
 * A session's own sandboxes are created with kill_on_disconnect on the
 * session's connection: they die with it.  A sandbox created with a `name`
 * is kept: it outlives the session (until its lifetime ends or someone
 * kills it), carries the name in its metadata (KEEP_KEY), and any session
 * of this server may use it, so that a client that opens a session per
 * call (the MCP Inspector's CLI does) finds it again.
 */
import type { CommandHandle } from '../command-handle';
import { Connection, type ConnectionOpts } from '../connection';
import { NotFoundError, SandboxError } from '../errors';
import { connectionClosed, dropConnection, Sandbox } from '../sandbox';
import type { DaemonFacts } from './facts';
import { fail, type ToolResult, toolError } from './tool';

/** The metadata key that marks a kept sandbox, holding its name. */
export const KEEP_KEY = 'tupper.mcp.name';

export interface SessionLimits {
  /** Most sandboxes at once (its own and kept ones it uses). */
  maxSandboxes: number;
  /** Most characters of stdout and of stderr one result carries. */
  maxOutput: number;
  /** Largest file read_file returns or write_file accepts, bytes. */
  maxFile: number;
  /** Most characters a command may write before it is killed. */
  maxCapture: number;
  /** Most background commands followed at once. */
  maxCommands: number;
  /** How often a long call sends a progress notification, ms. */
  progressIntervalMs: number;
}

/** A command the session started, followed until it is forgotten. */
export interface Followed {
  sandboxId: string;
  handle: CommandHandle;
  /** Set when it wrote more than maxCapture characters and was killed for it. */
  flooded: boolean;
  /** Set when its timeoutMs killed it. */
  timedOut: boolean;
  /** Settles when it ended (never rejects). */
  ended: Promise<void>;
  done: boolean;
  /** Set when another session started it and this one attached to it (a kept sandbox). */
  reattached?: boolean;
}

export class Session {
  readonly conn: ConnectionOpts;
  readonly limits: SessionLimits;
  readonly facts: DaemonFacts;
  /** The sandboxes this session uses, by id. */
  readonly boxes = new Map<string, Sandbox>();
  /** The ids of those that are kept (not killed when the session ends). */
  readonly kept = new Set<string>();
  /** Background commands, by "sandboxId/pid", oldest first. */
  readonly commands = new Map<string, Followed>();
  private held: Connection | undefined;
  private ended = false;

  constructor(conn: ConnectionOpts, limits: SessionLimits, facts: DaemonFacts) {
    this.conn = conn;
    this.limits = limits;
    this.facts = facts;
  }

  /** True once close() began. */
  get closed(): boolean {
    return this.ended;
  }

  /** The connection the session's sandboxes are created on (and die with). */
  async connection(): Promise<Connection> {
    if (!this.held || this.held.closed) this.held = await Connection.open(this.conn);
    return this.held;
  }

  /** Adopts a sandbox object (its own, or a kept one). */
  adopt(s: Sandbox, kept: boolean): void {
    this.boxes.set(s.sandboxId, s);
    if (kept) this.kept.add(s.sandboxId);
  }

  /** Forgets a sandbox and what it ran (killed, or gone). */
  forget(id: string): void {
    const s = this.boxes.get(id);
    this.boxes.delete(id);
    this.kept.delete(id);
    for (const [k, f] of [...this.commands]) if (f.sandboxId === id) this.commands.delete(k);
    if (s) dropConnection(s);
  }

  /** The kept sandbox id, if it is one, adopted by this session. */
  private async adoptKept(id: string): Promise<Sandbox | undefined> {
    let info;
    try {
      // sandbox.get first: a sandbox that is not ours is left as it is (connect would resume a paused one)
      info = await Sandbox.getInfo(id, this.conn);
    } catch (e) {
      if (e instanceof NotFoundError) return undefined;
      throw e;
    }
    if (info.metadata[KEEP_KEY] === undefined) return undefined;
    if (this.boxes.size >= this.limits.maxSandboxes) {
      throw new SandboxError(`this session already uses ${this.boxes.size} sandboxes (at most ${this.limits.maxSandboxes})`);
    }
    const s = await Sandbox.connect(id, this.conn);
    if (this.ended) {
      dropConnection(s);
      throw new SandboxError('the session closed');
    }
    this.adopt(s, true);
    return s;
  }

  /** The sandbox id, on a live connection: the session's own, or a kept one. */
  async box(id: string): Promise<Sandbox> {
    const s = this.boxes.get(id) ?? (await this.adoptKept(id));
    if (!s) {
      throw new NotFoundError(
        `no sandbox ${id} in this session (this server only works on sandboxes it created, or kept ones made with a name; see sandbox_list)`,
      );
    }
    // the daemon drops a connection that falls 64 MiB behind (a flood of
    // output): the sandbox lives on, so a new connection takes over
    if (!connectionClosed(s)) return s;
    const fresh = await Sandbox.connect(id, this.conn);
    if (this.boxes.get(id) !== s) {
      // killed meanwhile by another call: let go of the new connection
      dropConnection(fresh);
      throw new NotFoundError(`no sandbox ${id} in this session any more`);
    }
    this.boxes.set(id, fresh);
    return fresh;
  }

  /** Records a background command; the oldest ended one goes when there are too many. */
  follow(f: Followed): void {
    const { maxCommands } = this.limits;
    if (this.commands.size >= maxCommands) {
      const old = [...this.commands].find(([, x]) => x.done);
      if (!old) throw new SandboxError(`this session already follows ${maxCommands} running background commands: wait for or kill one`);
      this.commands.delete(old[0]);
    }
    this.commands.set(`${f.sandboxId}/${f.handle.pid}`, f);
  }

  /** A background command of this session. */
  followed(id: string, pid: number): Followed {
    const f = this.commands.get(`${id}/${pid}`);
    if (!f) {
      throw new NotFoundError(`no background command ${pid} of this session in sandbox ${id} (only the session that started one follows it)`);
    }
    return f;
  }

  /** fn's result, or its error as a tool error; nothing runs once the session is closing. */
  async guarded(fn: () => Promise<ToolResult>): Promise<ToolResult> {
    if (this.ended) return fail('SandboxError: the session is closing');
    try {
      return await fn();
    } catch (e) {
      return toolError(e);
    }
  }

  /**
   * Kills every sandbox of the session (a kept one lives on; only its
   * connection goes) and lets go of the session's connection; false when it
   * was closed already.
   */
  async close(): Promise<boolean> {
    if (this.ended) return false;
    this.ended = true;
    const all = [...this.boxes.values()];
    const kept = new Set(this.kept);
    this.boxes.clear();
    this.kept.clear();
    this.commands.clear();
    await Promise.all(
      all.map((s) => {
        if (!kept.has(s.sandboxId)) return s.kill().catch(() => false);
        dropConnection(s);
        return undefined;
      }),
    );
    this.held?.close();
    return true;
  }
}
