import type { Connection, Queryable, Transaction } from '../db/knex.ts';
import type { AuditLog } from '../audit/index.ts';
import type { Config } from '../config.ts';
import { toView, type ApprovalView, type NamedRequestRow, type RequestRow } from './view.ts';
import { deliveriesFor } from './outbox.ts';
import { approverRecordsColumn, decisions, requests } from './store/index.ts';
import type { PatternRunner, PolicySource } from './rules/index.ts';
import type { HostRoots } from '../core/host-roots.ts';
import { userSealed } from '../accounts/index.ts';

export interface ApprovalDeps {
  /** The database, handed on to the stores (store/): nothing in the rule files builds a statement. */
  knex: Connection;
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
  trx: Transaction,
  rows: NamedRequestRow[],
  why: Record<string, unknown> = {},
): Promise<void> {
  if (rows.length === 0) return;
  const notices = rows.flatMap((r) => deliveriesFor(deps, 'expired', { ...r, status: 'expired' }));
  await requests.expireRequests(
    trx,
    rows.map((r) => r.id),
    notices,
  );
  await deps.audit.appendIn(
    trx,
    ...rows.map((r) => ({
      kind: 'approval.expired' as const,
      ...requestFacts(r, { from: r.status, ...why }),
    })),
  );
}

export async function viewOf(deps: ApprovalDeps, q: Queryable, row: RequestRow): Promise<ApprovalView> {
  return (await viewsOf(deps, q, [row]))[0]!;
}

/** Views of many requests, with every request's approvers read in one query. */
export async function viewsOf(deps: ApprovalDeps, q: Queryable, rows: RequestRow[]): Promise<ApprovalView[]> {
  if (rows.length === 0) return [];
  const approvers = await decisions.approversByRequest(
    q,
    rows.map((r) => r.id),
  );
  return rows.map((row) => toView(row, approvers.get(row.id) ?? [], deps.reviewUrl(row.id)));
}

/** The names of the approvers whose records (read with the request) do not carry their seal. */
export function unsealedApprovers(raw: Record<string, unknown>, roots: HostRoots): string[] {
  return approverRecordsColumn(raw)
    .filter((u) => !userSealed(roots, u))
    .map((u) => String(u.name));
}
