import { named, type Queryable, type Transaction } from '../../db/knex.ts';
import type { GuardedChange } from '../../audit/index.ts';
import type { ApprovalStatus } from '../../core/schemas.ts';
import { namedRequestFromDb, type NamedRequestRow } from '../view.ts';
import { chain, insertFromGuard, updateFromGuard, type Delivery } from './guarded.ts';
import { changeAndQueue } from './outbox.ts';
import { POLICY_UNCHANGED_SQL } from '../rules/index.ts';
import {
  AGENT_NAME_OF_R,
  APPROVER_DISABLED_OF_R,
  APPROVER_NOT_ELIGIBLE_OF_R,
  APPROVER_RECORDS_OF_R,
  APPROVERS_OF_R,
  STARTED_OF_R,
  approverDisabledOf,
  approverNotEligibleOf,
} from './sql.ts';

/*
 * The table of approval requests: every statement that reads or changes one. The rules that decide
 * what to change are in the files above (request.ts, decide.ts, execute.ts, ruling.ts, tasks.ts,
 * maintenance.ts); they hand a connection or their transaction to these and never build a statement.
 */

// ---- Reads ------------------------------------------------------------------------------------

/** One request, with its agent's name; `where` names columns of approval_requests. */
export async function loadRow(q: Queryable, where: Record<string, string>, forUpdate = false) {
  const query = q('approval_requests as r').select('r.*', q.raw(AGENT_NAME_OF_R)).where(where).first();
  if (forUpdate) query.forUpdate();
  const raw = (await query) as Record<string, unknown> | undefined;
  return raw ? namedRequestFromDb(raw) : undefined;
}

/**
 * The request `id` as the at-once approval reads it: with the agent's name and owner, its approvers,
 * whether `user` decided it already and whether a task follows it (its approval then runs the task).
 */
export async function readToDecide(q: Queryable, id: string, user: string) {
  const query = q('approval_requests as r')
    .join('agents as a', 'a.id', 'r.agent_id')
    .select(
      'r.*',
      'a.name as agent_name',
      'a.owner_id as agent_owner_id',
      'a.owner_unresolved as agent_owner_unresolved',
      q.raw(APPROVERS_OF_R),
      q.raw(
        'exists (select 1 from approval_decisions m where m.approval_request_id = r.id and m.user_name = ?) as mine',
        [user],
      ),
      q.raw('exists (select 1 from approval_tasks k where k.approval_request_id = r.id) as has_task'),
    )
    .where('r.id', id)
    .first();
  return (await named(q, 'countersign_approval_to_decide', query)) as Record<string, unknown> | undefined;
}

/**
 * The request an approval_id names, with its approvers, whether one of them is disabled or no longer
 * eligible, whether its write started before, and the approvers' sealed records; nothing locked.
 */
export async function readApproval(q: Queryable, approval_id: string) {
  const query = q('approval_requests as r')
    .select(
      'r.*',
      q.raw(APPROVERS_OF_R),
      q.raw(APPROVER_DISABLED_OF_R),
      q.raw(APPROVER_NOT_ELIGIBLE_OF_R),
      q.raw(STARTED_OF_R),
      q.raw(APPROVER_RECORDS_OF_R),
    )
    .where('r.approval_id', approval_id)
    .first();
  return (await named(q, 'countersign_approval_to_execute', query)) as Record<string, unknown> | undefined;
}

/**
 * The request an approval_id names, with its agent's name and the flags readApproval gives, in one
 * statement; `lock` locks the request alone (the rest are sub-selects), and without it the approvers
 * come with the row (a dry run's check).
 */
export async function loadApproval(q: Queryable, approval_id: string, lock: boolean) {
  const query = q('approval_requests as r')
    .select(
      'r.*',
      q.raw(AGENT_NAME_OF_R),
      q.raw(APPROVER_DISABLED_OF_R),
      q.raw(APPROVER_NOT_ELIGIBLE_OF_R),
      q.raw(STARTED_OF_R),
      q.raw(APPROVER_RECORDS_OF_R),
      ...(lock ? [] : [q.raw(APPROVERS_OF_R)]),
    )
    .where('r.approval_id', approval_id)
    .first();
  if (lock) query.forUpdate();
  return (await query) as Record<string, unknown> | undefined;
}

