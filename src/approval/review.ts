import { viewOf, viewsOf, type ApprovalDeps } from './deps.ts';
import { decisions, requests, review } from './store/index.ts';
import type { ApprovalStatus } from '../core/schemas.ts';
import { requestFromDb } from './view.ts';
import { isUuid } from '../core/ids.ts';
import { agentWithOwner } from '../accounts/index.ts';
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
  const { waiting_for: me, ...rest } = f;
  // Read from the sealed records (accounts/), so that a role or team given by SQL counts for nothing.
  const held = me ? ((await heldBy(deps.knex, [me.name], await deps.roots())).get(me.name) ?? []) : [];
  const rows = await review.requestsForReview(deps.knex, {
    ...rest,
    ...(me ? { waiting_for: { ...me, held } } : {}),
  });
  const views = await viewsOf(deps, deps.knex, rows.map(requestFromDb));
  return views.map((view, i) => ({ ...view, agent_name: String(rows[i]!.agent_name) }));
}

/** How many requests wait for a decision, of every agent and tool. */
export const countPending = (deps: ApprovalDeps): Promise<number> => review.countPending(deps.knex);

/** How many requests are in each status (for the queue's counts), with tool and agent filters applied. */
export const countByStatus = (deps: ApprovalDeps, f: Pick<QueueFilter, 'tool' | 'agent'>) =>
  review.countByStatus(deps.knex, f);

/**
 * One request with what the chair must see: the exact content, the agent, earlier decisions, and the
 * rule that decides who must approve with the progress so far; with `viewer`, whether that user may
 * decide it and if not why.
 */
export async function showForReview(deps: ApprovalDeps, id: string, viewer?: string) {
  if (!isUuid(id)) return undefined;
  const row = await requests.loadRow(deps.knex, { id });
  if (!row) return undefined;
  const agent = (await agentWithOwner(deps.knex, row.agent_id))!;
  const decided = await decisions.decisionsOf(deps.knex, id);
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
    decisions: decided.map((d) => ({ ...d, created_at: new Date(d.created_at as string).toISOString() })),
  };
}
