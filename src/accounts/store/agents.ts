import { toCount, type Queryable, type Transaction } from '../../db/knex.ts';
import type { Agent } from '../../core/identity.ts';
import { AGENT_SEALED_COLUMNS, AGENT_SUPERSEDED, REVOKED_IN_LOG, type AgentSealed } from './sql.ts';

/*
 * The table of agents: every statement that reads or changes one. The rules (tokens and their MACs,
 * the seal each change makes and each use checks, revocation) are in agents.ts and authority.ts; they
 * hand a connection or their transaction to these.
 */

/** The agent as its row holds it, with the owner it was given by a name that resolved to nobody. */
export type AgentRecord = Agent & { owner_unresolved: string | null; revoked_at: Date | string | null };

/** An agent's row as `select *` with its freshness (`superseded`) reads it. */
export type AgentRow = AgentSealed & { id: string; name: string };

// ---- Reads ------------------------------------------------------------------------------------

/**
 * Every agent by name, with its owner's name (a join: users are accounts' too) and what checking its
 * seal needs.
 */
export async function list(q: Queryable) {
  return (await q('agents as a')
    .leftJoin('users as u', 'u.id', 'a.owner_id')
    .select(
      'a.id',
      'a.name',
      'a.profile',
      'a.owner_id',
      'u.name as owner',
      'a.owner_unresolved',
      'a.rate_limit_per_min',
      'a.created_at',
      'a.revoked_at',
      'a.token_hash',
      'a.authority_mac',
      'a.sealed_seq',
      q.raw(AGENT_SUPERSEDED('a')),
    )
    .orderBy('a.name')) as Record<string, unknown>[];
}

/** The active agent `name` with its freshness, locked for a change. */
export async function activeRecordNamedForUpdate(q: Queryable, name: string) {
  return (await q('agents')
    .select('*', q.raw(AGENT_SUPERSEDED()))
    .where({ name })
    .whereNull('revoked_at')
    .forUpdate()
    .first()) as AgentRow | undefined;
}

/** The agent `name` (revoked or not) with its freshness, locked for a change. */
export async function recordNamedForUpdate(q: Queryable, name: string) {
  return (await q('agents').select('*', q.raw(AGENT_SUPERSEDED())).where({ name }).forUpdate().first()) as
    AgentRow | undefined;
}

/**
 * The agent whose `column` is `value`: what authentication reads of its row, with whether the log
 * holds its revocation and its freshness, in one statement.
 */
export async function authRow(q: Queryable, column: 'token_hash' | 'name', value: string) {
  return (await q('agents')
    .select(
      'id',
      'name',
      'profile',
      'owner_id',
      'rate_limit_per_min',
      'revoked_at',
      'token_hash',
      'authority_mac',
      'sealed_seq',
      q.raw(REVOKED_IN_LOG),
      q.raw(AGENT_SUPERSEDED()),
    )
    .where(column, value)
    .first()) as (Agent & AgentSealed & { revoked_at: unknown; revoked_in_log: unknown }) | undefined;
}

/** Whether an active agent still holds a token from before tags. */
export async function anyUntaggedToken(q: Queryable): Promise<boolean> {
  const row = await q('agents').where({ token_tagged: false }).whereNull('revoked_at').first('id');
  return row !== undefined;
}

/** The token hashes of the active agents. */
export async function activeTokenHashes(q: Queryable): Promise<string[]> {
  const rows = (await q('agents').whereNull('revoked_at').select('token_hash')) as {
    token_hash: string;
  }[];
  return rows.map((r) => r.token_hash);
}

/** The agent named `name`, revoked or not; locked for update inside `trx` (a change to it follows). */
export async function namedForUpdate(trx: Transaction, name: string) {
  return (await trx('agents').where({ name }).forUpdate().first()) as AgentRecord | undefined;
}

/** The active (unrevoked) agent named `name`. */
export async function activeNamed(q: Queryable, name: string) {
  return (await q('agents').where({ name }).whereNull('revoked_at').first()) as AgentRecord | undefined;
}

/** The agent with id `id`, revoked or not, with its freshness. */
export async function byId(q: Queryable, id: string) {
  return (await q('agents').select('*', q.raw(AGENT_SUPERSEDED())).where({ id }).first()) as
    (AgentRecord & { superseded: unknown }) | undefined;
}

/** An agent's name with its owner's (null: none, or a name that resolved to nobody, kept as given). */
export async function withOwner(q: Queryable, id: string) {
  return (await q('agents as a')
    .leftJoin('users as u', 'u.id', 'a.owner_id')
    .select('a.name', 'u.name as owner', 'a.owner_unresolved')
    .where('a.id', id)
    .first()) as { name: string; owner: string | null; owner_unresolved: string | null } | undefined;
}

/** How many agents there are, revoked ones included. */
export async function count(q: Queryable): Promise<number> {
  return toCount((await q('agents').count({ n: '*' }).first())?.n);
}

/** The sealed columns of the agent `id`: what sealing it again reads. */
export async function sealedById(trx: Transaction, id: string) {
  return (await trx('agents').select(AGENT_SEALED_COLUMNS).where({ id }).first()) as AgentSealed | undefined;
}

/** The sealed columns and freshness of the agent `name`, locked: an operator's reseal. */
export async function sealedNamedForUpdate(trx: Transaction, name: string) {
  return (await trx('agents')
    .select([...AGENT_SEALED_COLUMNS, trx.raw(AGENT_SUPERSEDED())])
    .where({ name })
    .forUpdate()
    .first()) as AgentSealed | undefined;
}

/** The agents whose seal binds no seq yet, locked: the upgrade's sealing reads them. */
export async function unsealedForUpdate(trx: Transaction) {
  return (await trx('agents')
    .select(AGENT_SEALED_COLUMNS)
    .whereNull('sealed_seq')
    .forUpdate()) as AgentSealed[];
}

// ---- Changes ----------------------------------------------------------------------------------

/** Inserts an agent unless its name is taken: the ids inserted (none: taken). */
export async function insert(q: Queryable, row: Record<string, unknown>) {
  return (await q('agents').insert(row).onConflict('name').ignore().returning('id')) as { id: string }[];
}

/** Sets columns of the agent `id` (with its new seal, made by the caller): how many rows changed. */
export async function update(q: Queryable, id: string, fields: Record<string, unknown>) {
  return await q('agents').where({ id }).update(fields);
}

/** Revokes the active agent `id` now, with its new seal: how many rows changed. */
export async function revoke(q: Queryable, id: string, authority_mac: string) {
  return await q('agents')
    .where({ id })
    .whereNull('revoked_at')
    .update({ revoked_at: q.fn.now(), authority_mac });
}

/** A new token (its MAC, tagged) for the active agent `id`, with its new seal: the id, if it changed. */
export async function setToken(q: Queryable, id: string, token_hash: string, authority_mac: string) {
  return (await q('agents')
    .where({ id })
    .whereNull('revoked_at')
    .update({ token_hash, token_tagged: true, authority_mac })
    .returning('id')) as { id: string }[];
}

/** Stores a legacy token (its SHA-256 `was`) as its MAC, with its new seal, if it is still the one held. */
export async function replaceLegacyToken(
  q: Queryable,
  id: string,
  was: string,
  token_hash: string,
  authority_mac: string,
) {
  await q('agents').where({ id, token_hash: was }).update({ token_hash, authority_mac });
}
