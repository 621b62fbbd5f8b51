import canonicalize from 'canonicalize';
import type { Knex } from 'knex';
import type { AuditLog } from '../audit/index.ts';
import { AppError, isAppError } from '../core/errors.ts';
import type { HostRoots } from '../core/host-roots.ts';

/**
 * Sealed records (docs/identity.md): each user's and agent's row carries `authority_mac`, an HMAC under
 * the host roots' authority key over the fields that grant authority, serialized canonically with the
 * row's id. Whoever administers the database without a shell on the host can change those fields, but
 * cannot make the MAC that matches: a chair's password hash set by SQL, roles or teams added, an identity
 * at the provider remapped, a user re-enabled, an agent's profile, limit, owner, token or revocation
 * changed, a MAC copied from another row (the id is inside), are all refused as TAMPERED.
 *
 * users:  id, name, roles (as a set), teams (as a set), email, password_hash, oidc_issuer, oidc_subject,
 *         disabled (whether disabled_at is set)
 * agents: id, name, profile, rate_limit_per_min, owner_id, token_hash, revoked (whether revoked_at is set)
 *
 * Not sealed: created_at, the times of disabling and revoking (only whether), agents.owner_unresolved
 * (a name that resolved to nobody grants nothing), agents.token_tagged (which tokens are screened in
 * memory; a tagless token is still looked up by its MAC).
 */

/** The user columns the seal covers, with the seal: what a read that checks it selects. */
export const USER_SEALED_COLUMNS = [
  'id',
  'name',
  'roles',
  'teams',
  'email',
  'password_hash',
  'oidc_issuer',
  'oidc_subject',
  'disabled_at',
  'authority_mac',
] as const;

/** The agent columns the seal covers, with the seal. */
export const AGENT_SEALED_COLUMNS = [
  'id',
  'name',
  'profile',
  'rate_limit_per_min',
  'owner_id',
  'token_hash',
  'revoked_at',
  'authority_mac',
] as const;

export type UserRecord = Record<(typeof USER_SEALED_COLUMNS)[number], unknown>;
export type AgentSealed = Record<(typeof AGENT_SEALED_COLUMNS)[number], unknown>;

/** A jsonb column as PostgreSQL or PGlite hand it back (parsed, or text), as a sorted set of strings. */
function setOf(raw: unknown): unknown {
  const v = typeof raw === 'string' ? (JSON.parse(raw) as unknown) : raw;
  if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return [...v].sort();
  return v ?? null;
}

const textOf = (v: unknown) => (v === null || v === undefined ? null : String(v));

/** The canonical text a user's seal is made over. */
export function userSealedText(row: Partial<UserRecord>): string {
  return canonicalize({
    v: 1,
    record: 'user',
    id: textOf(row.id),
    name: textOf(row.name),
    roles: setOf(row.roles),
    teams: setOf(row.teams ?? []),
    email: textOf(row.email),
    password_hash: textOf(row.password_hash),
    oidc_issuer: textOf(row.oidc_issuer),
    oidc_subject: textOf(row.oidc_subject),
    disabled: row.disabled_at !== null && row.disabled_at !== undefined,
  })!;
}

/** The canonical text an agent's seal is made over. */
export function agentSealedText(row: Partial<AgentSealed>): string {
  const limit = row.rate_limit_per_min;
  return canonicalize({
    v: 1,
    record: 'agent',
    id: textOf(row.id),
    name: textOf(row.name),
    profile: textOf(row.profile),
    rate_limit_per_min: limit === null || limit === undefined ? null : Number(limit),
    owner_id: textOf(row.owner_id),
    token_hash: textOf(row.token_hash),
    revoked: row.revoked_at !== null && row.revoked_at !== undefined,
  })!;
}

export const sealUser = (roots: HostRoots, row: Partial<UserRecord>) =>
  roots.mac('authority', userSealedText(row));
export const sealAgent = (roots: HostRoots, row: Partial<AgentSealed>) =>
  roots.mac('authority', agentSealedText(row));

/** Whether the user's row carries the seal this server made over it as it stands. */
export const userSealed = (roots: HostRoots, row: Partial<UserRecord>) =>
  roots.verify('authority', userSealedText(row), row.authority_mac as string | null | undefined);
/** Whether the agent's row carries the seal this server made over it as it stands. */
export const agentSealed = (roots: HostRoots, row: Partial<AgentSealed>) =>
  roots.verify('authority', agentSealedText(row), row.authority_mac as string | null | undefined);

/** The refusal of a change to, or a use of, a record this server did not seal as it stands. */
export const tamperedRecord = (kind: 'user' | 'agent', name: string) =>
  new AppError(
    'TAMPERED',
    `the ${kind} "${name}" was changed in the database outside this server: its record is refused until ` +
      `an operator on the host checks it and runs \`countersign ${kind} reseal ${name}\``,
    `${kind}_record_tampered`,
    { details: { [kind]: name } },
  );

/**
 * Whether `err` is a refused record (tamperedRecord); its audit row is written by whoever catches it
 * after the transaction it aborted rolled back (auditTampered), so that the refusal itself is recorded.
 */
