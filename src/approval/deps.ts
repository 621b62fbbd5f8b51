import type { Knex } from 'knex';
import type { AuditLog } from '../audit/index.ts';
import type { Config } from '../config.ts';
import {
  namedRequestFromDb,
  toView,
  type ApprovalView,
  type NamedRequestRow,
  type RequestRow,
} from './view.ts';
import { changeAndQueue, deliveriesFor } from './outbox.ts';
import type { PatternRunner, PolicySource } from './rules/index.ts';
import type { HostRoots } from '../core/host-roots.ts';
import { userSealed, userSupersededSql } from '../accounts/index.ts';

export interface ApprovalDeps {
  knex: Knex;
  audit: AuditLog;
  config: Config;
  /** The chair's review page for a request; null when no web form serves it. */
  reviewUrl(id: string): string | null;
  /**
   * Called after a change that may have queued notices is committed, so the deliverer looks now rather
   * than at its next poll; must not throw (src/notify/).
   */
  onQueued?(): void;
  /**
   * The approval policy in force (approval/rules/): who must countersign what. Approvals are bound to
   * its version. Built by createApprovals from the config and the database.
   */
  rules: PolicySource;
  /**
   * Called after an approval of a request that a task follows is committed, so that the task's write
   * runs now on this replica rather than at the runner's next round (server/task-runner.ts).
   */
  onTaskApproved?(): void;
  /** The host roots (core/host-roots.ts): the key a decision's MAC is made and checked with (seal.ts). */
  roots(): Promise<HostRoots>;
  /**
   * Worker threads for the rules' long matches (rules/pattern-pool.ts), so that none holds the event
   * loop; without them (a CLI command) every match runs in the calling thread.
   */
  patterns?: PatternRunner;
}

/**
 * A select-list item giving the requesting agent's name, for a query over `approval_requests as r`: the
 * name every audit row about the request records, read in the statement that reads the request. A
 * sub-select, not a join, so that `for update` locks the request alone.
 */
export const AGENT_NAME_OF_R = '(select a.name from agents a where a.id = r.agent_id) as agent_name';

/** One request, with its agent's name; `where` names columns of approval_requests. */
export async function loadRow(q: Knex | Knex.Transaction, where: Record<string, string>, forUpdate = false) {
  const query = q('approval_requests as r').select('r.*', q.raw(AGENT_NAME_OF_R)).where(where).first();
  if (forUpdate) query.forUpdate();
  const raw = (await query) as Record<string, unknown> | undefined;
  return raw ? namedRequestFromDb(raw) : undefined;
}

/**
 * A select-list item giving a request's approvers in decision order, as a JSON array, for a query
 * over `approval_requests as r`: the row and its approvers in one round trip.
 */
export const APPROVERS_OF_R = `coalesce((select json_agg(d.user_name order by d.created_at)
  from approval_decisions d where d.approval_request_id = r.id and d.decision = 'approve'), '[]'::json)
  as approvers`;

/**
 * SQL true when one of the approvals of the request `alias.id` was given by a user now disabled (or no
 * longer known): such an approval no longer executes (`approver_disabled`). An expression, so that the
 * read and the statement that start an execution check it in themselves, with no statement of its own.
 */
export const approverDisabledOf = (alias: string) => `exists (select 1 from approval_decisions d
  left join users u on u.name = d.user_name
  where d.approval_request_id = ${alias}.id and d.decision = 'approve'
    and (u.id is null or u.disabled_at is not null))`;

/**
 * A select-list item for a query over `approval_requests as r`: the sealed record of each user who
 * approved it (the fields and the seal, accounts/authority.ts), so that execution checks that no
 * approver's record was changed by SQL since (roles or teams given, a password set) without a
 * statement of its own.
 */
export const APPROVER_RECORDS_OF_R = `coalesce((select json_agg(json_build_object(
    'id', u.id, 'name', u.name, 'roles', u.roles, 'teams', u.teams, 'email', u.email,
    'password_hash', u.password_hash, 'oidc_issuer', u.oidc_issuer, 'oidc_subject', u.oidc_subject,
    'disabled_at', u.disabled_at, 'authority_mac', u.authority_mac, 'sealed_seq', u.sealed_seq,
    'superseded', ${userSupersededSql('u')}))
  from approval_decisions d join users u on u.name = d.user_name
  where d.approval_request_id = r.id and d.decision = 'approve'), '[]'::json) as approver_records`;

/** The names of the approvers whose records (APPROVER_RECORDS_OF_R) do not carry their seal. */
export function unsealedApprovers(raw: Record<string, unknown>, roots: HostRoots): string[] {
  const v =
    typeof raw.approver_records === 'string'
      ? (JSON.parse(raw.approver_records) as unknown)
      : raw.approver_records;
  if (!Array.isArray(v)) throw new Error('approver_records column is not a list');
  return (v as Record<string, unknown>[]).filter((u) => !userSealed(roots, u)).map((u) => String(u.name));
}

/** A select-list item for a query over `approval_requests as r`: whether an approver is disabled. */
export const APPROVER_DISABLED_OF_R = `${approverDisabledOf('r')} as approver_disabled`;

