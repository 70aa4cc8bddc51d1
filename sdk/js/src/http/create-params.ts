/**
 * The `sandbox.create` params of a create the HTTP or the MCP server was
 * asked for, from options already checked.  Unlike Sandbox.create, this
 * never reads a file: a recipe is a shipped recipe's name or its text, a
 * policy is its text; a server reads no path a client names.
 */
import { InvalidArgumentError } from '../errors';
import { POLICY_MAX_BYTES } from '../policy';
import { RECIPE_MAX_BYTES } from '../recipe';
import { DEFAULT_SANDBOX_TIMEOUT_MS } from '../sandbox';
import type { NetworkRules, SandboxLimits } from '../sandbox-opts';

/** A recipe as a server takes it: a shipped recipe's name, or its text. */
export type ServerRecipe = string | { source: string; name?: string; lock?: string };

export interface ServerCreateOpts {
  image?: string;
  recipe?: ServerRecipe;
  envs?: Record<string, string>;
  metadata?: Record<string, string>;
  /** Lifetime, ms (default 300000, or the recipe's when a recipe is given). */
  timeoutMs?: number;
  limits?: SandboxLimits;
  cwd?: string;
  network?: NetworkRules;
  policy?: { source: string; name?: string };
  /** Volumes to mount: mount point -> volume name or id (E2B's volumeMounts; docs/volumes.md). */
  volumeMounts?: Record<string, string>;
  /** A snapshot's id or name (docs/snapshots.md): not with image or recipe. */
  snapshot?: string;
}

const SHIPPED = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/** The params; InvalidArgumentError for a combination the daemon would refuse less clearly. */
export function createParams(o: ServerCreateOpts): Record<string, unknown> {
  if (o.image !== undefined && o.recipe !== undefined) throw new InvalidArgumentError('image and recipe: give one (a recipe names its image)');
  const limits: Record<string, unknown> = { ...o.limits };
  // a recipe may set the lifetime; only an explicit timeoutMs overrides it
  if (o.timeoutMs !== undefined || o.recipe === undefined) limits.timeout = (o.timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS) / 1000;
  const p: Record<string, unknown> = {};
  if (Object.keys(limits).length) p.limits = limits;
  if (o.image !== undefined) p.image = o.image;
  if (o.snapshot !== undefined) {
    if (o.image !== undefined || o.recipe !== undefined) throw new InvalidArgumentError('snapshot names the files: not with image or recipe');
    p.snapshot = o.snapshot;
  }
  if (typeof o.recipe === 'string') {
    if (!SHIPPED.test(o.recipe) || o.recipe.endsWith('.lua')) {
      throw new InvalidArgumentError(`recipe ${JSON.stringify(o.recipe)}: a shipped recipe's name, or {source} with the recipe's text (the server reads no file a client names)`);
    }
    p.recipe = { name: o.recipe };
  } else if (o.recipe !== undefined) {
    if (typeof o.recipe.source !== 'string' || o.recipe.source === '') throw new InvalidArgumentError('recipe.source must be a non-empty string');
    if (Buffer.byteLength(o.recipe.source) > RECIPE_MAX_BYTES) throw new InvalidArgumentError(`recipe: larger than ${RECIPE_MAX_BYTES} bytes`);
    const r: Record<string, string> = { source: o.recipe.source, name: o.recipe.name ?? 'recipe.lua' };
    if (o.recipe.lock !== undefined) r.lock = o.recipe.lock;
    p.recipe = r;
  }
  if (o.envs !== undefined) p.env = o.envs;
  if (o.metadata !== undefined) p.metadata = o.metadata;
  if (o.cwd !== undefined) p.cwd = o.cwd;
  if (o.network !== undefined) p.network = o.network;
  if (o.volumeMounts !== undefined) p.volumes = o.volumeMounts;
  if (o.policy !== undefined) {
    if (typeof o.policy.source !== 'string' || o.policy.source === '') throw new InvalidArgumentError('policy.source must be a non-empty string');
    if (Buffer.byteLength(o.policy.source) > POLICY_MAX_BYTES) throw new InvalidArgumentError(`policy: larger than ${POLICY_MAX_BYTES} bytes`);
    p.policy = { source: o.policy.source, name: o.policy.name ?? 'tupper.lua' };
  }
  return p;
}
