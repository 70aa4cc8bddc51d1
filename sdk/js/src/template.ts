/**
 * Templates are recipes (docs/recipes.md, "Templates"): E2B's `Template`
 * builder, whose steps become a tupper recipe (Lua source), and
 * `Template.build(t, name)`, which registers that recipe with the daemon
 * under the name and builds its cached layer.  `Sandbox.create(name)` then
 * makes sandboxes of it, locally, with no cloud.
 *
 *   const t = Template().fromImage('default').setWorkdir('/app')
 *     .copy('app.sh', '/app/').runCmd('chmod +x app.sh')
 *     .setStartCmd('./app.sh', waitForFile('/tmp/ready'));
 *   await Template.build(t, 'my-app');
 *   const sbx = await Sandbox.create('my-app');
 *
 * Bases: fromImage(ref) is an OCI image the daemon pulls on first use (or
 * one it has: 'default' is its embedded busybox image).  fromDebianImage
 * (a codename, 'stable' = bookworm), fromPythonImage('3'/'3.11') and
 * fromBaseImage are Debian images tupper builds itself from the host's apt
 * mirror (mmdebstrap, reproducible, cached), and aptInstall on them adds
 * to that image's package list instead of running apt-get in the box.
 * Other versions, fromUbuntuImage, fromNodeImage and fromAlpineImage are
 * the Docker Hub images E2B names.
 */
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import { withConnection, type ConnectionOpts } from './connection';
import { InvalidArgumentError } from './errors';
import { RECIPE_MAX_BYTES } from './recipe';
import type { NetworkRules } from './sandbox-opts';

/** How long Template.build waits by default: a Debian image build and a setup may take minutes. */
export const TEMPLATE_BUILD_TIMEOUT_MS = 2 * 3600 * 1000;

/** A ready check: a shell command the create runs until it exits 0. */
export class ReadyCmd {
  private readonly cmd: string;
  constructor(cmd: string) {
    if (typeof cmd !== 'string' || cmd === '') throw new InvalidArgumentError('a ready command must be a non-empty string');
    this.cmd = cmd;
  }
  getCmd(): string {
    return this.cmd;
  }
}

