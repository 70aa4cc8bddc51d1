/**
 * Recipes (docs/recipes.md): a Lua file saying what a sandbox is made of
 * (image, limits, env, workdir, user, files, and a `setup(box)` that runs
 * once, its result cached as a layer).  `Sandbox.create({recipe})` sends the
 * file's text (the daemon never reads a client's path) with its lockfile
 * when one lies beside it, or the name of a recipe shipped with the daemon.
 */
import { readFileCapped } from './policy';
import * as path from 'node:path';
import { InvalidArgumentError } from './errors';

/** The largest recipe (and lockfile) the daemon takes over the socket. */
export const RECIPE_MAX_BYTES = 1024 * 1024;

/**
 * What `Sandbox.create({recipe})` takes: a path to a recipe file (its
 * `.lock` beside it is sent too), the name of a shipped recipe ("default",
 * "python", ...), or the text itself as `{source, name, lock}`.
 */
export type RecipeOpt = string | { source: string; name?: string; lock?: string };

export interface RecipeParam {
  name?: string;
  source?: string;
  lock?: string;
}

/** Reads at most RECIPE_MAX_BYTES of file; undefined when it does not exist. */
function readCapped(file: string, what: string): Promise<string | undefined> {
  return readFileCapped(file, RECIPE_MAX_BYTES, what);
}

/** The lockfile of a recipe file: app.lua -> app.lock, beside it. */
export function lockPath(file: string): string {
  return file.replace(/\.lua$/, '') + '.lock';
}

const SHIPPED = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

/** The `recipe` param of sandbox.create for opt. */
export async function recipeParam(opt: RecipeOpt): Promise<RecipeParam> {
  if (typeof opt === 'object' && opt !== null) {
    if (typeof opt.source !== 'string' || opt.source === '') throw new InvalidArgumentError('recipe.source must be a non-empty string');
    if (Buffer.byteLength(opt.source) > RECIPE_MAX_BYTES) throw new InvalidArgumentError(`recipe: larger than ${RECIPE_MAX_BYTES} bytes`);
    const p: RecipeParam = { source: opt.source, name: opt.name ?? 'recipe.lua' };
    if (opt.lock !== undefined) p.lock = opt.lock;
    return p;
  }
  if (typeof opt !== 'string' || opt === '') throw new InvalidArgumentError('recipe must be a path, a shipped recipe name or {source}');
  const source = await readCapped(opt, 'recipe');
  if (source === undefined) {
    if (!opt.includes('/') && !opt.endsWith('.lua') && SHIPPED.test(opt)) return { name: opt };
    throw new InvalidArgumentError(`recipe ${opt}: no such file`);
  }
  if (source === '') throw new InvalidArgumentError(`recipe ${opt}: empty`);
  const p: RecipeParam = { source, name: opt };
  const lock = await readCapped(lockPath(path.resolve(opt)), 'lockfile');
  if (lock) p.lock = lock;
  return p;
}

/**
 * sandbox.create's params for `Sandbox.create(name)`: a recipe file (a
 * path: starting with '/', './' or '../', or ending in '.lua') is read here
 * and sent as `recipe` (with its lock); any other name is sent as
 * `template`, which the daemon resolves: a recipe registered with it
 * (Template.build), else a shipped recipe ('base' is the Python one), else
 * an image.
 */
export function templateParams(name: string): { recipe?: string; template?: string } {
  if (typeof name !== 'string' || name === '') throw new InvalidArgumentError('the template must be a non-empty string');
  if (/^\.{0,2}\//.test(name) || name.endsWith('.lua')) return { recipe: name };
  return { template: name };
}