/**
 * SQL true when the request `alias` is approved under a rule that names who may approve (roles and
 * teams, or users) and fewer of its approvals than it needs come from people the rule accepts now:
 * active, holding a role or team it names (or named in it). An approver taken off the team since no
 * longer counts (`approver_not_eligible`); like approverDisabledOf, it costs no statement of its own.
 */
export const approverNotEligibleOf = (alias: string) => `(${alias}.status = 'approved'
  and (${alias}.policy_requirement -> 'roles' is not null or ${alias}.policy_requirement -> 'users' is not null)
  and (select count(*) from approval_decisions d join users u on u.name = d.user_name
    where d.approval_request_id = ${alias}.id and d.decision = 'approve' and u.disabled_at is null
      and (coalesce(${alias}.policy_requirement -> 'users' @> to_jsonb(d.user_name::text), false)
        or exists (select 1 from jsonb_array_elements(coalesce(${alias}.policy_requirement -> 'roles', '[]'))
          as x(role) where u.roles @> jsonb_build_array(x.role) or u.teams @> jsonb_build_array(x.role)))
  ) < ${alias}.required_approvers)`;

/** A select-list item for a query over `approval_requests as r`: whether too few approvers still count. */
export const APPROVER_NOT_ELIGIBLE_OF_R = `${approverNotEligibleOf('r')} as approver_not_eligible`;

/**
 * A select-list item: whether the log already holds a write.started of the request `r` (an approval is
 * used once, whatever its row's status says: a status set back by SQL does not make it unused).
 */
export const STARTED_OF_R = `exists (select 1 from audit_events e where e.approval_request_id = r.id::text
  and e.kind = 'write.started') as started_before`;

/** The approvers column of a row read with APPROVERS_OF_R (json comes back parsed or as text). */
export function approversColumn(raw: Record<string, unknown>): string[] {
  const v = typeof raw.approvers === 'string' ? (JSON.parse(raw.approvers) as unknown) : raw.approvers;
  if (!Array.isArray(v) || !v.every((x) => typeof x === 'string')) {
    throw new Error('approvers column is not a list of names');
  }
  return v;
}

export async function approversOf(q: Knex | Knex.Transaction, id: string): Promise<string[]> {
  const rows = (await q('approval_decisions')
    .where({ approval_request_id: id, decision: 'approve' })
    .orderBy('created_at')
    .select('user_name')) as { user_name: string }[];
  return rows.map((r) => r.user_name);
}

/** The audit fields every row about one request carries, `details` (given) with the agent's name. */
export function requestFacts(row: NamedRequestRow, details: Record<string, unknown> = {}) {
  return {
    agent_id: row.agent_id,
    tool: row.tool,
    source: row.source,
    target_type: row.target_type,
    target_ref: row.target_id,
    approval_request_id: row.id,
    approval_id: row.approval_id,
    content_sha256: row.content_sha256,
    file_sha256: row.file_sha256,
    details: { ...details, agent_name: row.agent_name },
  };
}

/**
 * Marks open requests expired inside `trx`, each with its approval.expired row; `why` adds to the
 * rows' details when they end early (an approver disabled), not at their time.
 */
export async function expireRows(
  deps: ApprovalDeps,
  trx: Knex.Transaction,
  rows: NamedRequestRow[],
  why: Record<string, unknown> = {},
): Promise<void> {
  if (rows.length === 0) return;
  const expire = trx('approval_requests')
    .whereIn(
      'id',
      rows.map((r) => r.id),
    )
    .whereIn('status', ['pending', 'approved'])
    .update({ status: 'expired' });
  const notices = rows.flatMap((r) => deliveriesFor(deps, 'expired', { ...r, status: 'expired' }));
  await changeAndQueue(trx, expire, notices);
  await deps.audit.appendIn(
    trx,
    ...rows.map((r) => ({
      kind: 'approval.expired' as const,
      ...requestFacts(r, { from: r.status, ...why }),
    })),
  );
}

export async function viewOf(
  deps: ApprovalDeps,
  q: Knex | Knex.Transaction,
  row: RequestRow,
): Promise<ApprovalView> {
  return (await viewsOf(deps, q, [row]))[0]!;
}

/** Views of many requests, with every request's approvers read in one query. */
export async function viewsOf(
  deps: ApprovalDeps,
  q: Knex | Knex.Transaction,
  rows: RequestRow[],
): Promise<ApprovalView[]> {
  if (rows.length === 0) return [];
  const decisions = (await q('approval_decisions')
    .whereIn(
      'approval_request_id',
      rows.map((r) => r.id),
    )
    .where('decision', 'approve')
    .orderBy('created_at')
    .select('approval_request_id', 'user_name')) as { approval_request_id: string; user_name: string }[];
  const approvers = new Map<string, string[]>();
  for (const d of decisions)
    approvers.set(d.approval_request_id, [...(approvers.get(d.approval_request_id) ?? []), d.user_name]);
  return rows.map((row) => toView(row, approvers.get(row.id) ?? [], deps.reviewUrl(row.id)));
}