/** The agent's open request (pending or approved) for this content, with whether an approver is void. */
export async function openRequestOf(q: Queryable, agent_id: string, content_sha256: string) {
  return (await q('approval_requests as r')
    .select('r.*', q.raw(APPROVER_DISABLED_OF_R), q.raw(APPROVER_NOT_ELIGIBLE_OF_R))
    .where({ 'r.agent_id': agent_id, 'r.content_sha256': content_sha256 })
    .whereIn('r.status', ['pending', 'approved'])
    .first()) as Record<string, unknown> | undefined;
}

/** One of the agent's own requests by request id or approval id, with its approvers. */
export async function ownRequest(
  q: Queryable,
  agentId: string,
  by: { approval_request_id?: string; approval_id?: string },
) {
  const query = q('approval_requests as r').select('r.*', q.raw(APPROVERS_OF_R)).where('r.agent_id', agentId);
  if (by.approval_request_id) query.where('r.id', by.approval_request_id);
  if (by.approval_id) query.where('r.approval_id', by.approval_id);
  const key = `${by.approval_request_id ? 'request' : ''}${by.approval_id ? 'approval' : ''}`;
  return (await named(q, `countersign_own_approval_by_${key}`, query.first())) as
    Record<string, unknown> | undefined;
}

/** A page of the agent's own requests, newest first, keyset-paged on (created_at, id): `limit` + 1 rows. */
export async function ownRequests(
  q: Queryable,
  agentId: string,
  opts: { status?: ApprovalStatus; limit: number; after?: { t: string; id: string } },
) {
  const query = q('approval_requests')
    .where('agent_id', agentId)
    .orderBy([
      { column: 'created_at', order: 'desc' },
      { column: 'id', order: 'desc' },
    ])
    .limit(opts.limit + 1);
  if (opts.status) query.where('status', opts.status);
  if (opts.after)
    query.whereRaw('(created_at, id) < (?::timestamptz, ?::uuid)', [opts.after.t, opts.after.id]);
  return (await query) as Record<string, unknown>[];
}

/** A request's status, if it exists. */
export async function statusOf(q: Queryable, id: string, forUpdate = false) {
  const query = q('approval_requests').where({ id }).first('status');
  if (forUpdate) query.forUpdate();
  return (await query) as { status: string } | undefined;
}

/** Open requests past their time, locked `skip locked` (a replica expiring them too takes others). */
export async function dueForExpiry(trx: Transaction, now: string): Promise<NamedRequestRow[]> {
  const due = (await trx('approval_requests as r')
    .select('r.*', trx.raw(AGENT_NAME_OF_R))
    .whereIn('r.status', ['pending', 'approved'])
    .where('r.expires_at', '<=', now)
    .forUpdate()
    .skipLocked()
    .limit(500)) as Record<string, unknown>[];
  return due.map(namedRequestFromDb);
}

/** Executions started before `cutoff` and still executing: the ones reconciliation settles. */
export async function staleExecutions(q: Queryable, cutoff: string): Promise<NamedRequestRow[]> {
  const rows = (await q('approval_requests as r')
    .select('r.*', q.raw(AGENT_NAME_OF_R))
    .where('r.status', 'executing')
    .where('r.execution_started_at', '<=', cutoff)
    .limit(100)) as Record<string, unknown>[];
  return rows.map(namedRequestFromDb);
}

/** Locks request `id` while it is executing, `skip locked`: false when it is not, or a write holds it. */
export async function holdExecuting(trx: Transaction, id: string): Promise<boolean> {
  const held = await trx('approval_requests')
    .where({ id, status: 'executing' })
    .forUpdate()
    .skipLocked()
    .first('id');
  return held !== undefined;
}

// ---- Changes inside a transaction ---------------------------------------------------------------

/** A new request, as a row of approval_requests (jsonb columns as JSON text), with its notices. */
export async function insertRequest(
  trx: Transaction,
  row: Record<string, unknown>,
  deliveries: readonly Delivery[] = [],
): Promise<void> {
  await changeAndQueue(trx, trx('approval_requests').insert(row), deliveries);
}

