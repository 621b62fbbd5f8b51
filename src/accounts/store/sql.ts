/*
 * What the accounts' statements share: the columns a sealed record's read selects, and the SQL that
 * says whether the log holds a change of a record after the one its seal binds (authority.ts checks
 * both; docs/identity.md, "Sealed records are fresh").
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
  'sealed_seq',
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
  'sealed_seq',
] as const;

/**
 * A record read to be checked: the sealed columns, and `superseded` (userSupersededSql,
 * agentSupersededSql), whether the log holds a change of it after the one its seal binds.
 */
export type UserRecord = Record<(typeof USER_SEALED_COLUMNS)[number] | 'superseded', unknown>;
export type AgentSealed = Record<(typeof AGENT_SEALED_COLUMNS)[number] | 'superseded', unknown>;

/**
 * The audit rows that say a user's record changed (details.user names it), and an agent's (agent_id):
 * each is appended in the transaction of its change, and the record is sealed again after it with its
 * seq (sealAfterChange). Refusals (`*.record_tampered`) and sign-ins are not changes.
 */
export const USER_CHANGE_KINDS = [
  'user.created',
  'user.role_changed',
  'user.password_reset',
  'user.disabled',
  'user.linked',
  'user.email_changed',
  'user.teams_changed',
  'user.resealed',
] as const;
export const AGENT_CHANGE_KINDS = [
  'agent.created',
  'agent.owner_changed',
  'agent.profile_changed',
  'agent.rate_limit_changed',
  'agent.token_rotated',
  'agent.revoked',
  'agent.resealed',
] as const;

const kindList = (kinds: readonly string[]) => kinds.map((k) => `'${k}'`).join(', ');

/**
 * SQL true when the log holds a change of the user `alias` after the one its seal binds (`sealed_seq`):
 * the row was put back as it stood before that change, seal and all. For a select list, as `superseded`;
 * the (kind, seq) index finds the few change rows after it.
 */
export const userSupersededSql = (alias: string) => `exists (select 1 from audit_events e
  where e.kind in (${kindList(USER_CHANGE_KINDS)}) and e.seq > coalesce(${alias}.sealed_seq, 0)
    and e.details->>'user' = ${alias}.name)`;

/**
 * The same for the agent `alias`, by its id. Found through the (kind, seq) index, which holds few rows
 * after `sealed_seq`: `agent_id || ''` keeps the planner off the (agent_id, seq) index, which it takes
 * without statistics (PGlite never analyzes) and which holds every call the agent ever made — a scan
 * that grew with the log (62 ms at 200,000 rows; 0.7 ms this way).
 */
export const agentSupersededSql = (alias: string) => `exists (select 1 from audit_events e
  where e.kind in (${kindList(AGENT_CHANGE_KINDS)}) and e.seq > coalesce(${alias}.sealed_seq, 0)
    and (e.agent_id || '') = ${alias}.id::text)`;

/** The select-list item of userSupersededSql over `alias`. */
export const USER_SUPERSEDED = (alias = 'users') => `${userSupersededSql(alias)} as superseded`;
/** The select-list item of agentSupersededSql over `alias`. */
export const AGENT_SUPERSEDED = (alias = 'agents') => `${agentSupersededSql(alias)} as superseded`;

/**
 * A select-list item for a query over `agents` (by the (kind, seq) index: agentSupersededSql says why
 * `agent_id || ''`): whether the audit log holds an `agent.revoked` row of
 * this agent (rows the server appended, each with its row MAC: deleting one breaks the chain and its
 * MACs). Few such rows exist, found by the (kind, seq) index; part of the one statement.
 */
export const REVOKED_IN_LOG = `exists (select 1 from audit_events e where e.kind = 'agent.revoked'
  and (e.agent_id || '') = agents.id::text) as revoked_in_log`;
