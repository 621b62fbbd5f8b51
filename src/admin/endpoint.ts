import { randomBytes, timingSafeEqual } from 'node:crypto';
import fs from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import express, { type Request, type Response } from 'express';
import { z } from 'zod';
import type { Logger } from '../log.ts';
import { AdminCommandError, describeZodError, runAdminCommand, type AdminDeps } from './commands.ts';

export const ADMIN_FILE = 'admin.json';

/** Where a running server's admin endpoint listens; written to the data dir, readable by its owner only. */
export interface AdminAddress {
  pid: number;
  url: string;
  secret: string;
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
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
      res.status(401).json({ error: 'bad admin secret' });
      return;
    }
    try {
      res.json({ ok: true, result: await runAdminCommand(deps, req.body) });
    } catch (err) {
      const known =
        err instanceof AdminCommandError ||
        err instanceof z.ZodError ||
        ['AgentExistsError', 'UserExistsError'].includes((err as Error).name);
      if (!known) deps.log.error({ err }, 'admin command failed');
      const error = !known
        ? 'internal error, see the server log'
        : err instanceof z.ZodError
          ? describeZodError(err)
          : (err as Error).message;
      res.status(known ? 400 : 500).json({ ok: false, error });
    }
  });

  const server: Server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const { port } = server.address() as AddressInfo;
  const file = path.join(deps.dataDir, ADMIN_FILE);
  const address: AdminAddress = { pid: process.pid, url: `http://127.0.0.1:${port}/admin`, secret };
  fs.writeFileSync(file, JSON.stringify(address), { mode: 0o600 });

  return {
    async close() {
      fs.rmSync(file, { force: true });
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** Sends a command to the server that holds the database. Never waits more than `timeoutMs`. */
export async function sendAdminCommand(
  dataDir: string,
  command: unknown,
  timeoutMs = 30_000,
): Promise<Record<string, unknown>> {
  let address: AdminAddress;
  try {
    address = JSON.parse(fs.readFileSync(path.join(dataDir, ADMIN_FILE), 'utf8')) as AdminAddress;
  } catch {
    throw new AdminCommandError(
      'its admin endpoint is not announced (no admin.json); stop the server and retry',
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
    throw new AdminCommandError(
      `its admin endpoint ${address.url} did not answer (${(err as Error).message})`,
    );
  }
  const body = (await res.json().catch(() => ({}))) as {
    ok?: boolean;
    result?: Record<string, unknown>;
    error?: string;
  };
  if (!res.ok || !body.ok) throw new AdminCommandError(body.error ?? `admin endpoint answered ${res.status}`);
  return body.result ?? {};
}
