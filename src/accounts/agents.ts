import { hash, randomUUID } from 'node:crypto';
import type { Queryable, Transaction } from '../db/knex.ts';
import { AppError } from '../core/errors.ts';
import { AgentName, type Agent } from '../core/identity.ts';
import type { HostRoots } from '../core/host-roots.ts';
import { hostRootsOf } from '../db/host-roots.ts';
import { newTaggedToken, tokenTagKey } from './token-tag.ts';
import { agentSealed, sealAgent, sealedAgentOr } from './authority.ts';
import type { AgentSealed } from './store/index.ts';
import { agents, users, type AgentRecord } from './store/index.ts';

/** An agent token: 256 random bits, recognisable by its prefix, with its tag (token-tag.ts). */
const newToken = (roots: HostRoots) => newTaggedToken(tokenTagKey(roots));

/**
 * A token's SHA-256: how tokens were stored before they were MACs (and the key of the per-replica
 * cache). One call, no Hash object.
 */
export const hashToken = (token: string) => hash('sha256', token, 'hex');

/**
 * What agents.token_hash holds: the token's HMAC-SHA256 under the host roots' agent-token key. A row
 * inserted, or a token_hash set, by whoever administers the database matches no token they can present:
 * they cannot make the MAC without the host's key (docs/identity.md, "Agent tokens").
 */
export const storedToken = (roots: HostRoots, token: string) => roots.mac('agent-token', token);

/** The roots given, else those opened for `knex` (the host's keys: db/host-roots.ts). */
const rootsFor = async (knex: Queryable, roots: HostRoots | undefined) => roots ?? (await hostRootsOf(knex));

/** `agent_record_tampered`: the token's agent has a record this server did not seal (authority.ts). */
export type AuthFailure = 'missing_token' | 'unknown_token' | 'revoked_token' | 'agent_record_tampered';

/**
 * The user an agent's owner names, ignoring case as user names are unique so; an owner must be a user who
 * exists (NOT_FOUND, unknown_owner), so that the owner rule has a person to hold to.
 */
export async function ownerNamed(knex: Queryable, name: string): Promise<{ id: string; name: string }> {
  const row = await users.idNamedIgnoringCase(knex, name);
  if (!row) throw new AppError('NOT_FOUND', `no user named "${name}" to own the agent`, 'unknown_owner');
  return row;
}

/** Creates an agent; `owner` names an existing user (ignoring case), recorded by id. */
export async function createAgent(
  knex: Queryable,
  opts: { name: string; profile?: string; owner?: string | null; rate_limit_per_min?: number | null },
  hostRoots?: HostRoots,
): Promise<{ agent: Agent; token: string; owner: string | null }> {
  const name = AgentName.parse(opts.name);
  const roots = await rootsFor(knex, hostRoots);
  const owner = opts.owner ? await ownerNamed(knex, opts.owner) : undefined;
  const token = newToken(roots);
  const agent: Agent = {
    id: randomUUID(),
    name,
    profile: opts.profile ?? 'all',
    owner_id: owner?.id ?? null,
    rate_limit_per_min: opts.rate_limit_per_min ?? null,
  };
  const token_hash = storedToken(roots, token);
  const inserted = await agents.insert(knex, {
    ...agent,
    token_hash,
    token_tagged: true,
    authority_mac: sealAgent(roots, { ...agent, token_hash, revoked_at: null }),
  });
  if (inserted.length === 0)
    throw new AppError('CONFLICT', `an agent named "${name}" already exists`, 'agent_exists');
  return { agent, token, owner: owner?.name ?? null };
}

/**
 * Every agent, by name. `owner` is the owning user's name; `owner_unresolved` an owner name from before
 * owners were users that names no user (its requests can be decided by nobody until an owner is set).
 */
export async function listAgents(knex: Queryable, roots?: HostRoots) {
  const rows = await agents.list(knex);
  return rows.map((r: Record<string, unknown>) => ({
    id: String(r.id),
    name: String(r.name),
    profile: String(r.profile),
    rate_limit_per_min: (r.rate_limit_per_min as number | null) ?? null,
    owner: (r.owner as string | null) ?? null,
    owner_id: (r.owner_id as string | null) ?? null,
    owner_unresolved: (r.owner_unresolved as string | null) ?? null,
    created_at: new Date(r.created_at as string).toISOString(),
    revoked_at: r.revoked_at ? new Date(r.revoked_at as string).toISOString() : null,
    // With the host roots: whether the record carries its seal (authority.ts); never the token's MAC.
    ...(roots ? { sealed: agentSealed(roots, r) } : {}),
  }));
}

/**
 * The active agent `name`, locked for a change and checked against its seal (TAMPERED when it does not
 * carry it: a change never seals what SQL made of it); undefined when no active agent has the name.
 */
async function activeSealedForUpdate(knex: Queryable, roots: HostRoots, name: string) {
  const row = await agents.activeRecordNamedForUpdate(knex, name);
  return row && sealedAgentOr(roots, row);
}

/** Revokes by name; returns false when no active agent has that name. */
export async function revokeAgent(knex: Queryable, name: string, hostRoots?: HostRoots): Promise<boolean> {
  const roots = await rootsFor(knex, hostRoots);
  const row = await activeSealedForUpdate(knex, roots, name);
  if (!row) return false;
  const n = await agents.revoke(knex, row.id, sealAgent(roots, { ...row, revoked_at: true }));
  return n > 0;
}

/**
 * A new token for an active agent, stored as its MAC in place of the old one: the old token is refused
 * from the moment this commits (on every replica: the agents trigger announces the change). Undefined
 * when no active agent has the name.
 */