export function recordOfTampered(err: unknown): { kind: 'user' | 'agent'; name: string } | undefined {
  if (!isAppError(err, 'TAMPERED')) return undefined;
  if (err.reason === 'user_record_tampered') return { kind: 'user', name: String(err.details?.user) };
  if (err.reason === 'agent_record_tampered') return { kind: 'agent', name: String(err.details?.agent) };
  return undefined;
}

/** Refuses (TAMPERED) a user's row that does not carry its seal; the row otherwise. */
export function sealedUserOr<T extends Partial<UserRecord>>(roots: HostRoots, row: T): T {
  if (!userSealed(roots, row)) throw tamperedRecord('user', String(row.name));
  return row;
}

/** Refuses (TAMPERED) an agent's row that does not carry its seal; the row otherwise. */
export function sealedAgentOr<T extends Partial<AgentSealed>>(roots: HostRoots, row: T): T {
  if (!agentSealed(roots, row)) throw tamperedRecord('agent', String(row.name));
  return row;
}

/**
 * Reseals, in `trx`, the user's row by its id as it now stands, after the caller changed it (the row is
 * read back, so the seal covers exactly what was written). Returns the row.
 */
export async function resealUserRow(trx: Knex.Transaction, roots: HostRoots, id: string) {
  const row = (await trx('users').select(USER_SEALED_COLUMNS).where({ id }).first()) as UserRecord;
  await trx('users')
    .where({ id })
    .update({ authority_mac: sealUser(roots, row) });
  return row;
}

/** The same for an agent's row. */
export async function resealAgentRow(trx: Knex | Knex.Transaction, roots: HostRoots, id: string) {
  const row = (await trx('agents').select(AGENT_SEALED_COLUMNS).where({ id }).first()) as AgentSealed;
  await trx('agents')
    .where({ id })
    .update({ authority_mac: sealAgent(roots, row) });
  return row;
}

/**
 * Seals, once at the upgrade, every record that has no seal yet (records with a seal, right or wrong,
 * are left as they are). Returns how many of each were sealed.
 */
export async function sealUnsealedRecords(
  trx: Knex.Transaction,
  roots: HostRoots,
): Promise<{ users: number; agents: number }> {
  const users = (await trx('users')
    .select(USER_SEALED_COLUMNS)
    .whereNull('authority_mac')
    .forUpdate()) as UserRecord[];
  for (const u of users)
    await trx('users')
      .where({ id: u.id as string })
      .update({ authority_mac: sealUser(roots, u) });
  const agents = (await trx('agents')
    .select(AGENT_SEALED_COLUMNS)
    .whereNull('authority_mac')
    .forUpdate()) as AgentSealed[];
  for (const a of agents)
    await trx('agents')
      .where({ id: a.id as string })
      .update({ authority_mac: sealAgent(roots, a) });
  return { users: users.length, agents: agents.length };
}

/** Records a refused use of a tampered record (its own transaction; a failure to record is not fatal). */
export async function auditTampered(
  audit: Pick<AuditLog, 'append'> | undefined,
  kind: 'user' | 'agent',
  name: string,
  where: string,
  agentId?: string,
): Promise<void> {
  if (!audit) return;
  await audit
    .append({
      kind: `${kind}.record_tampered`,
      actor: 'system',
      result: 'error',
      error_code: 'TAMPERED',
      ...(agentId ? { agent_id: agentId } : {}),
      details: {
        [kind]: name,
        ...(kind === 'agent' ? { agent_name: name } : {}),
        where,
        reason: `${kind}_record_tampered`,
      },
    })
    .catch(() => undefined);
}

/**
 * The operator's acceptance of a record as it now stands (`countersign user reseal NAME`, run on the
 * host): its seal is made again over the fields as stored, whatever made them so. Returns the fields it
 * sealed (never the password hash itself: whether there is one) and whether the record verified before.
 */
export async function resealUser(trx: Knex.Transaction, roots: HostRoots, name: string) {
  const row = (await trx('users').select(USER_SEALED_COLUMNS).where({ name }).forUpdate().first()) as
    UserRecord | undefined;
  if (!row) throw new AppError('NOT_FOUND', `no user named "${name}"`, 'unknown_user');
  const was = userSealed(roots, row);
  await trx('users')
    .where({ id: row.id as string })
    .update({ authority_mac: sealUser(roots, row) });
  const text = JSON.parse(userSealedText(row)) as Record<string, unknown>;
  const { v: _v, record: _r, password_hash, ...fields } = text;
  return { sealed: { ...fields, password: password_hash !== null }, was_sealed: was };
}

/** The same for an agent (`countersign agent reseal NAME`); the token's MAC is named by its first 12 digits. */
export async function resealAgent(trx: Knex.Transaction, roots: HostRoots, name: string) {
  const row = (await trx('agents').select(AGENT_SEALED_COLUMNS).where({ name }).forUpdate().first()) as
    AgentSealed | undefined;
  if (!row) throw new AppError('NOT_FOUND', `no agent named "${name}"`, 'unknown_agent');
  const was = agentSealed(roots, row);
  await trx('agents')
    .where({ id: row.id as string })
    .update({ authority_mac: sealAgent(roots, row) });
  const text = JSON.parse(agentSealedText(row)) as Record<string, unknown>;
  const { v: _v, record: _r, token_hash, ...fields } = text;
  return {
    sealed: { ...fields, token: String(token_hash).slice(0, 12) },
    was_sealed: was,
    id: String(row.id),
  };
}
