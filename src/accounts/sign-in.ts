import type { Knex } from 'knex';
import type { AuditLog } from '../audit/log.ts';
import type { User } from '../core/identity.ts';
import { toCount } from '../db/knex.ts';
import { checkCredentials } from './users.ts';

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

/** How many failed sign-ins, in 15 minutes, lock a user name and an origin (config `web.login_failures_*`). */
export interface SignInLimits {
  perUser: number;
  perIp: number;
}

/**
 * One sign-in, by the web form or by the command line (`--as USER`): refused while the name or the
 * origin is locked out; a wrong password is recorded as user.login_failed with the origin, so that both
 * ways count towards the same limits.
 */
export async function signIn(
  deps: { knex: Knex; audit: AuditLog; limits: SignInLimits },
  attempt: { name: string; password: string; origin: string; via: 'web' | 'cli' },
): Promise<{ user: User } | { refused: 'locked_out' | 'wrong_password' }> {
  const { name, origin } = attempt;
  if (await loginBlocked(deps.knex, { name, ip: origin, ...deps.limits })) return { refused: 'locked_out' };
  const user = name ? await checkCredentials(deps.knex, name, attempt.password) : undefined;
  if (user) return { user };
  await deps.audit.append({
    kind: 'user.login_failed',
    actor: name.slice(0, 64) || null,
    result: 'error',
    details: { ip: origin, via: attempt.via },
  });
  return { refused: 'wrong_password' };
}