/**
 * Sets `change` on request `id` while its status is one of `from`, queueing `deliveries` in the same
 * statement; returns how many rows changed (0 or 1) when nothing is queued.
 */
export async function changeRequest(
  trx: Transaction,
  id: string,
  from: readonly ApprovalStatus[] | undefined,
  change: Record<string, unknown>,
  deliveries: readonly Delivery[] = [],
): Promise<number | undefined> {
  const update = trx('approval_requests').where({ id });
  if (from) update.whereIn('status', from);
  if (deliveries.length === 0) return (await update.update(change)) as number;
  await changeAndQueue(trx, update.update(change), deliveries);
  return undefined;
}

/** Expires the open ones of requests `ids`, queueing their notices in the same statement. */
export async function expireRequests(
  trx: Transaction,
  ids: string[],
  deliveries: readonly Delivery[],
): Promise<void> {
  const expire = trx('approval_requests')
    .whereIn('id', ids)
    .whereIn('status', ['pending', 'approved'])
    .update({ status: 'expired' });
  await changeAndQueue(trx, expire, deliveries);
}

// ---- One-statement changes (AuditLog.appendWith) -----------------------------------------------

/** The open-request index (agent, content) that makes a repeated draft find the first one. */
const OPEN_CONTENT = "(agent_id, content_sha256) where status in ('pending', 'approved') do nothing";

/** A new request, inserted unless the agent has an open one for the same content. */
export const newRequestChange = (row: Record<string, unknown>): GuardedChange =>
  insertFromGuard('change', 'approval_requests', row, { onConflict: OPEN_CONTENT });

/**
 * The at-once approval's change: the last approval changes the status first and inserts the decision
 * only with it (a request another chair approved meanwhile changes nothing, so no decision row is left
 * without its audit row); any other inserts it alone. Counted where it commits: either changes nothing
 * unless the request still has exactly the `decided` decisions read before. The statement's snapshot
 * holds every decision up to the chain's head (each commits with its audit row), so a racing decision
 * committed since the read sends this one to the transaction, which counts it with the others under
 * the row lock: whichever commits last sees them all.
 */
export function decisionChange(
  id: string,
  decided: number,
  decision: Record<string, unknown>,
  change: Record<string, unknown> | undefined,
): GuardedChange {
  const unchanged = {
    sql: `(select count(*) from approval_decisions d where d.approval_request_id = ?) = ?`,
    bindings: [id, decided],
  };
  const insert = insertFromGuard('decided', 'approval_decisions', decision, { from: 'change' });
  if (change) {
    const where = { sql: `t.status = 'pending' and ${unchanged.sql}`, bindings: unchanged.bindings };
    return chain(updateFromGuard('change', 'approval_requests', id, change, where), insert);
  }
  const pending = {
    sql: `change as (select t.id from approval_requests t where t.id = ? and t.status = 'pending'
      and ${unchanged.sql} and exists (select 1 from guard))`,
    bindings: [id, ...unchanged.bindings],
  };
  return chain(pending, insert);
}

/**
 * Marks request `id` executing while it is still approved and unexpired at `now`, no approver of it is
 * disabled or taken off the rule's team since it was read, and the stored policy is still the text
 * `policy` (HeldPolicy.stored, approval/rules/).
 */
export const startChange = (
  id: string,
  started: Record<string, unknown>,
  now: string,
  policy: string,
): GuardedChange =>
  updateFromGuard('change', 'approval_requests', id, started, {
    sql: `t.status = 'approved' and t.expires_at > ?::timestamptz and not ${approverDisabledOf('t')}
        and not ${approverNotEligibleOf('t')}
        and ${POLICY_UNCHANGED_SQL}`,
    bindings: [now, policy],
  });

/** Sets the outcome `finished` on request `id` while it is executing. */
export const finishChange = (id: string, finished: Record<string, unknown>): GuardedChange =>
  updateFromGuard('change', 'approval_requests', id, finished, {
    sql: "t.status = 'executing'",
    bindings: [],
  });
