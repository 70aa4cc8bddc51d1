/**
 * The input fields several tools share, as zod schemas (what the model
 * sees of them is their description).
 */
import { z } from 'zod';

export const sandboxId = z.string().min(1).max(128).describe('The id sandbox_create returned.');

export const filePath = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => !p.includes('\0'), 'a path has no NUL byte')
  .describe("A path inside the sandbox; a relative path is taken from the home of the account the tool acts as (/home/user by default).");

export const account = z
  .string()
  .min(1)
  .max(32)
  .regex(/^[A-Za-z0-9_][A-Za-z0-9_.-]*$/)
  .describe(
    "The account of the sandbox to act as. Default: the sandbox's default account, the unprivileged `user` " +
      "(uid 1000, home /home/user) on the default image, as E2B; 'root' for system paths such as /etc.",
  );

export const stringMap = z.record(z.string().max(1 << 16));
