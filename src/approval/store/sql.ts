import { userSupersededSql } from '../../accounts/index.ts';

/*
 * The SQL the approval stores share: select-list items and conditions over `approval_requests as r`
 * (or another alias), each read inside the statement that reads the request, so that a check costs no
 * round trip of its own.
 */

/**
 * A select-list item giving the requesting agent's name, for a query over `approval_requests as r`: the
 * name every audit row about the request records, read in the statement that reads the request. A
 * sub-select, not a join, so that `for update` locks the request alone.
 */
export const AGENT_NAME_OF_R = '(select a.name from agents a where a.id = r.agent_id) as agent_name';

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

/** The approvers' sealed records read with APPROVER_RECORDS_OF_R (json comes back parsed or as text). */
export function approverRecordsColumn(raw: Record<string, unknown>): Record<string, unknown>[] {
  const v =
    typeof raw.approver_records === 'string'
      ? (JSON.parse(raw.approver_records) as unknown)
      : raw.approver_records;
  if (!Array.isArray(v)) throw new Error('approver_records column is not a list');
  return v as Record<string, unknown>[];
}
