import { toCount } from '../db/knex.ts';
import { loadRow, viewOf, viewsOf, type ApprovalDeps } from './deps.ts';
import type { ApprovalStatus } from '../core/schemas.ts';
import { requestFromDb } from './view.ts';
import { isUuid } from '../core/ids.ts';
import { agentWithOwner } from '../accounts/index.ts';
import type { Knex } from 'knex';
import { heldBy } from '../accounts/index.ts';
import { mayDecide, ruleSummaryOf } from './eligible.ts';

export interface QueueFilter {
  status?: ApprovalStatus;
  tool?: string;
  agent?: string;
  limit?: number;
  offset?: number;
  /**
   * Only requests this user can decide now: pending, not decided by them, of an agent they do not own,
   * and, under a rule that names who may approve, one they are among.
   */
  waiting_for?: { id: string; name: string };
}

/** Requests for people to review, oldest first, with the requesting agent's name. */
export async function listForReview(deps: ApprovalDeps, f: QueueFilter) {
  const q = deps
    .knex('approval_requests as r')
    .join('agents as a', 'a.id', 'r.agent_id')
    .select('r.*', 'a.name as agent_name')
    .orderBy([{ column: 'r.created_at' }, { column: 'r.id' }])
    .limit(f.limit ?? 200)
    .offset(f.offset ?? 0);
  if (f.status) q.where('r.status', f.status);
  if (f.tool) q.where('r.tool', f.tool);
  if (f.agent) q.where('a.name', f.agent);
  if (f.waiting_for) {
    const me = f.waiting_for.name;
    const held = (await heldBy(deps.knex, [me], await deps.roots())).get(me) ?? [];
    waitingFor(deps, q, f.waiting_for, held);
  }
  const rows = (await q) as Record<string, unknown>[];
  const views = await viewsOf(deps, deps.knex, rows.map(requestFromDb));
  return views.map((view, i) => ({ ...view, agent_name: String(rows[i]!.agent_name) }));
}

/**
 * "Waiting for me" in SQL, so that paging counts only what the user can decide: pending, undecided by
 * them, of an agent they do not own, under no rule that names who may approve or one that names them
 * (by name, or by a role or team they hold).
 */
function waitingFor(
  deps: ApprovalDeps,
  q: Knex.QueryBuilder,
  user: { id: string; name: string },
  held: string[],
) {
  q.whereRaw(
    `(r.policy_requirement is null
      or (r.policy_requirement -> 'roles' is null and r.policy_requirement -> 'users' is null)
      or jsonb_exists_any(r.policy_requirement -> 'roles', array(select jsonb_array_elements_text(?::jsonb)))
      or jsonb_exists(r.policy_requirement -> 'users', ?))`,
    [JSON.stringify(held), user.name],
  );
  q.where('r.status', 'pending')
    .where((w) => w.whereNull('a.owner_id').orWhereNot('a.owner_id', user.id))
    .whereNull('a.owner_unresolved')
    .whereNotExists(
      deps
        .knex('approval_decisions as d')
        .whereRaw('d.approval_request_id = r.id')
        .where('d.user_name', user.name),
    );
}

/** How many requests are in each status (for the queue's counts), with tool and agent filters applied. */
/** How many requests wait for a decision, of every agent and tool. */
export async function countPending(deps: ApprovalDeps): Promise<number> {
  const row = (await deps.knex('approval_requests').where('status', 'pending').count({ n: '*' }).first()) as
    { n: unknown } | undefined;
  return toCount(row?.n);
}

export async function countByStatus(deps: ApprovalDeps, f: Pick<QueueFilter, 'tool' | 'agent'>) {
  const q = deps
    .knex('approval_requests as r')
    .join('agents as a', 'a.id', 'r.agent_id')
    .select('r.status')
    .count({ n: '*' })
    .groupBy('r.status');
  if (f.tool) q.where('r.tool', f.tool);
  if (f.agent) q.where('a.name', f.agent);
  const rows = (await q) as { status: ApprovalStatus; n: unknown }[];
  return Object.fromEntries(rows.map((r) => [r.status, toCount(r.n)])) as Partial<
    Record<ApprovalStatus, number>
  >;
}

/**
 * One request with what the chair must see: the exact content, the agent, earlier decisions, and the
 * rule that decides who must approve with the progress so far; with `viewer`, whether that user may
 * decide it and if not why.
 */
export async function showForReview(deps: ApprovalDeps, id: string, viewer?: string) {
  if (!isUuid(id)) return undefined;
  const row = await loadRow(deps.knex, { id });
  if (!row) return undefined;
  const agent = (await agentWithOwner(deps.knex, row.agent_id))!;
  const decisions = (await deps
    .knex('approval_decisions')
    .where({ approval_request_id: id })
    .orderBy('created_at')) as {
    user_name: string;
    decision: 'approve' | 'reject';
    note: string | null;
    created_at: unknown;
  }[];
  const view = await viewOf(deps, deps.knex, row);
  return {
    ...view,
    rule: await ruleSummaryOf(deps.knex, row, view.approvers, await deps.roots()),
    viewer: viewer === undefined ? null : await mayDecide(deps.knex, row, viewer, await deps.roots()),
    agent_name: agent.name,
    // The owner's name for display; an owner name that names no user says so.
    agent_owner:
      agent.owner ?? (agent.owner_unresolved === null ? null : `${agent.owner_unresolved} (names no user)`),
    review: row.review,
    decisions: decisions.map((d) => ({ ...d, created_at: new Date(d.created_at as string).toISOString() })),
  };
}
