/**
 * Which account of the box a call acts as, and where its relative paths
 * start: shared by commands, files, terminals and the HTTP API, so that each
 * resolves `user` and relative paths the same way.
 */

/** What a sandbox says about its accounts (a SandboxLink, a Sandbox). */
export interface AccountInfo {
  /** The account calls act as unless told (E2B's default), if the sandbox names one. */
  readonly defaultUser?: string;
  /** Where that account's relative paths and commands start: its home (`/` for the root fallback). */
  readonly home: string;
  /** The sandbox's own working directory, when it was given one. */
  readonly workdir?: string;
}

/** path, absolute: a relative one is taken from base. */
export function fromHome(path: string, base: string): string {
  // an empty path stays empty: the daemon refuses it, as before
  if (path === '' || path.startsWith('/')) return path;
  return (base.endsWith('/') ? base : base + '/') + path;
}

/**
 * The account and path a call acts with: an explicit `user` goes to the
 * daemon as it is (which takes relative paths from that account's home);
 * without one, the sandbox's default account, relative paths taken from
 * its home here.  Returns the params to add.
 */
export function actingAs(link: AccountInfo, user: string | undefined): { user?: string; base?: string } {
  if (user !== undefined) return { user };
  if (link.defaultUser === undefined) return { base: '/' };
  return { user: link.defaultUser, base: link.home };
}

/**
 * params with the `user` a call acts as added, and the params named in
 * `paths` taken from that account's home when relative (see actingAs).
 */
export function asAccount(
  link: AccountInfo,
  user: string | undefined,
  params: Record<string, unknown>,
  paths: string[] = ['path'],
): Record<string, unknown> {
  const as = actingAs(link, user);
  const p: Record<string, unknown> = { ...params };
  if (as.user !== undefined) p.user = as.user;
  if (as.base !== undefined) {
    for (const k of paths) if (typeof p[k] === 'string') p[k] = fromHome(p[k] as string, as.base);
  }
  return p;
}

/**
 * The user and cwd params of a process start: an explicit user as it is
 * (the daemon starts it in that account's home unless cwd says otherwise);
 * without one, the default account, in cwd taken from its home, else in
 * the sandbox's own working directory, else in its home.
 */
export function startAs(link: AccountInfo, user: string | undefined, cwd: string | undefined): { user?: string; cwd?: string } {
  const as = actingAs(link, user);
  const out: { user?: string; cwd?: string } = {};
  if (as.user !== undefined) out.user = as.user;
  if (cwd !== undefined) out.cwd = as.base !== undefined ? fromHome(cwd, as.base) : cwd;
  // (no default account named: the daemon's own default, the sandbox's cwd)
  else if (user === undefined && link.defaultUser !== undefined) out.cwd = link.workdir ?? as.base;
  return out;
}

/**
 * The params a process start (process.start, pty.create) adds for its
 * options: its account and cwd (startAs), its env, its timeout in seconds
 * (none for 0).
 */
export function startParams(
  link: AccountInfo,
  opts: { cwd?: string; envs?: Record<string, string>; user?: string },
  timeoutMs: number,
): Record<string, unknown> {
  const p: Record<string, unknown> = { ...startAs(link, opts.user, opts.cwd) };
  if (opts.envs !== undefined) p.env = opts.envs;
  if (timeoutMs > 0) p.timeout = timeoutMs / 1000;
  return p;
}
