import { setTimeout as sleep } from 'node:timers/promises';
import { readAdminAddress } from '../admin/endpoint-client.ts';
import type { Config } from '../config.ts';
import { AppError } from '../core/errors.ts';
import { lockHolder } from '../db/lock.ts';

/** A running HTTP server on this data directory, which a `serve --stdio` joins instead of opening it. */
export interface JoinTarget {
  pid: number;
  /** Its MCP endpoint, on loopback. */
  mcp: string;
}

/** The command line a stdio server's lock names (openServices' `command`). */
const STDIO_COMMAND = 'countersign serve --stdio';

/** How long a join waits for a server that holds the database but does not listen yet (migrations). */
export const JOIN_WAIT_MS = 90_000;

/**
 * A wildcard listen address is not one to connect to: the server is reached on loopback, where its
 * default `http.allowed_hosts` admits the Host header.
 */
function reachable(mcp: string): string {
  const url = new URL(mcp);
  if (url.hostname === '0.0.0.0') url.hostname = '127.0.0.1';
  if (url.hostname === '[::]') url.hostname = '[::1]';
  return url.toString();
}

/**
 * The server that a `serve --stdio` on `config` joins, or undefined when it should serve the data
 * directory itself. Only the embedded database is joined: on PostgreSQL (`DATABASE_URL`) any number of
 * countersign processes serve one database side by side, so a stdio server there simply serves.
 *
 * A holder that is still starting (its lock taken, its MCP endpoint not yet announced) is waited for,
 * up to `waitMs`; a holder that is itself a stdio server serves no MCP endpoint and is refused by name.
 */
export async function findRunningServer(
  config: Config,
  say: (line: string) => void,
  waitMs = JOIN_WAIT_MS,
): Promise<JoinTarget | undefined> {
  if (config.database_url) return undefined;
  const until = Date.now() + waitMs;
  let waiting = false;
  for (;;) {
    const holder = lockHolder(config.pglite_dir);
    if (!holder) return undefined;
    if (holder.command === STDIO_COMMAND) {
      throw new AppError(
        'LOCKED',
        `the database in ${config.pglite_dir} is held by another "${STDIO_COMMAND}" (pid ${holder.pid}), ` +
          'which serves no MCP endpoint to join; stop it, or run `countersign serve` (npm start) and ' +
          'every stdio client joins that server',
        'data_dir_locked',
      );
    }
    const address = readAdminAddress(config.data_dir);
    if (address?.pid === holder.pid && address.mcp) return { pid: holder.pid, mcp: reachable(address.mcp) };
    if (Date.now() > until) {
      throw new AppError(
        'LOCKED',
        `the database in ${config.pglite_dir} is held by pid ${holder.pid} ("${holder.command}"), which ` +
          `announced no MCP endpoint within ${Math.round(waitMs / 1000)} s; stop it and start again`,
        'data_dir_locked',
      );
    }
    if (!waiting) {
      say(
        `countersign: pid ${holder.pid} ("${holder.command}") holds the database; waiting for it to listen`,
      );
      waiting = true;
    }
    await sleep(250);
  }
}

/** Whether the server joined still holds the data directory (it stopped, or another took its place). */
export function stillRunning(config: Config, target: JoinTarget): boolean {
  return lockHolder(config.pglite_dir)?.pid === target.pid && readAdminAddress(config.data_dir) !== undefined;
}
