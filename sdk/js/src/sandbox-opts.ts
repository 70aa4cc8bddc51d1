/**
 * What Sandbox.create, Sandbox.connect and the static calls take.
 */
import type { ConnectionOpts } from './connection';
import type { PolicyOpt } from './policy';
import type { RecipeOpt } from './recipe';
import type { SandboxNetworkOpts } from './e2b-network';

/** Options every call that talks to the daemon takes. */
export interface SandboxConnectionOpts extends ConnectionOpts {
  /** Accepted and ignored (E2B compatibility): the daemon's socket is guarded by its file mode. */
  apiKey?: string;
  /** Accepted and ignored (E2B compatibility). */
  accessToken?: string;
  /** Accepted and ignored (E2B compatibility). */
  domain?: string;
  /** Accepted and ignored (E2B compatibility). */
  debug?: boolean;
  /**
   * E2B's API client options, accepted and not used: there is no API
   * server, envd URL, retry or HTTP header under tupper's SDK (the daemon's
   * socket is the one transport).
   */
  validateApiKey?: boolean;
  apiUrl?: string;
  sandboxUrl?: string;
  retries?: number;
  logger?: unknown;
  headers?: Record<string, string>;
  proxy?: unknown;
  apiHeaders?: Record<string, string>;
  signal?: AbortSignal;
}

/** Resource limits (docs/protocol.md, sandbox.create). */
export interface SandboxLimits {
  /** Bytes, or a string like "256M", "1.5G". */
  memory?: number | string;
  /** CPU quota in cores, e.g. 0.5. */
  cpus?: number;
  /** Most processes and threads at once. */
  pids?: number;
  /** Most the box may write: bytes or a string like "1G". */
  disk?: number | string;
}

/**
 * What a sandbox may reach (docs/network.md): `"none"` (the default), `"all"`
 * (trusted use), or rules such as `"pypi.org"`, `"*.pythonhosted.org:443"`,
 * `"10.1.2.0/24:5432"`; deny wins.
 */
export type NetworkRules = 'none' | 'all' | { allow?: string[]; deny?: string[] };

/** One decision of the sandbox's network log. */
export interface NetworkLogEntry {
  time: string;
  action: 'allow' | 'deny' | 'fail';
  via: string;
  host?: string;
  port?: number;
  reason?: string;
  addr?: string;
}

export interface SandboxOpts extends SandboxConnectionOpts {
  /** E2B's template: the image (as `Sandbox.create(template, opts)`). */
  template?: string;
  /** The image (E2B's template). Only "default", the embedded busybox image, for now. */
  image?: string;
  /**
   * Volumes to mount, as E2B's: mount point in the box -> a Volume or a
   * volume's name (docs/volumes.md). One sandbox at a time mounts a volume.
   */
  volumeMounts?: Record<string, { readonly volumeId: string } | string>;
  /**
   * A snapshot's id or name (Sandbox.createSnapshot): the sandbox starts from
   * its files, env, limits and network rules (docs/snapshots.md).  E2B's form,
   * Sandbox.create(snapshotId), works as well.
   */
  snapshot?: string;
  /**
   * Where it runs: 'linux' (the default: namespaces on the host's kernel) or
   * 'microvm' (a QEMU microVM with its own kernel; same API, see docs/microvm.md).
   */
  backend?: 'linux' | 'microvm';
  /**
   * A microVM's accelerator: 'kvm', 'tcg' (emulation) or 'auto' (the
   * daemon's choice, the default).  A start that cannot run on it fails
   * with QEMU's own words; see docs/microvm.md.
   */
  accel?: 'kvm' | 'tcg' | 'auto';
  /** Environment of every command. */
  envs?: Record<string, string>;
  /** Free-form strings, returned by getInfo and list. */
  metadata?: Record<string, string>;
  /** Lifetime: the daemon kills the sandbox this long after create (0: until killed). Default 300000. */
  timeoutMs?: number;
  limits?: SandboxLimits;
  /** Default working directory of commands (default `/`). */
  cwd?: string;
  /**
   * The policy file that binds the sandbox (docs/policy.md): a path, its
   * text as `{source, name}`, or `false` for none.  Default: the nearest
   * `tupper.lua` from `process.cwd()` upward, as the CLI does.
   */
  policy?: PolicyOpt;
  /**
   * The recipe the sandbox is made from (docs/recipes.md): a recipe file's
   * path (its `.lock` beside it is honoured), a shipped recipe's name, or
   * `{source, name, lock}`.  Its image, env, workdir, user, limits and files
   * apply and its setup's layer is used; `envs`, `cwd`, `limits` and
   * `timeoutMs` given here override the recipe's.
   */
  recipe?: RecipeOpt;
  /**
   * Egress rules; the daemon's HTTP proxy, SOCKS5 and DNS carry what they
   * allow.  E2B's `{ allowOut, denyOut }` is taken too (src/e2b-network.ts).
   */
  network?: NetworkRules | SandboxNetworkOpts;
  /** E2B's: true is `network: "all"` (unless `network` names rules), false is no network. Default: no network. */
  allowInternetAccess?: boolean;
  /** Accepted (E2B, deprecated there): the daemon's socket is guarded by its file mode; no tokens. */
  secure?: boolean;
  /**
   * E2B's lifecycle: `onTimeout: 'kill'` (the default) is what tupper
   * does; `'pause'` is refused (tupper kills a box when its time is up).
   */
  lifecycle?: { onTimeout: 'kill' | 'pause' | { action: 'kill' } | { action: 'pause'; keepMemory?: boolean }; autoResume?: boolean };
}
