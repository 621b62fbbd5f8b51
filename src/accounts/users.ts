import {
  randomBytes,
  randomUUID,
  scrypt as scryptCb,
  timingSafeEqual,
  type ScryptOptions,
} from 'node:crypto';
import type { Queryable, Transaction } from '../db/knex.ts';
import { z } from 'zod';
import { AppError } from '../core/errors.ts';
import { Role, UserName, type User } from '../core/identity.ts';
import { limitConcurrency } from '../core/limit.ts';
import type { HostRoots } from '../core/host-roots.ts';
import { hostRootsOf } from '../db/host-roots.ts';
import { sealUser, sealedUserOr, userSealed } from './authority.ts';
import type { UserRecord } from './store/index.ts';
import { sessions, users } from './store/index.ts';

/** The roots given, else those opened for `knex` (the host's keys: db/host-roots.ts). */
const rootsFor = async (knex: Queryable, roots: HostRoots | undefined) => roots ?? (await hostRootsOf(knex));

const scrypt = (password: string, salt: Buffer, keylen: number, opts: ScryptOptions) =>
  new Promise<Buffer>((resolve, reject) =>
    scryptCb(password, salt, keylen, opts, (err, key) => (err ? reject(err) : resolve(key))),
  );

const PARAMS = { N: 16384, r: 8, p: 1 };

/** `scrypt$N$r$p$salt$hash`, base64url; parameters travel with the hash so they can be raised later. */
export async function hashPassword(password: string): Promise<string> {
  const salt = randomBytes(16);
  const key = await scrypt(password, salt, 32, PARAMS);
  return ['scrypt', PARAMS.N, PARAMS.r, PARAMS.p, salt.toString('base64url'), key.toString('base64url')].join(
    '$',
  );
}

/**
 * Password checks run one at a time in a process: scrypt is work on purpose, and a burst of sign-ins
 * (however many get past the limits at once) then takes at most one core, never every core that the
 * agents' calls need (the abuse drill, docs/reliability.md).
 */
const oneAtATime = limitConcurrency(1);

export async function verifyPassword(password: string, stored: string): Promise<boolean> {
  const [scheme, n, r, p, salt, hash] = stored.split('$');
  if (scheme !== 'scrypt' || !salt || !hash) return false;
  const expected = Buffer.from(hash, 'base64url');
  const key = await oneAtATime(() =>
    scrypt(password, Buffer.from(salt, 'base64url'), expected.length, {
      N: Number(n),
      r: Number(r),
      p: Number(p),
      maxmem: 256 * Number(n) * Number(r),
    }),
  );
  return timingSafeEqual(key, expected);
}

export async function createUser(
  knex: Queryable,
  opts: { name: string; roles: Role[]; password: string },
  hostRoots?: HostRoots,
): Promise<User> {
  const roots = await rootsFor(knex, hostRoots);
  const name = UserName.parse(opts.name);
  const roles = z
    .array(Role)
    .min(1)
    .parse([...new Set(opts.roles)]);
  z.object({ password: z.string().min(8, 'at least 8 characters') }).parse({ password: opts.password });
  const user: User = { id: randomUUID(), name, roles };
  // Names are unique ignoring case (users_name_lower_unique): `Mallory` is refused where `mallory` exists.
  const password_hash = await hashPassword(opts.password);
  const record = {
    ...user,
    roles,
    teams: [],
    email: null,
    password_hash,
    oidc_issuer: null,
    oidc_subject: null,
  };
  const inserted = await users.insert(knex, {
    ...user,
    roles: JSON.stringify(roles),
    password_hash,
    authority_mac: sealUser(roots, { ...record, disabled_at: null }),
  });
  if (inserted.length === 0) {
    const taken = await users.nameIgnoringCase(knex, name);
    const same = taken && taken.name !== name ? ` (as "${taken.name}": names are unique ignoring case)` : '';
    throw new AppError('CONFLICT', `a user named "${name}" already exists${same}`, 'user_exists');
  }
  return user;
}

/** A single sign-on identity: the provider's issuer and the person's subject there. */
export interface OidcSubject {
  issuer: string;
  subject: string;
}

/**
 * Links the single sign-on identity to the active user `name` (ignoring case) in `trx`: from then on that
 * identity signs in as this user, whose roles follow the provider's claims. Replaces an identity the user
 * had (returned as `before`); refused when the identity is another user's (CONFLICT, identity_in_use).
 */
