import canonicalize from 'canonicalize';
import type { Transaction } from '../db/knex.ts';
import type { AuditLog } from '../audit/index.ts';
import { AppError, isAppError } from '../core/errors.ts';
import type { HostRoots } from '../core/host-roots.ts';
import {
  AGENT_CHANGE_KINDS,
  USER_CHANGE_KINDS,
  agents,
  users,
  type AgentSealed,
  type UserRecord,
} from './store/index.ts';

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

/** A jsonb column as PostgreSQL or PGlite hand it back (parsed, or text), as a sorted set of strings. */
function setOf(raw: unknown): unknown {
  const v = typeof raw === 'string' ? (JSON.parse(raw) as unknown) : raw;
  if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return [...v].sort();
  return v ?? null;
}

const textOf = (v: unknown) => (v === null || v === undefined ? null : String(v));
const seqOf = (v: unknown) => (v === null || v === undefined ? null : Number(v));

/** The canonical text a user's seal is made over. */
export function userSealedText(row: Partial<UserRecord>): string {
  return canonicalize({
    v: 2,
    record: 'user',
    sealed_seq: seqOf(row.sealed_seq),
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
    v: 2,
    record: 'agent',
    sealed_seq: seqOf(row.sealed_seq),
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

/**
 * Whether a read said the record is not superseded: `false` as the select item reads (a boolean, or
 * JSON's inside json_build_object); a read that did not ask (undefined) is taken as superseded.
 */
const current = (superseded: unknown) => superseded === false || superseded === 'false';

/**
 * Whether the user's row carries the seal this server made over it as it stands, and is the newest the
 * log knows of (its read selected USER_SUPERSEDED: a read that did not is refused).
 */
export const userSealed = (roots: HostRoots, row: Partial<UserRecord>) =>
  roots.verify('authority', userSealedText(row), row.authority_mac as string | null | undefined) &&
  current(row.superseded);
/** The same for an agent's row (its read selected AGENT_SUPERSEDED). */
export const agentSealed = (roots: HostRoots, row: Partial<AgentSealed>) =>
  roots.verify('authority', agentSealedText(row), row.authority_mac as string | null | undefined) &&
  current(row.superseded);

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
 * Seals again, in `trx`, the record an audit row just appended there says changed (its kind is one of
 * USER_CHANGE_KINDS, naming the user in details.user, or AGENT_CHANGE_KINDS, naming the agent by
 * agent_id), binding that row's seq: from then on a copy of the record from before this change meets
 * this row in the log (superseded). The record is read back, so the seal covers exactly what is stored;
 * the change itself checked the seal it had. Any other row: nothing to do.
 */
export async function sealAfterChange(
  trx: Transaction,
  roots: HostRoots,
  row: { kind: string; seq: number | string; agent_id?: string | null; details?: unknown },
): Promise<void> {
  const seq = Number(row.seq);
  if ((USER_CHANGE_KINDS as readonly string[]).includes(row.kind)) {
    const name = (row.details as { user?: unknown } | undefined)?.user;
    if (typeof name !== 'string') throw new Error(`${row.kind} names no user: its record cannot be sealed`);
    const user = await users.sealedNamed(trx, name);
    if (!user) throw new Error(`${row.kind} names "${name}", who is not a user`);
    await users.update(trx, user.id as string, {
      sealed_seq: seq,
      authority_mac: sealUser(roots, { ...user, sealed_seq: seq }),
    });
  } else if ((AGENT_CHANGE_KINDS as readonly string[]).includes(row.kind)) {
    if (!row.agent_id) throw new Error(`${row.kind} names no agent: its record cannot be sealed`);
    const agent = await agents.sealedById(trx, row.agent_id);
    if (!agent) throw new Error(`${row.kind} names agent ${row.agent_id}, which does not exist`);
    await agents.update(trx, row.agent_id, {
      sealed_seq: seq,
      authority_mac: sealAgent(roots, { ...agent, sealed_seq: seq }),
    });
  }
}

/** The canonical text a record was sealed over before seals bound their change's seq (v1). */
const v1Text = (text: string) => {
  const { sealed_seq: _s, ...rest } = JSON.parse(text) as Record<string, unknown>;
  return canonicalize({ ...rest, v: 1 })!;
};

/**
 * Seals, once at the upgrade, the records that need it, binding `head` (the log's head, read in `trx`):
 * no change row of theirs is after it. Before `records_sealed`, every record without a seal; before
 * `records_fresh`, every record whose seal is the earlier kind (v1, no seq) and verifies as such. A
 * record with a wrong seal is left as it is: it stays TAMPERED. Returns how many of each were sealed.
 */
export async function sealUnsealedRecords(
  trx: Transaction,
  roots: HostRoots,
  head: number,
): Promise<{ users: number; agents: number }> {
  const due = (mac: unknown, v1: string) =>
    (mac === null && !roots.recordsSealed) || roots.verify('authority', v1Text(v1), mac as string);
  const userRows = await users.unsealedForUpdate(trx);
  const agentRows = await agents.unsealedForUpdate(trx);
  let counts = { users: 0, agents: 0 };
  for (const u of userRows.filter((r) => due(r.authority_mac, userSealedText(r)))) {
    await users.update(trx, u.id as string, {
      sealed_seq: head,
      authority_mac: sealUser(roots, { ...u, sealed_seq: head }),
    });
    counts = { ...counts, users: counts.users + 1 };
  }
  for (const a of agentRows.filter((r) => due(r.authority_mac, agentSealedText(r)))) {
    await agents.update(trx, a.id as string, {
      sealed_seq: head,
      authority_mac: sealAgent(roots, { ...a, sealed_seq: head }),
    });
    counts = { ...counts, agents: counts.agents + 1 };
  }
  return counts;
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
export async function resealUser(trx: Transaction, roots: HostRoots, name: string) {
  const row = await users.sealedNamedForUpdate(trx, name);
  if (!row) throw new AppError('NOT_FOUND', `no user named "${name}"`, 'unknown_user');
  const was = userSealed(roots, row);
  await users.update(trx, row.id as string, { authority_mac: sealUser(roots, row) });
  const text = JSON.parse(userSealedText(row)) as Record<string, unknown>;
  const { v: _v, record: _r, sealed_seq: _s, password_hash, ...fields } = text;
  return { sealed: { ...fields, password: password_hash !== null }, was_sealed: was };
}

/** The same for an agent (`countersign agent reseal NAME`); the token's MAC is named by its first 12 digits. */
export async function resealAgent(trx: Transaction, roots: HostRoots, name: string) {
  const row = await agents.sealedNamedForUpdate(trx, name);
  if (!row) throw new AppError('NOT_FOUND', `no agent named "${name}"`, 'unknown_agent');
  const was = agentSealed(roots, row);
  await agents.update(trx, row.id as string, { authority_mac: sealAgent(roots, row) });
  const text = JSON.parse(agentSealedText(row)) as Record<string, unknown>;
  const { v: _v, record: _r, sealed_seq: _s, token_hash, ...fields } = text;
  return {
    sealed: { ...fields, token: String(token_hash).slice(0, 12) },
    was_sealed: was,
    id: String(row.id),
  };
}