export async function rotateAgentToken(
  knex: Queryable,
  name: string,
  hostRoots?: HostRoots,
): Promise<{ agent_id: string; token: string } | undefined> {
  const roots = await rootsFor(knex, hostRoots);
  const current = await activeSealedForUpdate(knex, roots, name);
  if (!current) return undefined;
  const token = newToken(roots);
  const token_hash = storedToken(roots, token);
  const [row] = await agents.setToken(
    knex,
    current.id,
    token_hash,
    sealAgent(roots, { ...current, token_hash }),
  );
  return row && { agent_id: row.id, token };
}

/**
 * The agent whose `column` is `value`, whether it is revoked, and whether its record carries its seal
 * (authority.ts; checked from the columns this one read): what authentication needs of its row.
 */
export async function agentRow(
  knex: Queryable,
  column: 'token_hash' | 'name',
  value: string,
  hostRoots?: HostRoots,
): Promise<{ agent: Agent; revoked: boolean; tampered: boolean; row: AgentSealed } | undefined> {
  const roots = await rootsFor(knex, hostRoots);
  const row = await agents.authRow(knex, column, value);
  if (!row) return undefined;
  const agent: Agent = {
    id: String(row.id),
    name: row.name,
    profile: row.profile,
    owner_id: row.owner_id ?? null,
    rate_limit_per_min: row.rate_limit_per_min ?? null,
  };
  // Revoked if its row says so, or if the log holds its revocation (there is no un-revoking): a row put
  // back whole, seal and all, as it was before `agent revoke` does not bring the agent back.
  const revoked = Boolean(row.revoked_at) || row.revoked_in_log === true;
  return { agent, revoked, tampered: !agentSealed(roots, row), row };
}

/** Whether an active agent still holds a token from before tags (token-tag.ts): then those are looked up. */
export async function anyUntaggedToken(knex: Queryable): Promise<boolean> {
  return agents.anyUntaggedToken(knex);
}

/** The token hashes of the active agents: what the host roots record at the upgrade to MACs. */
export async function storedTokenHashes(knex: Queryable): Promise<string[]> {
  return agents.activeTokenHashes(knex);
}

/**
 * A token stored as its SHA-256 before tokens were MACs: found only if the host roots recorded that
 * hash at the upgrade (a SHA-256 written in later by SQL is not), and stored as its MAC on this first
 * use, so that it is looked up as every other token from then on.
 */
async function legacyRow(knex: Queryable, roots: HostRoots, token: string) {
  const sha256 = hashToken(token);
  if (!roots.legacyTokenHashes.has(sha256)) return undefined;
  const row = await agentRow(knex, 'token_hash', sha256, roots);
  if (row && !row.revoked && !row.tampered) {
    const token_hash = storedToken(roots, token);
    await agents.replaceLegacyToken(
      knex,
      row.agent.id,
      sha256,
      token_hash,
      sealAgent(roots, { ...row.row, token_hash }),
    );
  }
  return row;
}

export async function authenticate(
  knex: Queryable,
  token: string | undefined,
  hostRoots?: HostRoots,
): Promise<{ agent: Agent } | { failure: AuthFailure; agent?: Agent }> {
  if (!token) return { failure: 'missing_token' };
  const roots = await rootsFor(knex, hostRoots);
  const row =
    (await agentRow(knex, 'token_hash', storedToken(roots, token), roots)) ??
    (await legacyRow(knex, roots, token));
  if (!row) return { failure: 'unknown_token' };
  // A record changed by SQL (its profile, limit, owner, token, revocation) is refused, never served.
  if (row.tampered) return { failure: 'agent_record_tampered', agent: row.agent };
  return row.revoked ? { failure: 'revoked_token', agent: row.agent } : { agent: row.agent };
}

/**
 * Changes an agent's profile, rate limit and/or owner (a user id, or null for none; setting it resolves an
 * unresolved owner); returns false when no agent has that name.
 */
export async function updateAgent(
  knex: Queryable,
  name: string,
  change: { profile?: string; rate_limit_per_min?: number | null; owner_id?: string | null },
  hostRoots?: HostRoots,
): Promise<boolean> {
  const defined = Object.fromEntries(Object.entries(change).filter(([, v]) => v !== undefined));
  if (Object.keys(defined).length === 0) return true;
  const roots = await rootsFor(knex, hostRoots);
  const row = await agents.recordNamedForUpdate(knex, name);
  if (!row) return false;
  sealedAgentOr(roots, row);
  const owner = 'owner_id' in defined ? { owner_unresolved: null } : {};
  return (
    (await agents.update(knex, row.id, {
      ...defined,
      ...owner,
      authority_mac: sealAgent(roots, { ...row, ...defined }),
    })) > 0
  );
}

/** The agent as its row holds it, with the owner it was given by a name that resolved to nobody. */
export type { AgentRecord };

/** The agent named `name`, revoked or not; locked for update inside `trx` (a change to it follows). */
export async function agentNamedForUpdate(trx: Transaction, name: string) {
  return agents.namedForUpdate(trx, name);
}

/** The active (unrevoked) agent named `name`. */
export async function activeAgentNamed(q: Queryable, name: string) {
  return agents.activeNamed(q, name);
}

/**
 * The agent with id `id`, revoked or not, with what checking its seal needs (`superseded`: agentSealed).
 */
export async function agentById(q: Queryable, id: string) {
  return agents.byId(q, id);
}

/** An agent's name with its owner's (null: none, or a name that resolved to nobody, kept as given). */
export async function agentWithOwner(q: Queryable, id: string) {
  return agents.withOwner(q, id);
}

/** How many agents there are, revoked ones included. */
export async function countAgents(q: Queryable): Promise<number> {
  return agents.count(q);
}
