/**
 * What a cell gives back, in E2B's code interpreter shapes: an Execution
 * with its results (one per execute_result or display_data, each holding
 * the formats the kernel gave), its logs and its error.
 */

/** A MIME bundle's keys and the Result field each fills. */
const FORMATS: ReadonlyArray<[string, keyof ResultFormats]> = [
  ['text/plain', 'text'],
  ['text/html', 'html'],
  ['text/markdown', 'markdown'],
  ['image/svg+xml', 'svg'],
  ['image/png', 'png'],
  ['image/jpeg', 'jpeg'],
  ['application/pdf', 'pdf'],
  ['text/latex', 'latex'],
  ['application/json', 'json'],
  ['application/javascript', 'javascript'],
];

interface ResultFormats {
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  pdf?: string;
  latex?: string;
  json?: Record<string, unknown>;
  javascript?: string;
}

function asText(v: unknown): string {
  // Jupyter may split a text format into a list of lines
  if (Array.isArray(v)) return v.map(String).join('');
  return typeof v === 'string' ? v : JSON.stringify(v);
}

/**
 * One result of a cell, as E2B's Result: `text`, `html`, `markdown`, `svg`,
 * `png` and `jpeg` (base64), `pdf` (base64), `latex`, `json`, `javascript`
 * as the kernel gave them; other MIME types in `extra`.  `isMainResult` is
 * true for the cell's value (execute_result), false for what it displayed.
 */
export class Result implements ResultFormats {
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  pdf?: string;
  latex?: string;
  json?: Record<string, unknown>;
  javascript?: string;
  /** E2B's structured data of a DataFrame; tupper leaves it unset (the `html` and `text` formats carry the table). */
  data?: Record<string, unknown>;
  /** E2B's chart extraction; tupper leaves it unset (the `png` carries the plot). */
  chart?: Record<string, unknown>;
  /** MIME types beyond the named formats, as the kernel gave them. */
  extra?: Record<string, unknown>;
  readonly isMainResult: boolean;
  /** The kernel's MIME bundle as it came. */
  readonly raw: Record<string, unknown>;

  constructor(raw: Record<string, unknown>, isMainResult: boolean) {
    this.raw = raw;
    this.isMainResult = isMainResult;
    const known = new Set<string>();
    for (const [mime, field] of FORMATS) {
      if (!(mime in raw)) continue;
      known.add(mime);
      const v = raw[mime];
      if (field === 'json') this.json = (typeof v === 'object' && v !== null ? v : { value: v }) as Record<string, unknown>;
      else this[field] = asText(v);
    }
    for (const [mime, v] of Object.entries(raw)) {
      if (known.has(mime)) continue;
      this.extra ??= {};
      this.extra[mime] = v;
    }
  }

  /** The formats this result has, besides `text` (as E2B's formats()). */
  formats(): string[] {
    const out: string[] = [];
    for (const [, field] of FORMATS) if (field !== 'text' && this[field] !== undefined) out.push(field);
    if (this.extra) out.push(...Object.keys(this.extra));
    return out;
  }

  toJSON(): Record<string, unknown> {
    const out: Record<string, unknown> = {};
    for (const [, field] of FORMATS) if (this[field] !== undefined) out[field] = this[field];
    if (this.extra) out.extra = this.extra;
    out.isMainResult = this.isMainResult;
    return out;
  }
}

/** A cell's error, as E2B's ExecutionError: the exception's class name, its message, its traceback. */
export class ExecutionError {
  constructor(
    readonly name: string,
    readonly value: string,
    readonly traceback: string,
  ) {}

  toJSON(): Record<string, unknown> {
    return { name: this.name, value: this.value, traceback: this.traceback };
  }
}

/** A chunk of a cell's output as the callbacks get it (E2B's OutputMessage). */
export interface OutputMessage {
  line: string;
  /** When it arrived, in microseconds since the epoch (as E2B). */
  timestamp: number;
  /** True for stderr. */
  error: boolean;
}

/** A cell's streams, chunk by chunk. */
export interface Logs {
  stdout: string[];
  stderr: string[];
}

/** What one runCode gives back (E2B's Execution). */
export class Execution {
  constructor(
    readonly results: Result[] = [],
    readonly logs: Logs = { stdout: [], stderr: [] },
    public error?: ExecutionError,
    public executionCount?: number,
  ) {}

  /** The main result's text (the cell's value), if it had one. */
  get text(): string | undefined {
    for (const r of this.results) if (r.isMainResult) return r.text;
    return undefined;
  }

  toJSON(): Record<string, unknown> {
    const out: Record<string, unknown> = { results: this.results.map((r) => r.toJSON()), logs: this.logs };
    if (this.error) out.error = this.error.toJSON();
    if (this.executionCount !== undefined) out.executionCount = this.executionCount;
    return out;
  }
}

/** A code context: its own kernel, so its own variables (E2B's Context). */
export interface Context {
  id: string;
  language: string;
  cwd: string;
}
