import type { Queryable, Transaction } from '../../db/knex.ts';

/** The table of chairs' decisions: one row per user and request, approve or reject. */

/** The users who approved request `id`, in decision order. */
export async function approversOf(q: Queryable, id: string): Promise<string[]> {
  const rows = (await q('approval_decisions')
    .where({ approval_request_id: id, decision: 'approve' })
    .orderBy('created_at')
    .select('user_name')) as { user_name: string }[];
  return rows.map((r) => r.user_name);
}

/** The approvers of each of the requests `ids`, in decision order, in one query. */
export async function approversByRequest(q: Queryable, ids: string[]): Promise<Map<string, string[]>> {
  const decisions = (await q('approval_decisions')
    .whereIn('approval_request_id', ids)
    .where('decision', 'approve')
    .orderBy('created_at')
    .select('approval_request_id', 'user_name')) as { approval_request_id: string; user_name: string }[];
  const approvers = new Map<string, string[]>();
  for (const d of decisions)
    approvers.set(d.approval_request_id, [...(approvers.get(d.approval_request_id) ?? []), d.user_name]);
  return approvers;
}

/** What `user` decided on request `id`, if anything. */
export async function decisionBy(
  trx: Transaction,
  id: string,
  user: string,
): Promise<{ decision: string } | undefined> {
  return (await trx('approval_decisions').where({ approval_request_id: id, user_name: user }).first()) as
    { decision: string } | undefined;
}

/** A decision, as a row of approval_decisions. */
export interface DecisionRow {
  id: string;
  approval_request_id: string;
  user_name: string;
  decision: 'approve' | 'reject';
  note: string | null;
  created_at: string;
}

export async function insertDecision(trx: Transaction, row: DecisionRow): Promise<void> {
  await trx('approval_decisions').insert(row);
}

/** Every decision on request `id`, oldest first: what the review page lists. */
export async function decisionsOf(q: Queryable, id: string) {
  return (await q('approval_decisions').where({ approval_request_id: id }).orderBy('created_at')) as {
    user_name: string;
    decision: 'approve' | 'reject';
    note: string | null;
    created_at: unknown;
  }[];
}
