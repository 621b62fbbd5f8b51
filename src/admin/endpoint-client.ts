import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { AppError, ErrorCode, OperatorCode } from '../core/errors.ts';
import type { AdminCommand, AdminResult } from './commands.ts';

/**
 * The CLI's side of the loopback admin endpoint (endpoint.ts serves it): finding a running server and
 * sending it a command. Kept apart from the server's side, which imports express and every command's
 * code: a command forwarded to a running server loads only this (docs/performance.md, "CLI commands").
 */

export const ADMIN_FILE = 'admin.json';

/** Where a running server's admin endpoint listens; written to the data dir, readable by its owner only. */
export interface AdminAddress {
  pid: number;
  url: string;
  secret: string;
  /**
   * The MCP endpoint this process serves over HTTP, once it listens (announceMcp); absent for a stdio
   * server, whose one agent is on its stdin. A `serve --stdio` started beside it joins it there.
   */
  mcp?: string;
}

/** The address a running server announced in `<data dir>/admin.json`, or undefined when there is none. */
export function readAdminAddress(dataDir: string): AdminAddress | undefined {
  try {
    return JSON.parse(fs.readFileSync(path.join(dataDir, ADMIN_FILE), 'utf8')) as AdminAddress;
  } catch {
    return undefined;
  }
}

/** The reason of the refusal sendAdminCommand gives when the server could not be asked at all. */
export const UNREACHABLE = 'admin_unreachable';

/** Sends a command to the server that holds the database. Never waits more than `timeoutMs`. */
export async function sendAdminCommand<C extends AdminCommand>(
  dataDir: string,
  command: C,
  timeoutMs = 30_000,
): Promise<AdminResult<C>> {
  const address = readAdminAddress(dataDir);
  if (!address) {
    throw new AppError(
      'LOCKED',
      'its admin endpoint is not announced (no admin.json); stop the server and retry',
      UNREACHABLE,
    );
  }
  let res: globalThis.Response;
  try {
    res = await fetch(address.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${address.secret}` },
      body: JSON.stringify(command),
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (err) {
    throw new AppError(
      'LOCKED',
      `its admin endpoint ${address.url} did not answer (${(err as Error).message})`,
      UNREACHABLE,
    );
  }
  const body = (await res.json().catch(() => ({}))) as { ok?: boolean; result?: AdminResult<C> };
  if (!res.ok || !body.ok) throw refusalFrom(res.status, body);
  // The server ran the same command with the same code: its result has the command's type.
  return body.result!;
}

const Problem = z.object({
  code: z.union([ErrorCode, OperatorCode]).catch('INTERNAL_ERROR'),
  detail: z.string().optional(),
  reason: z.string().optional(),
});

/** The AppError a problem answer carries (see sendRefusal). */
function refusalFrom(status: number, body: unknown): AppError {
  const problem = Problem.safeParse(body);
  if (!problem.success || problem.data.detail === undefined)
    return new AppError('INTERNAL_ERROR', `admin endpoint answered ${status}`);
  return new AppError(problem.data.code, problem.data.detail, problem.data.reason);
}
