/**
 * read_file, write_file, list_files: a sandbox's files, whole (bounded) or
 * a directory's entries.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { InvalidArgumentError } from '../../errors';
import * as S from '../schemas';
import type { Session } from '../session';
import { ok, type ToolResult, tool } from '../tool';

async function read(session: Session, id: string, path: string, enc: 'utf8' | 'base64' | undefined, user: string | undefined): Promise<ToolResult> {
  const { maxFile } = session.limits;
  const sbx = await session.box(id);
  const info = await sbx.files.getInfo(path, { user });
  if (info.type === 'dir') throw new InvalidArgumentError(`${path} is a directory: use list_files`);
  if (info.size > maxFile) {
    throw new InvalidArgumentError(`${path} is ${info.size} bytes, more than read_file returns (${maxFile}); use run_command (head, tail, grep) to look at parts of it`);
  }
  const bytes = await sbx.files.read(path, { format: 'bytes', user });
  if (bytes.length > maxFile) throw new InvalidArgumentError(`${path} grew past ${maxFile} bytes while being read`);
  if (enc === 'base64') return ok({ path, size: bytes.length, encoding: 'base64', content: Buffer.from(bytes).toString('base64') });
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw new InvalidArgumentError(`${path} is not valid UTF-8: read it with encoding "base64"`);
  }
  return ok({ path, size: bytes.length, encoding: 'utf8', content: text });
}

async function write(session: Session, id: string, path: string, content: string, enc: 'utf8' | 'base64' | undefined, user: string | undefined): Promise<ToolResult> {
  const { maxFile } = session.limits;
  const sbx = await session.box(id);
  let bytes: Buffer;
  if (enc === 'base64') {
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(content) || content.length % 4 !== 0) throw new InvalidArgumentError('content is not valid base64');
    bytes = Buffer.from(content, 'base64');
  } else {
    bytes = Buffer.from(content, 'utf8');
  }
  if (bytes.length > maxFile) throw new InvalidArgumentError(`content is ${bytes.length} bytes, more than write_file accepts (${maxFile})`);
  await sbx.files.write(path, bytes, { user });
  return ok({ path, size: bytes.length });
}

export function register(server: McpServer, session: Session): void {
  const { maxFile } = session.limits;

  tool(
    server,
    'read_file',
    {
      title: 'Read a file',
      description: `Reads a whole file of a sandbox (at most ${maxFile} bytes): as UTF-8 text (the default) or base64. Acts as the sandbox's default account unless user says otherwise.`,
      inputSchema: {
        sandboxId: S.sandboxId(),
        path: S.filePath(),
        encoding: z.enum(['utf8', 'base64']).optional().describe('utf8 (default) or base64 for binary files.'),
        user: S.account().optional(),
      },
      outputSchema: {
        path: z.string(),
        size: z.number().int().describe('Bytes.'),
        encoding: z.enum(['utf8', 'base64']),
        content: z.string().describe('The text, or base64.'),
      },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    ({ sandboxId: id, path, encoding: enc, user }) => session.guarded(() => read(session, id, path, enc, user)),
  );

  tool(
    server,
    'write_file',
    {
      title: 'Write a file',
      description: `Writes a file in a sandbox, replacing it; missing parent directories are created. At most ${maxFile} bytes. Acts as the sandbox's default account (the file is its own; it cannot write where it may not, e.g. /etc) unless user says otherwise.`,
      inputSchema: {
        sandboxId: S.sandboxId(),
        path: S.filePath(),
        content: z.string().max(Math.ceil((maxFile * 4) / 3) + 4).describe('The content: text, or base64 when encoding is base64.'),
        encoding: z.enum(['utf8', 'base64']).optional().describe('utf8 (default) or base64.'),
        user: S.account().optional(),
      },
      outputSchema: { path: z.string(), size: z.number().int().describe('Bytes written.') },
      annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
    },
    ({ sandboxId: id, path, content, encoding: enc, user }) => session.guarded(() => write(session, id, path, content, enc, user)),
  );

  tool(
    server,
    'list_files',
    {
      title: 'List a directory',
      description: "Lists the entries of a directory in a sandbox, sorted by name: name, type (file, dir, symlink, other), size, permissions. Acts as the sandbox's default account unless user says otherwise.",
      inputSchema: { sandboxId: S.sandboxId(), path: S.filePath(), user: S.account().optional() },
      outputSchema: {
        path: z.string(),
        entries: z.array(
          z.object({
            name: z.string(),
            type: z.string().describe('file, dir, symlink or other.'),
            size: z.number().int(),
            permissions: z.string(),
            symlinkTarget: z.string().optional(),
          }),
        ),
      },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    ({ sandboxId: id, path, user }) =>
      session.guarded(async () => {
        const sbx = await session.box(id);
        const entries = await sbx.files.list(path, { user });
        return ok({
          path,
          entries: entries.map((e) => {
            const v: Record<string, unknown> = { name: e.name, type: e.type, size: e.size, permissions: e.permissions };
            if (e.symlinkTarget !== undefined) v.symlinkTarget = e.symlinkTarget;
            return v;
          }),
        });
      }),
  );
}
