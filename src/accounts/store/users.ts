import { toCount, type Queryable, type Transaction } from '../../db/knex.ts';
import { USER_SEALED_COLUMNS, USER_SUPERSEDED, type UserRecord } from './sql.ts';

/*
 * The table of users: every statement that reads or changes one. The rules (the seal each change makes
 * and each read checks, the last admin, single sign-on's links) are in users.ts, authority.ts and
 * oidc-users.ts; they hand a connection or their transaction to these.
 */

/** A user's row as `select *` with its freshness (`superseded`) reads it. */
export type UserRow = UserRecord & {
  id: string;
  name: string;
  roles: unknown;
  teams: unknown;
  email: string | null;
  password_hash: string | null;
  oidc_issuer: string | null;
  oidc_subject: string | null;
};

// ---- Reads ------------------------------------------------------------------------------------

/** The active user `name` with its freshness; locked for a change when `forUpdate`. */
export async function activeNamed(q: Queryable, name: string, forUpdate = false) {
  const query = q('users').select('*', q.raw(USER_SUPERSEDED())).where({ name }).whereNull('disabled_at');
  if (forUpdate) query.forUpdate();
  return (await query.first()) as UserRow | undefined;
}

/** The active user `name`, ignoring case, with its freshness, locked for a change. */
export async function activeNamedIgnoringCaseForUpdate(trx: Transaction, name: string) {
  return (await trx('users')
    .select('*', trx.raw(USER_SUPERSEDED()))
    .whereRaw('lower(name) = lower(?)', [name])
    .whereNull('disabled_at')
    .forUpdate()
    .first()) as UserRow | undefined;
}

/** The name as a user holds it, ignoring case (disabled or not). */
export async function nameIgnoringCase(q: Queryable, name: string) {
  return (await q('users').select('name').whereRaw('lower(name) = lower(?)', [name]).first()) as
    { name: string } | undefined;
}

/** A user's id and name by name, ignoring case (disabled or not). */
export async function idNamedIgnoringCase(q: Queryable, name: string) {
  return (await q('users').select('id', 'name').whereRaw('lower(name) = lower(?)', [name]).first()) as
    { id: string; name: string } | undefined;
}

/** The name of the user a single sign-on identity signs in as, if any. */
export async function identityHolder(q: Queryable, issuer: string, subject: string) {
  return (await q('users').select('name').where({ oidc_issuer: issuer, oidc_subject: subject }).first()) as
    { name: string } | undefined;
}

/** The user a single sign-on identity signs in as (disabled or not), with its freshness, locked. */
export async function withIdentityForUpdate(trx: Transaction, issuer: string, subject: string) {
  return (await trx('users')
    .select('*', trx.raw(USER_SUPERSEDED()))
    .where({ oidc_issuer: issuer, oidc_subject: subject })
    .forUpdate()
    .first()) as UserRow | undefined;
}

/** Up to two users with the e-mail address, ignoring case, by id, with their freshness, locked. */
export async function withEmailForUpdate(trx: Transaction, address: string) {
  return (await trx('users')
    .select('*', trx.raw(USER_SUPERSEDED()))
    .whereRaw('lower(email) = lower(?)', [address])
    .orderBy('id')
    .forUpdate()
    .limit(2)) as UserRow[];
}

/** Every user by name: the sealed columns (the password hash only for the seal's check), created_at and freshness. */
export async function list(q: Queryable) {
  return (await q('users')
    .select([...USER_SEALED_COLUMNS, 'created_at', q.raw(USER_SUPERSEDED())])
    .orderBy('name')) as (UserRecord & {
    name: string;
    roles: unknown;
    teams: unknown;
    email: string | null;
    created_at: Date | string;
    disabled_at: Date | string | null;
  })[];
}

/** The active users among `names`: their sealed columns and freshness. */
export async function activeSealedNamed(q: Queryable, names: string[]) {
  return (await q('users')
    .select([...USER_SEALED_COLUMNS, q.raw(USER_SUPERSEDED())])
    .whereIn('name', names)
    .whereNull('disabled_at')) as (UserRecord & { name: string; roles: unknown; teams: unknown })[];
}

/** The active users, sealed columns and freshness, as a query the directory's reads narrow. */
const active = (q: Queryable) =>
  q('users')
    .select([...USER_SEALED_COLUMNS, q.raw(USER_SUPERSEDED())])
    .whereNull('disabled_at');

/** The active users named `name`, ignoring case (one at most: names are unique so). */
export async function activeSealedNamedIgnoringCase(q: Queryable, name: string) {
  return (await active(q).whereRaw('lower(name) = lower(?)', [name])) as UserRecord[];
}

/** Up to `limit` active users with the e-mail address, ignoring case. */
export async function activeSealedWithEmail(q: Queryable, email: string, limit: number) {
  return (await active(q).whereRaw('lower(email) = lower(?)', [email]).limit(limit)) as UserRecord[];
}

/** The roles of every active user but `id`, locked (the last admin's check). */
export async function otherActiveRolesForUpdate(trx: Transaction, id: string) {
  return (await trx('users').select('roles').whereNull('disabled_at').whereNot({ id }).forUpdate()) as {
    roles: unknown;
  }[];
}

/** The sealed columns of the user `name` (disabled or not): what sealing it again reads. */
export async function sealedNamed(trx: Transaction, name: string) {
  return (await trx('users').select(USER_SEALED_COLUMNS).where({ name }).first()) as UserRecord | undefined;
}

/** The sealed columns and freshness of the user `name` (disabled or not), locked: an operator's reseal. */
export async function sealedNamedForUpdate(trx: Transaction, name: string) {
  return (await trx('users')
    .select([...USER_SEALED_COLUMNS, trx.raw(USER_SUPERSEDED())])
    .where({ name })
    .forUpdate()
    .first()) as UserRecord | undefined;
}

/** The users whose seal binds no seq yet, locked: the upgrade's sealing reads them. */
export async function unsealedForUpdate(trx: Transaction) {
  return (await trx('users').select(USER_SEALED_COLUMNS).whereNull('sealed_seq').forUpdate()) as UserRecord[];
}

/** A user's name by id (disabled or not), or undefined. */
export async function nameOf(q: Queryable, id: string) {
  return (await q('users').select('name').where({ id }).first()) as { name: string } | undefined;
}

/** How many users there are, disabled ones included. */
export async function count(q: Queryable): Promise<number> {
  return toCount((await q('users').count({ n: '*' }).first())?.n);
}

// ---- Changes ----------------------------------------------------------------------------------

/** Inserts a user; a unique index that refuses it (name, identity) leaves nothing: the ids inserted. */
export async function insert(q: Queryable, row: Record<string, unknown>) {
  return (await q('users').insert(row).onConflict().ignore().returning('id')) as { id: string }[];
}

/** Sets columns of the user `id` (with its new seal, made by the caller over the row as it will stand). */
export async function update(q: Queryable, id: string, fields: Record<string, unknown>) {
  return await q('users').where({ id }).update(fields);
}

/** Disables the user `id` now, with its new seal. */
export async function disable(q: Queryable, id: string, authority_mac: string) {
  return await q('users').where({ id }).update({ disabled_at: q.fn.now(), authority_mac });
}
