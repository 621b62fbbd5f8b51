import { randomBytes } from 'node:crypto';
import type { Request, RequestHandler, Response } from 'express';
import { z } from 'zod';
import type { Config } from '../config.ts';
import { AppError, HTTP_STATUS } from '../core/errors.ts';
import { Role } from '../core/identity.ts';
import type { PageKit } from './kit.ts';
import type { WebSession } from './sessions.ts';

/** A command as the operator's command line gives it: its name and its fields. */
export type CommandInput = { command: string; [field: string]: unknown };

/**
 * Runs one operator command — the CLI's own (src/admin/commands.ts): validated, its change and audit row
 * committed together. src/app wires it in, since web/ and admin/ stay apart. Every refusal, a refused
 * input included, is an AppError.
 */
export type RunCommand = (input: CommandInput) => Promise<unknown>;

/** What the user and agent pages share: the engine, the guards, the commands. */
export interface AccountPages {
  kit: PageKit;
  run: RunCommand;
  config: Config;
  /** Admin users only (GET). */
  guard: RequestHandler[];
  /** Admin users only, with the session's CSRF token (POST). */
  form: RequestHandler[];
}

/** A refused command: its message, shown on the page with the status its code maps to. */
export interface Refusal {
  status: number;
  message: string;
}

/**
 * Runs `input` as the signed-in admin (the actor of its audit rows). A refusal is handed to `refused` and
 * undefined returned; any other failure is thrown, to the error page.
 */
export async function runAs(
  pages: AccountPages,
  res: Response,
  input: CommandInput,
  refused: (refusal: Refusal) => Promise<void> | void,
): Promise<unknown> {
  try {
    return await pages.run({ ...input, actor: (res.locals.session as WebSession).user.name });
  } catch (err) {
    if (!(err instanceof AppError)) throw err;
    await refused({ status: HTTP_STATUS[err.code], message: err.message });
    return undefined;
  }
}

/**
 * A secret (password, token) made just now, shown on the answer to the form that made it: never in a
 * URL, a log or a cache; nobody can show it again.
 */
export function showSecret(
  pages: AccountPages,
  res: Response,
  ctx: { title: string; label: string; secret: string; advice: string; back: { href: string; text: string } },
): void {
  res.set('Cache-Control', 'no-store');
  pages.kit.render(res, 200, 'secret.njk', ctx);
}

/** A fresh password: 96 random bits, like the one the first run makes for the chair. */
export const newPassword = () => randomBytes(12).toString('base64url');

/** The submitted form's fields; a field sent more than once (checkboxes) is a list. */
export const formOf = (req: Request) => (req.body ?? {}) as Record<string, string | string[] | undefined>;
export const textOf = (value: unknown) => (typeof value === 'string' ? value.trim() : '');
export const listOf = (value: unknown): string[] =>
  (Array.isArray(value) ? value : [value]).filter((v): v is string => typeof v === 'string' && v !== '');

/** The notice a `?done=` key names; an unknown key says nothing (the query string is never echoed). */
export const noticeOf = (notices: Record<string, string>, done: unknown) =>
  typeof done === 'string' && Object.hasOwn(notices, done) ? notices[done] : undefined;

/** Where a user's or an agent's own page is. */
export const pathOf = (kind: 'users' | 'agents', name: string) =>
  `/admin/${kind}/${encodeURIComponent(name)}`;

const UserList = z.object({
  users: z.array(
    z.object({
      name: z.string(),
      roles: z.array(Role),
      email: z.string().nullable(),
      created_at: z.string(),
      disabled_at: z.string().nullable(),
    }),
  ),
});
export type UserRow = z.infer<typeof UserList>['users'][number];

/** Every user (`user list`), parsed at the boundary. */
export const listUsers = async (run: RunCommand): Promise<UserRow[]> =>
  UserList.parse(await run({ command: 'user.list' })).users;
