import type { Knex } from 'knex';
import { toCount, type Queryable } from '../../db/knex.ts';
import type { ApprovalStatus } from '../../core/schemas.ts';

/** The requests as people review them: the queue, its counts, and who may decide what. */

export interface QueueQuery {
  status?: ApprovalStatus;
  tool?: string;
  agent?: string;
  limit?: number;
  offset?: number;
  /** Only requests this user can decide now, `held` being the roles and teams they hold. */
  waiting_for?: { id: string; name: string; held: string[] };
}

/** Requests for people to review, oldest first, with the requesting agent's name. */
export async function requestsForReview(q: Queryable, f: QueueQuery) {
  const query = q('approval_requests as r')
    .join('agents as a', 'a.id', 'r.agent_id')
    .select('r.*', 'a.name as agent_name')
    .orderBy([{ column: 'r.created_at' }, { column: 'r.id' }])
    .limit(f.limit ?? 200)
    .offset(f.offset ?? 0);
  if (f.status) query.where('r.status', f.status);
  if (f.tool) query.where('r.tool', f.tool);
  if (f.agent) query.where('a.name', f.agent);
  if (f.waiting_for) waitingFor(q, query, f.waiting_for);
  return (await query) as Record<string, unknown>[];
}

/**
 * "Waiting for me" in SQL, so that paging counts only what the user can decide: pending, undecided by
 * them, of an agent they do not own, under no rule that names who may approve or one that names them
 * (by name, or by a role or team they hold).
 */
function waitingFor(
  q: Queryable,
  query: Knex.QueryBuilder,
  user: { id: string; name: string; held: string[] },
) {
  query.whereRaw(
    `(r.policy_requirement is null
      or (r.policy_requirement -> 'roles' is null and r.policy_requirement -> 'users' is null)
      or jsonb_exists_any(r.policy_requirement -> 'roles', array(select jsonb_array_elements_text(?::jsonb)))
      or jsonb_exists(r.policy_requirement -> 'users', ?))`,
    [JSON.stringify(user.held), user.name],
  );
  query
    .where('r.status', 'pending')
    .where((w) => w.whereNull('a.owner_id').orWhereNot('a.owner_id', user.id))
    .whereNull('a.owner_unresolved')
    .whereNotExists(
      q('approval_decisions as d').whereRaw('d.approval_request_id = r.id').where('d.user_name', user.name),
    );
}

/** How many requests wait for a decision, of every agent and tool. */
export async function countPending(q: Queryable): Promise<number> {
  const row = (await q('approval_requests').where('status', 'pending').count({ n: '*' }).first()) as
    { n: unknown } | undefined;
  return toCount(row?.n);
}

/** How many requests are in each status (for the queue's counts), with tool and agent filters applied. */
export async function countByStatus(q: Queryable, f: { tool?: string; agent?: string }) {
  const query = q('approval_requests as r')
    .join('agents as a', 'a.id', 'r.agent_id')
    .select('r.status')
    .count({ n: '*' })
    .groupBy('r.status');
  if (f.tool) query.where('r.tool', f.tool);
  if (f.agent) query.where('a.name', f.agent);
  const rows = (await query) as { status: ApprovalStatus; n: unknown }[];
  return Object.fromEntries(rows.map((r) => [r.status, toCount(r.n)])) as Partial<
    Record<ApprovalStatus, number>
  >;
}