/** Quotes s for /bin/sh. */
function shq(s: string): string {
  if (s.includes('\0')) throw new InvalidArgumentError('a command argument cannot hold NUL');
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * Ready once something listens on TCP `port` in the sandbox (read from
 * /proc/net/tcp{,6}, so images without `ss` or `netstat` work too).
 */
export function waitForPort(port: number): ReadyCmd {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new InvalidArgumentError(`waitForPort: bad port ${String(port)}`);
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  // local address :PORT, remote any, state 0A (LISTEN)
  return new ReadyCmd(`grep -Eq '^ *[0-9]+: [0-9A-F]+:${hex} [0-9A-F]+:0000 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null`);
}

/** Ready once `url` answers with `statusCode` (curl, else busybox wget). */
export function waitForURL(url: string, statusCode = 200): ReadyCmd {
  if (typeof url !== 'string' || url === '') throw new InvalidArgumentError('waitForURL: the url must be a non-empty string');
  if (!Number.isInteger(statusCode) || statusCode < 100 || statusCode > 599) throw new InvalidArgumentError(`waitForURL: bad status ${String(statusCode)}`);
  const u = shq(url);
  return new ReadyCmd(
    `if command -v curl >/dev/null 2>&1; then test "$(curl -s -o /dev/null -w '%{http_code}' ${u})" = ${statusCode}; ` +
      `else wget -q -S -O /dev/null ${u} 2>&1 | grep -q 'HTTP/[0-9.]* ${statusCode}'; fi`,
  );
}

/** Ready once a process of that name (its comm) runs: pgrep, else /proc. */
export function waitForProcess(processName: string): ReadyCmd {
  if (typeof processName !== 'string' || processName === '' || processName.includes('\n')) {
    throw new InvalidArgumentError('waitForProcess: the name must be a non-empty line');
  }
  const n = shq(processName);
  return new ReadyCmd(`if command -v pgrep >/dev/null 2>&1; then pgrep ${n} >/dev/null; else grep -qxF ${n} /proc/[0-9]*/comm 2>/dev/null; fi`);
}

/** Ready once `filename` exists. */
export function waitForFile(filename: string): ReadyCmd {
  if (typeof filename !== 'string' || filename === '') throw new InvalidArgumentError('waitForFile: the path must be a non-empty string');
  return new ReadyCmd(`[ -e ${shq(filename)} ]`);
}

/** Ready after `timeout` ms (at least a second, as E2B's). */
export function waitForTimeout(timeout: number): ReadyCmd {
  if (!Number.isFinite(timeout) || timeout < 0) throw new InvalidArgumentError(`waitForTimeout: bad timeout ${String(timeout)}`);
  return new ReadyCmd(`sleep ${Math.max(1, Math.ceil(timeout / 1000))}`);
}

/** A line of a build's log (E2B's LogEntry). */
export class LogEntry {
  constructor(
    readonly timestamp: Date,
    readonly level: 'debug' | 'info' | 'warn' | 'error',
    readonly message: string,
  ) {}
  toString(): string {
    return `[${this.timestamp.toISOString()}] ${this.level.toUpperCase()} ${this.message}`;
  }
}

export interface TemplateOptions {
  /** The directory copy() takes relative sources from (default: the process's cwd). */
  fileContextPath?: string;
}

export interface TemplateBuildOpts extends ConnectionOpts {
  /** The template's name (E2B's alias); or give it as Template.build's second argument. */
  alias?: string;
  name?: string;
  /** Makes a new layer even when one of this recipe is cached. */
  skipCache?: boolean;
  /** Build log lines, as E2B's: the start, each line the setup's commands print (stderr as 'warn'), the image, the layer, the end. */
  onBuildLogs?: (entry: LogEntry) => void;
  /** Bound of the build call (default TEMPLATE_BUILD_TIMEOUT_MS). */
  requestTimeoutMs?: number;
  /** Accepted for E2B's sake; a tupper template has no tags, CPU or memory of its own. */
  tags?: string[];
  cpuCount?: number;
  memoryMB?: number;
}

/** What Template.build returns (E2B's BuildInfo); buildId is the layer's key. */
export interface BuildInfo {
  alias: string;
  name: string;
  tags: string[];
  templateId: string;
  buildId: string;
}

type Step =
  | { kind: 'run'; cmd: string; user?: string; cwd?: string }
  | { kind: 'mkdir'; path: string }
  | { kind: 'copy'; src: string[]; dest: string; mode?: number; user?: string; cwd?: string }
  | { kind: 'remove'; path: string; recursive: boolean }
  | { kind: 'rename'; from: string; to: string };

type Base = { image: string } | { debian: string; packages: string[] };

// the shipped python recipe's (recipes/python.lua): one Debian image, built once, for both
const PYTHON_PACKAGES = ['ca-certificates', 'curl', 'git', 'python3', 'python3-pip'];
// versions of Python bookworm's python3 is (Debian 12 ships 3.11)
const DEBIAN_PYTHON = new Set(['3', '3.11']);
const SUITES: Record<string, string> = { stable: 'bookworm', '12': 'bookworm', '11': 'bullseye', '13': 'trixie' };

function want(s: unknown, what: string): string {
  if (typeof s !== 'string' || s === '' || s.includes('\0')) throw new InvalidArgumentError(`${what} must be a non-empty string without NUL`);
  return s;
}

function absPath(p: string, cwd: string | undefined, what: string): string {
  want(p, what);
  if (p.startsWith('/')) return path.posix.normalize(p);
  return path.posix.normalize(path.posix.join(cwd ?? '/', p));
}

function list(x: string | string[] | undefined, what: string): string[] {
  const l = x === undefined ? [] : Array.isArray(x) ? x : [x];
  for (const s of l) want(s, what);
  return l;
}

/** A Lua string literal of bytes b: printable ASCII as is, the rest as \ddd. */
function luaBytes(b: Buffer): string {
  let out = '"';
  let run = '';
  for (const c of b) {
    if (c >= 0x20 && c < 0x7f && c !== 0x22 && c !== 0x5c) {
      run += String.fromCharCode(c);
      continue;
    }
    out += run;
    run = '';
    out += `\\${c.toString().padStart(3, '0')}`;
  }
  return out + run + '"';
}

function lua(s: string): string {
  return luaBytes(Buffer.from(s, 'utf8'));
}

function luaMap(m: Record<string, string>): string {
  const keys = Object.keys(m).sort();
  return `{ ${keys.map((k) => `[${lua(k)}] = ${lua(m[k])}`).join(', ')} }`;
}

/** A recipe name (letters, digits, '.', '_', '-'; at most 64) for a template's name. */
function recipeName(name: string): string {
  let n = name.replace(/[^A-Za-z0-9._-]/g, '-').slice(0, 64);
  if (!/^[A-Za-z0-9]/.test(n)) n = ('t' + n).slice(0, 64);
  return n;
}

/**
 * E2B's template builder.  Every method returns the builder; the steps run
 * in order, once, when the template is built (their result is its layer).
 */
export class TemplateBuilder {
  private base: Base = { image: 'default' };
  private readonly steps: Step[] = [];
  private readonly envs: Record<string, string> = {};
  private workdir?: string;
  private user?: string;
  private start?: { cmd?: string; ready?: string; timeout?: number };
  private network?: NetworkRules;
  private noCache = false;
  private readonly context: string;

  constructor(opts: TemplateOptions = {}) {
    this.context = path.resolve(opts.fileContextPath ?? process.cwd());
  }

  // ------------------------------------------------------------ bases

  /** An OCI image (pulled by the daemon on first use; 'default': the embedded busybox). */
  fromImage(baseImage: string, credentials?: { username: string; password: string }): this {
    if (credentials !== undefined) {
      throw new InvalidArgumentError("fromImage: credentials are the daemon's (its registry auth, docs/images.md), not the template's");
    }
    this.base = { image: want(baseImage, 'fromImage: the image') };
    return this;
  }

  /** Debian: a codename ('bookworm'; 'stable', '12' map to one) is built by tupper from the host's apt mirror; another variant is Docker Hub's debian:<variant>. */
  fromDebianImage(variant = 'stable'): this {
    const suite = SUITES[variant] ?? variant;
    if (/^[a-z]{2,32}$/.test(suite)) this.base = { debian: suite, packages: ['ca-certificates'] };
    else this.base = { image: `docker.io/library/debian:${want(variant, 'fromDebianImage: the variant')}` };
    return this;
  }

  /** Python: '3' or '3.11' is Debian bookworm's python3 (built by tupper); another version is Docker Hub's python:<version>. */
  fromPythonImage(version = '3'): this {
    if (DEBIAN_PYTHON.has(version)) this.base = { debian: 'bookworm', packages: [...PYTHON_PACKAGES] };
    else this.base = { image: `docker.io/library/python:${want(version, 'fromPythonImage: the version')}` };
    return this;
  }

  /** The base template: what `Sandbox.create('base')` gives (Debian bookworm with Python, git and curl; user `user` in /home/user). */
  fromBaseImage(): this {
    this.base = { debian: 'bookworm', packages: [...PYTHON_PACKAGES] };
    this.setEnvs({ LANG: 'C.UTF-8', PYTHONUNBUFFERED: '1' });
    this.user ??= 'user';
    this.workdir ??= '/home/user';
    return this;
  }

  fromUbuntuImage(variant = 'latest'): this {
    this.base = { image: `docker.io/library/ubuntu:${want(variant, 'fromUbuntuImage: the variant')}` };
    return this;
  }

  fromNodeImage(variant = 'lts'): this {
    this.base = { image: `docker.io/library/node:${want(variant, 'fromNodeImage: the variant')}` };
    return this;
  }

  fromAlpineImage(variant = 'latest'): this {
    this.base = { image: `docker.io/library/alpine:${want(variant, 'fromAlpineImage: the variant')}` };
    return this;
  }

  // ------------------------------------------------------------ steps

  /** Runs shell command(s) at build time, as `options.user`, else the user setUser set, else root. */
  runCmd(commandOrCommands: string | string[], options: { user?: string } = {}): this {
    for (const cmd of list(commandOrCommands, 'runCmd: a command')) {
      this.steps.push({ kind: 'run', cmd, user: options.user ?? this.user, cwd: this.workdir });
    }
    return this;
  }

  /** Copies files or directories (relative to fileContextPath) to dest; a dest ending in '/', or several sources, is a directory. */
  copy(src: string | string[], dest: string, options: { mode?: number; user?: string; forceUpload?: true; resolveSymlinks?: boolean } = {}): this {
    const srcs = list(src, 'copy: a source');
    if (srcs.length === 0) throw new InvalidArgumentError('copy: no source');
    if (options.mode !== undefined && !(Number.isInteger(options.mode) && options.mode >= 0 && options.mode <= 0o7777)) {
      throw new InvalidArgumentError('copy: mode must be an integer 0..0o7777');
    }
    this.steps.push({ kind: 'copy', src: srcs, dest: want(dest, 'copy: the destination'), mode: options.mode, user: options.user ?? this.user, cwd: this.workdir });
    return this;
  }

  /** Removes paths at build time. */
  remove(p: string | string[], options: { recursive?: boolean; force?: boolean } = {}): this {
    for (const one of list(p, 'remove: a path')) {
      this.steps.push({ kind: 'remove', path: absPath(one, this.workdir, 'remove: a path'), recursive: options.recursive === true });
    }
    return this;
  }

  rename(src: string, dest: string): this {
    this.steps.push({ kind: 'rename', from: absPath(src, this.workdir, 'rename: the source'), to: absPath(dest, this.workdir, 'rename: the destination') });
    return this;
  }

  makeDir(p: string | string[]): this {
    for (const one of list(p, 'makeDir: a path')) this.steps.push({ kind: 'mkdir', path: absPath(one, this.workdir, 'makeDir: a path') });
    return this;
  }

  /** The working directory of later steps and of the sandbox's processes (made at build time). */
  setWorkdir(workdir: string): this {
    const dir = absPath(workdir, this.workdir, 'setWorkdir');
    this.steps.push({ kind: 'mkdir', path: dir });
    this.workdir = dir;
    return this;
  }

  /** The user of later steps and of the sandbox's processes (an account of the image's /etc/passwd). */
  setUser(user: string): this {
    this.user = want(user, 'setUser');
    return this;
  }

  /** Environment of the build's commands and of every process of the sandbox (for the whole template). */
  setEnvs(envs: Record<string, string>): this {
    for (const [k, v] of Object.entries(envs ?? {})) {
      if (k === '' || k.includes('=') || k.includes('\0') || typeof v !== 'string' || v.includes('\0')) {
        throw new InvalidArgumentError(`setEnvs: bad variable ${JSON.stringify(k)}`);
      }
      this.envs[k] = v;
    }
    return this;
  }

  /** apt-get install as root; on a Debian image tupper builds, the packages join that image instead. */
  aptInstall(packages: string | string[], options: { noInstallRecommends?: boolean; fixMissing?: boolean } = {}): this {
    const pkgs = list(packages, 'aptInstall: a package');
    if (pkgs.length === 0) return this;
    if ('debian' in this.base) {
      for (const p of pkgs) if (!this.base.packages.includes(p)) this.base.packages.push(p);
      return this;
    }
    const flags = [options.noInstallRecommends ? '--no-install-recommends' : '', options.fixMissing ? '--fix-missing' : ''].filter(Boolean).join(' ');
    this.steps.push({
      kind: 'run',
      cmd: `apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y ${flags ? flags + ' ' : ''}${pkgs.map(shq).join(' ')}`,
      user: 'root',
      cwd: this.workdir,
    });
    return this;
  }

  /** pip install (as root unless g is false: --user); no packages: the workdir's requirements. */
  pipInstall(packages?: string | string[], options: { g?: boolean } = {}): this {
    const pkgs = list(packages, 'pipInstall: a package');
    const g = options.g !== false;
    const what = pkgs.length > 0 ? pkgs.map(shq).join(' ') : '.';
    this.steps.push({
      kind: 'run',
      cmd: `PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install ${g ? '' : '--user '}${what}`,
      user: g ? 'root' : this.user,
      cwd: this.workdir,
    });
    return this;
  }

  /** npm install (-g as root); no packages: the workdir's package.json. */
  npmInstall(packages?: string | string[], options: { g?: boolean; dev?: boolean } = {}): this {
    const pkgs = list(packages, 'npmInstall: a package');
    const flags = [options.g ? '-g' : '', options.dev ? '--save-dev' : ''].filter(Boolean).join(' ');
    this.steps.push({
      kind: 'run',
      cmd: `npm install${flags ? ' ' + flags : ''}${pkgs.length ? ' ' + pkgs.map(shq).join(' ') : ''}`,
      user: options.g ? 'root' : this.user,
      cwd: this.workdir,
    });
    return this;
  }

  /**
   * The command started at every create (in the background, as the
   * template's user, in its workdir), and the check the create waits for.
   * options.timeoutMs (tupper's): how long the create waits for it (default 60 s).
   */
  setStartCmd(startCommand: string, readyCommand?: string | ReadyCmd, options: { timeoutMs?: number } = {}): this {
    this.start = { ...this.start, cmd: want(startCommand, 'setStartCmd') };
    if (readyCommand !== undefined) this.setReadyCmd(readyCommand, options);
    else this.readyTimeout(options);
    return this;
  }

  /** The ready check alone (or a new one): the create waits until it exits 0. */
  setReadyCmd(readyCommand: string | ReadyCmd, options: { timeoutMs?: number } = {}): this {
    const ready = readyCommand instanceof ReadyCmd ? readyCommand.getCmd() : want(readyCommand, 'setReadyCmd');
    this.start = { ...this.start, ready };
    this.readyTimeout(options);
    return this;
  }

  private readyTimeout(options: { timeoutMs?: number }): void {
    if (options.timeoutMs === undefined) return;
    const t = options.timeoutMs;
    if (!Number.isFinite(t) || t <= 0 || t > 3600_000) throw new InvalidArgumentError('the ready timeout must be 1 ms to 1 hour');
    this.start = { ...this.start, timeout: Math.max(0.001, t / 1000) };
  }

  /** tupper's: the network of the build's commands and of the sandboxes (default "none"; docs/network.md). */
  setNetwork(network: NetworkRules): this {
    this.network = network;
    return this;
  }

  /** Builds a new layer even when one of the same recipe is cached. */
  skipCache(): this {
    this.noCache = true;
    return this;
  }

  // ------------------------------------------------------------ output

  /** @internal the files of a copy step: [path in the box, bytes, mode]. */
  private async copyFiles(step: Extract<Step, { kind: 'copy' }>): Promise<Array<[string, Buffer, number]>> {
    const out: Array<[string, Buffer, number]> = [];
    const destAbs = absPath(step.dest, step.cwd, 'copy: the destination');
    const intoDir = step.dest.endsWith('/') || step.src.length > 1;
    const walk = async (host: string, box: string): Promise<void> => {
      const st = await fs.stat(host).catch(() => undefined);
      if (!st) throw new InvalidArgumentError(`copy: ${host}: no such file or directory`);
      if (st.isDirectory()) {
        for (const name of (await fs.readdir(host)).sort()) await walk(path.join(host, name), path.posix.join(box, name));
      } else if (st.isFile()) {
        out.push([box, await fs.readFile(host), step.mode ?? st.mode & 0o7777]);
      } else {
        throw new InvalidArgumentError(`copy: ${host} is neither a file nor a directory`);
      }
    };
    for (const src of step.src) {
      const host = path.resolve(this.context, src);
      const st = await fs.stat(host).catch(() => undefined);
      if (!st) throw new InvalidArgumentError(`copy: ${host}: no such file or directory`);
      // a directory's contents go into dest (as Docker's COPY dir/ dest/)
      const box = st.isDirectory() || !intoDir ? destAbs : path.posix.join(destAbs, path.basename(host));
      await walk(host, box);
    }
    return out;
  }

  /**
   * The recipe (Lua source, docs/recipes.md) this template stands for, for
   * the recipe name `name`: what Template.build registers.
   */
  async toRecipe(name: string): Promise<string> {
    const lines: string[] = ['-- made by @tupper/sdk from a Template', `return recipe ${lua(recipeName(want(name, 'the template name')))} {`];
    if ('debian' in this.base) {
      lines.push(`  image = { debian = ${lua(this.base.debian)}, packages = { ${this.base.packages.map(lua).join(', ')} } },`);
    } else {
      lines.push(`  image = ${lua(this.base.image)},`);
    }
    if (Object.keys(this.envs).length > 0) lines.push(`  env = ${luaMap(this.envs)},`);
    if (this.workdir !== undefined) lines.push(`  workdir = ${lua(this.workdir)},`);
    if (this.user !== undefined) lines.push(`  user = ${lua(this.user)},`);
    if (this.network !== undefined) lines.push(`  network = ${luaValue(this.network)},`);
    if (this.start !== undefined) {
      const f: string[] = [];
      if (this.start.cmd !== undefined) f.push(`cmd = ${lua(this.start.cmd)}`);
      if (this.start.ready !== undefined) f.push(`ready = ${lua(this.start.ready)}`);
      if (this.start.timeout !== undefined) f.push(`timeout = ${this.start.timeout}`);
      lines.push(`  start = { ${f.join(', ')} },`);
    }
    const body: string[] = [];
    for (const s of this.steps) {
      if (s.kind === 'run') {
        const o: string[] = [];
        if (s.user !== undefined) o.push(`user = ${lua(s.user)}`);
        if (s.cwd !== undefined) o.push(`cwd = ${lua(s.cwd)}`);
        body.push(`    box:run(${lua(s.cmd)}${o.length ? `, { ${o.join(', ')} }` : ''})`);
      } else if (s.kind === 'mkdir') {
        body.push(`    box:mkdir(${lua(s.path)})`);
      } else if (s.kind === 'remove') {
        body.push(`    if box:exists(${lua(s.path)}) then box:remove(${lua(s.path)}, ${s.recursive}) end`);
      } else if (s.kind === 'rename') {
        body.push(`    box:rename(${lua(s.from)}, ${lua(s.to)})`);
      } else {
        const files = await this.copyFiles(s);
        for (const [p, data, mode] of files) {
          const parent = path.posix.dirname(p);
          if (parent !== '/') body.push(`    box:mkdir(${lua(parent)})`);
          body.push(`    box:write(${lua(p)}, ${luaBytes(data)}, ${mode})`);
        }
        if (s.user !== undefined && files.length > 0) {
          body.push(`    box:run({ "chown", ${lua(s.user)}, ${files.map(([p]) => lua(p)).join(', ')} })`);
        }
      }
    }
    if (this.noCache) body.push(`    -- skipCache ${Date.now()}-${Math.random().toString(16).slice(2)}`);
    if (body.length > 0) lines.push('  setup = function(box)', ...body, '  end,');
    lines.push('}', '');
    const text = lines.join('\n');
    if (Buffer.byteLength(text) > RECIPE_MAX_BYTES) {
      throw new InvalidArgumentError(`the template's recipe (its copied files included) is over ${RECIPE_MAX_BYTES} bytes`);
    }
    return text;
  }
}

/** A Lua value of plain JSON-like data (network rules). */
function luaValue(v: unknown): string {
  if (typeof v === 'string') return lua(v);
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `{ ${v.map(luaValue).join(', ')} }`;
  if (v && typeof v === 'object') {
    return `{ ${Object.entries(v as Record<string, unknown>).filter(([, x]) => x !== undefined).map(([k, x]) => `[${lua(k)}] = ${luaValue(x)}`).join(', ')} }`;
  }
  throw new InvalidArgumentError('setNetwork: rules must be "none", "all" or { allow, deny }');
}

interface RegisterResult {
  name: string;
  recipe: string;
  sha256: string;
  build: { image: string; image_digest: string; layer: string | null; cached: boolean } | null;
}

/**
 * Registers template t with the daemon under `name` (recipe.register) and
 * builds its cached layer; `Sandbox.create(name)` then starts from it.
 */
async function build(t: TemplateBuilder, nameOrOpts: string | TemplateBuildOpts, maybeOpts: TemplateBuildOpts = {}): Promise<BuildInfo> {
  const opts: TemplateBuildOpts = typeof nameOrOpts === 'string' ? { ...maybeOpts, name: nameOrOpts } : { ...nameOrOpts };
  if (!(t instanceof TemplateBuilder)) throw new InvalidArgumentError('Template.build: expected a Template()');
  const name = want(opts.name ?? opts.alias, 'Template.build: the name (alias)');
  const log = (level: LogEntry['level'], message: string) => opts.onBuildLogs?.(new LogEntry(new Date(), level, message));
  if (opts.skipCache) t.skipCache();
  const source = await t.toRecipe(name);
  log('info', `Building template ${name}`);
  try {
    const r = await withConnection(opts, async (c) => {
      // the setup's output, as it runs: recipe.log notifications routed by a token of this call
      const token = opts.onBuildLogs ? `build-${randomBytes(8).toString('hex')}` : undefined;
      if (token) {
        let partial = { stdout: '', stderr: '' };
        c.subscribe(token, 0, (_method, p) => {
          const stream = p.stream === 'stderr' ? 'stderr' : 'stdout';
          const text = partial[stream] + (p.encoding === 'base64' ? Buffer.from(String(p.data), 'base64').toString('utf8') : String(p.data ?? ''));
          const lines = text.split('\n');
          partial = { ...partial, [stream]: lines.pop() ?? '' };
          for (const l of lines) log(stream === 'stderr' ? 'warn' : 'info', l);
        });
      }
      try {
        return await c.call<RegisterResult>(
          'recipe.register',
          { name, source, file: `template ${name}`, build: true, ...(token ? { logs: token } : {}) },
          { timeoutMs: opts.requestTimeoutMs ?? TEMPLATE_BUILD_TIMEOUT_MS },
        );
      } finally {
        if (token) c.unsubscribe(token, 0);
      }
    });
    const b = r.build;
    if (b) {
      log('info', `Image ${b.image} (${b.image_digest})`);
      log('info', b.layer ? `Layer ${b.layer} ${b.cached ? 'cached' : 'built'}` : 'No layer: the template has no build steps');
    }
    log('info', `Template ${name} registered`);
    return { alias: name, name, tags: [], templateId: name, buildId: b?.layer ?? r.sha256 };
  } catch (e) {
    log('error', `Build of ${name} failed: ${(e as Error).message}`);
    throw e;
  }
}

/** The templates registered with the daemon (recipe.list). */
async function list_(opts?: ConnectionOpts): Promise<Array<{ name: string; recipe: string; sha256: string; registeredAt: string }>> {
  const r = await withConnection(opts, (c) =>
    c.call<{ recipes: Array<{ name: string; recipe: string; sha256: string; registered_at: string }> }>('recipe.list', {}),
  );
  return r.recipes.map((x) => ({ name: x.name, recipe: x.recipe, sha256: x.sha256, registeredAt: x.registered_at }));
}

/** Forgets a registered template (its cached layer stays); false when there was none. */
async function remove(name: string, opts?: ConnectionOpts): Promise<boolean> {
  const r = await withConnection(opts, (c) => c.call<{ removed: boolean }>('recipe.remove', { name: want(name, 'Template.remove: the name') }));
  return r.removed === true;
}

/** True when a template of that name is registered with the daemon. */
async function exists(name: string, opts?: ConnectionOpts): Promise<boolean> {
  return (await list_(opts)).some((x) => x.name === name);
}

export interface TemplateFactory {
  (options?: TemplateOptions): TemplateBuilder;
  build(template: TemplateBuilder, name: string, options?: TemplateBuildOpts): Promise<BuildInfo>;
  build(template: TemplateBuilder, options: TemplateBuildOpts): Promise<BuildInfo>;
  /** The recipe's Lua source (tupper's; E2B has toJSON/toDockerfile). */
  toRecipe(template: TemplateBuilder, name: string): Promise<string>;
  list(opts?: ConnectionOpts): ReturnType<typeof list_>;
  remove(name: string, opts?: ConnectionOpts): Promise<boolean>;
  exists(name: string, opts?: ConnectionOpts): Promise<boolean>;
}

/** E2B's `Template()`: a new builder, and `Template.build(t, name)`. */
export const Template: TemplateFactory = Object.assign((options?: TemplateOptions) => new TemplateBuilder(options), {
  build: build as TemplateFactory['build'],
  toRecipe: (t: TemplateBuilder, name: string) => t.toRecipe(name),
  list: list_,
  remove,
  exists,
});
