import type { AuditLog } from '../audit/index.ts';
import type { User } from '../core/identity.ts';
import { limitConcurrency } from '../core/limit.ts';
import type { Connection } from '../db/knex.ts';
import type { HostRoots } from '../core/host-roots.ts';
import type { OidcRefusal } from './oidc.ts';
import { signInWithOidc, type OidcIdentity } from './oidc-users.ts';
import { checkCredentials } from './users.ts';
import { auditTampered } from './authority.ts';
import { attempts as store, type AttemptBucket } from './store/index.ts';

/** How long a failed attempt counts towards the limits. */
export const SIGN_IN_WINDOW_MINUTES = 15;

export type { AttemptBucket };

/**
 * At most this many reservations of one process wait on their locks at once: attempts of one origin
 * serialise on its lock anyway, and a burst of them (60 at once from one page) would otherwise hold
 * every connection of the pool while it waits, and stall the agents' calls (the abuse drill).
 */
const inTurn = limitConcurrency(2);

/** Why the database refused an attempt: its origin, or its name, already had its limit in the window. */
type Reservation = { id: number } | { refused: 'origin' | 'name' };

/**
 * Reserves one attempt before anything is checked: refused when the name or the origin already has its
 * limit of attempts in the window (and which of them), else the attempt's id. Attempts of one origin and
 * of one name serialise on advisory locks held until the transaction ends, and each count is a statement
 * after the lock, so its snapshot sees every attempt committed before: however many tries race, on
 * however many replicas, no more than the limit are ever let through. An attempt stays counted until it
 * is released, so tries still being checked count as well as failed ones.
 */
export async function reserveAttempt(
  knex: Connection,
  attempt: { bucket: AttemptBucket; name?: string; origin: string; perName?: number; perOrigin: number },
): Promise<Reservation> {
  const { bucket, origin } = attempt;
  return inTurn(() => reserve(knex, bucket, origin, nameKey(attempt.name), attempt));
}

/** The name an attempt is counted under (none when empty). */
const nameKey = (name: string | undefined) => name?.slice(0, 64) || null;

async function reserve(
  knex: Connection,
  bucket: AttemptBucket,
  origin: string,
  name: string | null,
  attempt: { perName?: number; perOrigin: number },
): Promise<Reservation> {
  return knex.transaction(async (trx) => {
    // Origin first, then name: every reservation takes the two locks in the same order.
    await store.lockOrigin(trx, origin);
    if (name !== null) await store.lockName(trx, name);
    const window = `${SIGN_IN_WINDOW_MINUTES} minutes`;
    // Expired attempts go; rows another attempt is deleting are skipped, so purges never wait on each other.
    await store.purgeOlderThan(trx, window);
    const counted = (column: 'origin' | 'name', value: string) =>
      store.countWithin(trx, bucket, column, value, window);
    if ((await counted('origin', origin)) >= attempt.perOrigin) return { refused: 'origin' as const };
    if (name !== null && attempt.perName !== undefined && (await counted('name', name)) >= attempt.perName) {
      return { refused: 'name' as const };
    }
    return { id: await store.insert(trx, { bucket, name, origin }) };
  });
}

/**
 * Gives a reserved attempt back (it succeeded, or failed through no fault of the caller): it no longer
 * counts. What it was counted under, if it was still there.
 */
export async function releaseAttempt(
  knex: Connection,
  id: number,
): Promise<{ bucket: AttemptBucket; origin: string; name: string | null } | undefined> {
  return store.remove(knex, id);
}

/**
 * After the database refused an attempt of an origin (or a name), how long this process refuses that
 * origin's (or name's) further attempts from memory before it asks the database again. A refusal only
 * ends when an attempt turns 15 minutes old or one is given back, so a flood at a locked-out address
 * (forged single sign-on answers, 20 at a time, that any web page can make a browser send) costs one
 * transaction a second, not one each. Refusing from memory can only be stricter than the database,
 * and by a second at most: an attempt given back on this process forgets its keys at once.
 */
export const REFUSED_RECHECK_MS = 1000;
const MAX_REMEMBERED = 10_000;

/** Per bucket and origin or name, until when (performance.now()) this process refuses it unasked. */
function refusedKeys() {
  const until = new Map<string, number>();
  const key = (bucket: AttemptBucket, by: 'origin' | 'name', value: string) => `${bucket}\0${by}\0${value}`;
  const held = (k: string) => {
    const t = until.get(k);
    if (t === undefined) return false;
    if (performance.now() < t) return true;
    until.delete(k);
    return false;
  };
  return {
    /** Whether an attempt of this origin (or name) is refused from memory. */
    refuses(bucket: AttemptBucket, origin: string, name: string | null): boolean {
      return held(key(bucket, 'origin', origin)) || (name !== null && held(key(bucket, 'name', name)));
    },
    /** The database refused an attempt of this origin and name `by` one of them: remember that one. */
    remember(bucket: AttemptBucket, by: 'origin' | 'name', origin: string, name: string | null) {
      const k = key(bucket, by, by === 'origin' ? origin : name!);
      until.delete(k);
      // The oldest entry goes first: a flood from many addresses cannot grow this without bound.
      if (until.size >= MAX_REMEMBERED) until.delete(until.keys().next().value!);
      until.set(k, performance.now() + REFUSED_RECHECK_MS);
    },
    forget(bucket: AttemptBucket, origin: string, name: string | null) {
      until.delete(key(bucket, 'origin', origin));
      if (name !== null) until.delete(key(bucket, 'name', name));
    },
  };
}

