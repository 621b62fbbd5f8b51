import type { Knex } from 'knex';
import { toCount } from '../db/knex.ts';

const WINDOW_MS = 15 * 60 * 1000;

/**
 * Failed logins are counted from the audit log itself (user.login_failed rows of the last 15 minutes),
 * per user name and per client address, so the limit holds across restarts and instances.
 */
export async function loginBlocked(
  knex: Knex,
  opts: { name: string; ip: string; perUser: number; perIp: number },
): Promise<boolean> {
  const since = new Date(Date.now() - WINDOW_MS).toISOString();
  const recent = () => knex('audit_events').where('kind', 'user.login_failed').where('ts', '>=', since);
  const byUser = toCount((await recent().where('actor', opts.name).count({ n: '*' }).first())?.n);
  if (byUser >= opts.perUser) return true;
  const byIp = toCount(
    (await recent().whereRaw("details->>'ip' = ?", [opts.ip]).count({ n: '*' }).first())?.n,
  );
  return byIp >= opts.perIp;
}
