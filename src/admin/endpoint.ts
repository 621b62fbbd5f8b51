import { randomBytes, timingSafeEqual } from 'node:crypto';
import fs from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import express, { type Request, type Response } from 'express';
import { z } from 'zod';
import { AppError, ErrorCode, OperatorCode } from '../core/errors.ts';
import { processGone } from '../db/lock.ts';
import type { Logger } from '../log.ts';
import { sendProblem } from '../core/problem.ts';
import {
  describeZodError,
  runAdminCommand,
  type AdminCommand,
  type AdminDeps,
  type AdminResult,
} from './commands.ts';

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

/**
 * A loopback-only endpoint through which CLI commands reach the database while this process holds the
 * embedded one. Authenticated by a random secret in `<data dir>/admin.json` (mode 0600).
 */
export async function startAdminEndpoint(
  deps: AdminDeps & { dataDir: string; log: Logger },
): Promise<{ close(): Promise<void> }> {
  const secret = randomBytes(32).toString('base64url');
  const app = express();
  app.use(express.json({ limit: '64mb' }));
  app.post('/admin', async (req: Request, res: Response) => {
    const given = Buffer.from(req.get('authorization')?.replace(/^Bearer /, '') ?? '');
    const expected = Buffer.from(secret);
    if (given.length !== expected.length || !timingSafeEqual(given, expected))
      return sendRefusal(res, new AppError('NOT_LOGGED_IN', 'bad admin secret'));
    try {
      res.json({ ok: true, result: await runAdminCommand(deps, req.body) });
    } catch (err) {
      const refusal = refusalOf(err);
      if (!refusal) deps.log.error({ err }, 'admin command failed');
      sendRefusal(res, refusal ?? new AppError('INTERNAL_ERROR', 'internal error, see the server log'));
    }
  });

  const server: Server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const { port } = server.address() as AddressInfo;
  const file = path.join(deps.dataDir, ADMIN_FILE);
  const address: AdminAddress = { pid: process.pid, url: `http://127.0.0.1:${port}/admin`, secret };
  clearStale(file, deps.log);
  fs.writeFileSync(file, JSON.stringify(address), { mode: 0o600 });

  return {
    async close() {
      fs.rmSync(file, { force: true });
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** The address a running server announced in `<data dir>/admin.json`, or undefined when there is none. */
export function readAdminAddress(dataDir: string): AdminAddress | undefined {
  try {
    return JSON.parse(fs.readFileSync(path.join(dataDir, ADMIN_FILE), 'utf8')) as AdminAddress;
  } catch {
    return undefined;
  }
}

/**
 * Adds this process's MCP endpoint to its admin.json once it listens, so that `serve --stdio` can join
 * it. Nothing to do when the file is not this process's (a server on PostgreSQL announces nothing).
 */
export function announceMcp(dataDir: string, mcpUrl: string): void {
  const address = readAdminAddress(dataDir);
  if (address?.pid !== process.pid) return;
  fs.writeFileSync(path.join(dataDir, ADMIN_FILE), JSON.stringify({ ...address, mcp: mcpUrl }), {
    mode: 0o600,
  });
}

/** Removes an admin.json left by a process that is gone (a crash), with a warning. */
function clearStale(file: string, log: Logger) {
  let stale: Partial<AdminAddress>;
  try {
    stale = JSON.parse(fs.readFileSync(file, 'utf8')) as Partial<AdminAddress>;
  } catch {
    return; // none, or unreadable: overwritten below
  }
  if (typeof stale.pid === 'number' && stale.pid !== process.pid && processGone(stale.pid)) {
    log.warn(
      { stale_admin_pid: stale.pid },
      `cleared a stale ${ADMIN_FILE}: its process ${stale.pid} is gone`,
    );
    fs.rmSync(file, { force: true });
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

/**
 * What the endpoint answers a failed command with: RFC 9457 problem details whose code is the AppError's,
 * plus its reason, so that the CLI gets back the refusal it would have got in its own process.
 */
function sendRefusal(res: Response, err: AppError): void {
  sendProblem(res, {
    code: err.code,
    reason: err.reason,
    title: err.code === 'INTERNAL_ERROR' ? 'Admin command failed' : 'Admin command refused',
    detail: err.message,
  });
}

/** The refusal an error stands for, or undefined for a failure of this server (logged, never shown). */
function refusalOf(err: unknown): AppError | undefined {
  if (err instanceof AppError) return err;
  if (err instanceof z.ZodError) return new AppError('CONFIG_INVALID', describeZodError(err));
  return undefined;
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