/** How many failed sign-ins, in 15 minutes, lock a user name and an origin (config `web.login_failures_*`). */
export interface SignInLimits {
  perUser: number;
  perIp: number;
}

/**
 * One sign-in, by the web form or by the command line (`--as USER`): an attempt is reserved for the name
 * and the origin first, and refused while either is locked out; a wrong password keeps its reservation
 * and is recorded as user.login_failed with the origin, so that both ways count towards the same limits;
 * the right one gives its reservation back.
 */
async function signIn(
  deps: {
    knex: Connection;
    audit: AuditLog;
    roots: () => Promise<HostRoots>;
    attempts: Pick<SignIn, 'reserve' | 'release'>;
  },
  attempt: { name: string; password: string; origin: string; via: 'web' | 'cli' },
): Promise<{ user: User } | { refused: 'locked_out' | 'wrong_password' }> {
  const { name, origin } = attempt;
  const reserved = await deps.attempts.reserve({ bucket: 'password', name, origin });
  if (reserved === undefined) return { refused: 'locked_out' };
  let user: User | { tampered: string } | undefined;
  try {
    user = name ? await checkCredentials(deps.knex, name, attempt.password, await deps.roots()) : undefined;
  } catch (err) {
    // Not checked, so not a failure of the caller's: the reservation goes back.
    await deps.attempts.release(reserved).catch(() => undefined);
    throw err;
  }
  if (user && 'tampered' in user) {
    // Refused as a disabled user is (the person is told no more than for a wrong password), recorded as
    // what it is: the record this server sealed was changed in the database (authority.ts).
    await auditTampered(deps.audit, 'user', user.tampered, `sign_in_${attempt.via}`);
  } else if (user) {
    await deps.attempts.release(reserved);
    return { user };
  }
  await deps.audit.append({
    kind: 'user.login_failed',
    actor: name.slice(0, 64) || null,
    result: 'error',
    details: { ip: origin, via: attempt.via },
  });
  return { refused: 'wrong_password' };
}

/** How a person signs in, for the web pages and the command line: the limits, the attempts, the outcomes. */
export interface SignIn {
  /** A password sign-in (signIn), under the configured limits. */
  signIn(attempt: {
    name: string;
    password: string;
    origin: string;
    via: 'web' | 'cli';
  }): Promise<{ user: User } | { refused: 'locked_out' | 'wrong_password' }>;
  /**
   * Reserves one attempt of `bucket` for the origin (and the name, when given) under the configured limits
   * (reserveAttempt): the attempt's id, or undefined when either is at its limit — as the database said,
   * or as it said less than REFUSED_RECHECK_MS ago.
   */
  reserve(attempt: { bucket: AttemptBucket; origin: string; name?: string }): Promise<number | undefined>;
  /** Gives a reserved attempt back (releaseAttempt). */
  release(id: number): Promise<void>;
  /** The user a verified single sign-on identity is, found, linked or created (signInWithOidc). */
  withOidc(identity: OidcIdentity): Promise<{ user: User } | (OidcRefusal & { name?: string })>;
  /**
   * The secret single sign-on attempts are sealed with in the browser's cookie: derived from the host
   * roots every replica shares (never read from the database), so that any replica can finish an attempt
   * another began.
   */
  oidcAttemptSecret(): Promise<string>;
}

export function createSignIn(deps: {
  knex: Connection;
  audit: AuditLog;
  limits: SignInLimits;
  roots: () => Promise<HostRoots>;
}): SignIn {
  const { knex, limits } = deps;
  const refused = refusedKeys();
  const attempts: Pick<SignIn, 'reserve' | 'release'> = {
    async reserve(attempt) {
      const { bucket, origin } = attempt;
      const name = nameKey(attempt.name);
      if (refused.refuses(bucket, origin, name)) return undefined;
      const got = await reserveAttempt(knex, {
        ...attempt,
        perName: limits.perUser,
        perOrigin: limits.perIp,
      });
      if ('id' in got) return got.id;
      refused.remember(bucket, got.refused, origin, name);
      return undefined;
    },
    async release(id) {
      const was = await releaseAttempt(knex, id);
      if (was) refused.forget(was.bucket, was.origin, was.name);
    },
  };
  return {
    signIn: (attempt) => signIn({ ...deps, attempts }, attempt),
    ...attempts,
    withOidc: async (identity) => signInWithOidc({ ...deps, roots: await deps.roots() }, identity),
    oidcAttemptSecret: async () => (await deps.roots()).key('sign-in-attempt').toString('base64url'),
  };
}