export async function linkIdentity(
  trx: Transaction,
  name: string,
  identity: OidcSubject,
  hostRoots?: HostRoots,
): Promise<{ user: string; before?: OidcSubject; unchanged: boolean }> {
  const roots = await rootsFor(trx, hostRoots);
  const row = await users.activeNamedIgnoringCaseForUpdate(trx, name);
  if (!row) throw new AppError('NOT_FOUND', `no active user named "${name}"`, 'unknown_user');
  sealedUserOr(roots, row);
  if (row.oidc_issuer === identity.issuer && row.oidc_subject === identity.subject)
    return { user: row.name, unchanged: true };
  const holder = await users.identityHolder(trx, identity.issuer, identity.subject);
  if (holder) {
    throw new AppError('CONFLICT', `that identity already signs in as "${holder.name}"`, 'identity_in_use');
  }
  const linked = { oidc_issuer: identity.issuer, oidc_subject: identity.subject };
  await users.update(trx, row.id, { ...linked, authority_mac: sealUser(roots, { ...row, ...linked }) });
  const before =
    row.oidc_issuer !== null && row.oidc_subject !== null
      ? { issuer: row.oidc_issuer, subject: row.oidc_subject }
      : undefined;
  return { user: row.name, ...(before ? { before } : {}), unchanged: false };
}

/**
 * The user, if the name exists, is enabled and the password matches; `tampered` (the name) when the
 * user's record does not carry its seal (authority.ts), whatever the password. Always spends one scrypt.
 */
export async function checkCredentials(
  knex: Queryable,
  name: string,
  password: string,
  hostRoots?: HostRoots,
): Promise<User | { tampered: string } | undefined> {
  const roots = await rootsFor(knex, hostRoots);
  const row = await users.activeNamed(knex, name);
  // Hash even for an unknown name or a user without a password (single sign-on only), so timing does not
  // tell which names exist or how they sign in.
  const ok = await verifyPassword(
    password,
    row?.password_hash ?? 'scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA$' + 'A'.repeat(43),
  );
  if (row && !userSealed(roots, row)) return { tampered: row.name };
  if (!row || row.password_hash === null || !ok) return undefined;
  const roles = typeof row.roles === 'string' ? JSON.parse(row.roles) : row.roles;
  return { id: row.id, name: row.name, roles: z.array(Role).parse(roles) };
}

const rolesOf = (raw: unknown) => z.array(Role).parse(typeof raw === 'string' ? JSON.parse(raw) : raw);

/**
 * Every user, by name: roles, e-mail address, created, whether disabled (never a password hash), and,
 * with the host roots, whether the record carries its seal (authority.ts).
 */
export async function listUsers(knex: Queryable, roots?: HostRoots) {
  const rows = await users.list(knex);
  return rows.map((r) => ({
    name: r.name,
    roles: rolesOf(r.roles),
    teams: teamsOf(r.teams),
    email: r.email,
    created_at: new Date(r.created_at).toISOString(),
    disabled_at: r.disabled_at === null ? null : new Date(r.disabled_at).toISOString(),
    ...(roots ? { sealed: userSealed(roots, r) } : {}),
  }));
}

/** A change to a user: new roles, a new password, or disabling (sign-ins and sessions end at once). */
export type UserChange = { roles: Role[] } | { password: string } | { disable: true };

/**
 * Applies `change` to the active user `name` in `trx` (the caller's transaction, with its audit row).
 * Refused: an unknown or disabled user (NOT_FOUND), and leaving the server without an active admin
 * (CONFLICT, last_admin). Returns the roles before and after.
 */
export async function changeUser(
  trx: Transaction,
  name: string,
  change: UserChange,
  hostRoots?: HostRoots,
): Promise<{ id: string; before: Role[]; after: Role[] }> {
  const roots = await rootsFor(trx, hostRoots);
  const row = await users.activeNamed(trx, name, true);
  if (!row) throw new AppError('NOT_FOUND', `no active user named "${name}"`, 'unknown_user');
  sealedUserOr(roots, row);
  if ('password' in change && row.oidc_subject !== null && row.password_hash === null) {
    // A password would open a second way in that the identity provider does not control. (A local user
    // linked to an identity later keeps the password they had, and may have it reset.)
    throw new AppError(
      'CONFLICT',
      `"${name}" signs in through single sign-on and has no password`,
      'oidc_user',
    );
  }
  const before = rolesOf(row.roles);
  const after =
    'roles' in change
      ? z
          .array(Role)
          .min(1)
          .parse([...new Set(change.roles)])
      : before;
  const losesAdmin = before.includes('admin') && ('disable' in change || !after.includes('admin'));
  if (losesAdmin && (await otherActiveAdmins(trx, row.id)) === 0) {
    throw new AppError(
      'CONFLICT',
      `"${name}" is the last active admin: add another admin first`,
      'last_admin',
    );
  }
  // One statement writes the change and the seal over the record as it then stands.
  const sealed = (fields: Partial<UserRecord>) => sealUser(roots, { ...row, ...fields });
  if ('roles' in change)
    await users.update(trx, row.id, {
      roles: JSON.stringify(after),
      authority_mac: sealed({ roles: after }),
    });
  if ('password' in change) {
    z.object({ password: z.string().min(8, 'at least 8 characters') }).parse(change);
    const password_hash = await hashPassword(change.password);
    await users.update(trx, row.id, { password_hash, authority_mac: sealed({ password_hash }) });
    // Whoever signed in with the old password is signed out.
    await sessions.removeOfUser(trx, row.id);
  }
  if ('disable' in change) await users.disable(trx, row.id, sealed({ disabled_at: true }));
  return { id: row.id, before, after };
}

