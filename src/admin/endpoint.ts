import { randomBytes, timingSafeEqual } from 'node:crypto';
import fs from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import express, { type Request, type Response } from 'express';
import { z } from 'zod';
import { AppError } from '../core/errors.ts';
import { processGone } from '../db/lock.ts';
import type { Logger } from '../log.ts';
import { sendProblem } from '../core/problem.ts';
import { describeZodError, runAdminCommand, type AdminDeps } from './commands.ts';
import { ADMIN_FILE, readAdminAddress, type AdminAddress } from './endpoint-client.ts';

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
