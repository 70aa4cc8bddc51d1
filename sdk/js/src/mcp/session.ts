/**
 * One MCP session's state: the sandboxes it created (the only ones it may
 * use), the connection that holds them (they are created with
 * kill_on_disconnect on it), and its bounds.
 */
import { Connection, type ConnectionOpts } from '../connection';
import { InvalidArgumentError } from '../errors';
import { connectionClosed, dropConnection, Sandbox } from '../sandbox';
import { fail, type ToolResult, toolError } from './tool';

export interface SessionLimits {
  /** Most sandboxes at once. */
  maxSandboxes: number;
  /** Most characters of stdout and of stderr a command result carries. */
  maxOutput: number;
  /** Largest file read_file returns or write_file accepts, bytes. */
  maxFile: number;
  /** Most characters a command may write before it is killed. */
  maxCapture: number;
}

export class Session {
  readonly conn: ConnectionOpts;
  readonly limits: SessionLimits;
  /** The sandboxes of this session, by id. */
  readonly boxes = new Map<string, Sandbox>();
  private held: Connection | undefined;
  private ended = false;

  constructor(conn: ConnectionOpts, limits: SessionLimits) {
    this.conn = conn;
    this.limits = limits;
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

  /** The session's sandbox id, on a live connection. */
  async box(id: string): Promise<Sandbox> {
    const s = this.boxes.get(id);
    if (!s) {
      throw new InvalidArgumentError(
        `no sandbox ${id} in this session (this server only works on sandboxes it created; see sandbox_list)`,
      );
    }
    // the daemon drops a connection that falls 64 MiB behind (a flood of
    // output): the sandbox lives on, so a new connection takes over
    if (!connectionClosed(s)) return s;
    const fresh = await Sandbox.connect(id, this.conn);
    if (this.boxes.get(id) !== s) {
      // killed meanwhile by another call: let go of the new connection
      dropConnection(fresh);
      throw new InvalidArgumentError(`no sandbox ${id} in this session any more`);
    }
    this.boxes.set(id, fresh);
    return fresh;
  }

  /** fn's result, or its error as a tool error; nothing runs once the session is closing. */
  async guarded(fn: () => Promise<ToolResult>): Promise<ToolResult> {
    if (this.ended) return fail('the session is closing');
    try {
      return await fn();
    } catch (e) {
      return toolError(e);
    }
  }

  /** Kills every sandbox of the session and lets go of its connection; false when it was closed already. */
  async close(): Promise<boolean> {
    if (this.ended) return false;
    this.ended = true;
    const all = [...this.boxes.values()];
    this.boxes.clear();
    await Promise.all(all.map((s) => s.kill().catch(() => false)));
    this.held?.close();
    return true;
  }
}