/**
 * Sets (or, with null, clears) the e-mail address of the active user `name` in `trx`, where notices of
 * requests reach chairs. Returns the address before and after; an unknown or disabled user is NOT_FOUND.
 */
export async function setUserEmail(
  trx: Transaction,
  name: string,
  email: string | null,
  hostRoots?: HostRoots,
): Promise<{ before: string | null; after: string | null }> {
  const roots = await rootsFor(trx, hostRoots);
  const after = email === null ? null : z.email().parse(email.trim());
  const row = await users.activeNamed(trx, name, true);
  if (!row) throw new AppError('NOT_FOUND', `no active user named "${name}"`, 'unknown_user');
  sealedUserOr(roots, row);
  await users.update(trx, row.id, { email: after, authority_mac: sealUser(roots, { ...row, email: after }) });
  return { before: row.email, after };
}

/** A team's name: lower-case letters, digits, dot, dash and underscore; never a built-in role's. */
export const TeamName = z
  .string()
  .regex(/^[a-z0-9][a-z0-9._-]{0,63}$/, 'lower-case letters, digits, dot, dash and underscore, at most 64')
  .refine((t) => !Role.safeParse(t).success, 'a built-in role, not a team');

const teamsOf = (raw: unknown) => z.array(z.string()).parse(typeof raw === 'string' ? JSON.parse(raw) : raw);

/** Sets the teams of the active user `name` in `trx` (with the caller's audit row); before and after. */
export async function setUserTeams(
  trx: Transaction,
  name: string,
  teams: string[],
  hostRoots?: HostRoots,
): Promise<{ before: string[]; after: string[] }> {
  const roots = await rootsFor(trx, hostRoots);
  const after = z.array(TeamName).parse([...new Set(teams)].sort());
  const row = await users.activeNamed(trx, name, true);
  if (!row) throw new AppError('NOT_FOUND', `no active user named "${name}"`, 'unknown_user');
  sealedUserOr(roots, row);
  await users.update(trx, row.id, {
    teams: JSON.stringify(after),
    authority_mac: sealUser(roots, { ...row, teams: after }),
  });
  return { before: teamsOf(row.teams), after };
}

/**
 * What each named user holds that an approval rule can ask for: built-in roles and teams together, by
 * name. A name that is no user, or a disabled one, holds nothing; nor does a user whose record does not
 * carry its seal (authority.ts: roles or teams given by SQL), when `roots` are given — the approval
 * paths always give them, checked from the columns this one query reads.
 */
export async function heldBy(
  q: Queryable,
  names: string[],
  roots?: HostRoots,
): Promise<Map<string, string[]>> {
  if (names.length === 0) return new Map();
  const rows = await users.activeSealedNamed(q, names);
  return new Map(
    rows
      .filter((r) => !roots || userSealed(roots, r))
      .map((r) => [r.name, [...rolesOf(r.roles), ...teamsOf(r.teams)]]),
  );
}

async function otherActiveAdmins(trx: Transaction, id: string): Promise<number> {
  const rows = await users.otherActiveRolesForUpdate(trx, id);
  return rows.filter((r) => rolesOf(r.roles).includes('admin')).length;
}

/**
 * Who an outside identity names among the active users (the Slack mapping asks it), without the
 * database: a name (unique ignoring case), or an e-mail address — `limit` of them, so that a caller
 * can tell one from several.
 */
export interface UserDirectory {
  activeNamed(name: string): Promise<User | undefined>;
  activeWithEmail(email: string, limit: number): Promise<User[]>;
}

export function createUserDirectory(knex: Queryable, roots?: HostRoots): UserDirectory {
  // A user whose record does not carry its seal (authority.ts) is no one's to act as: not found.
  const sealed = (rows: UserRecord[]) => rows.filter((r) => !roots || userSealed(roots, r));
  const userOf = (r: UserRecord): User => ({
    id: String(r.id),
    name: String(r.name),
    roles: rolesOf(r.roles),
  });
  return {
    async activeNamed(name) {
      const rows = sealed(await users.activeSealedNamedIgnoringCase(knex, name));
      return rows.length === 1 ? userOf(rows[0]!) : undefined;
    },
    async activeWithEmail(email, limit) {
      const rows = await users.activeSealedWithEmail(knex, email, limit);
      return sealed(rows).map(userOf);
    },
  };
}

/** A user's name by id (disabled or not), or undefined. */
export async function userNameOf(q: Queryable, id: string): Promise<string | undefined> {
  return (await users.nameOf(q, id))?.name;
}

/** How many users there are, disabled ones included. */
export async function countUsers(q: Queryable): Promise<number> {
  return users.count(q);
}
