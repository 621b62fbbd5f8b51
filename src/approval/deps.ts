import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import type { Knex } from 'knex';
import type { AuditLog } from '../audit/log.ts';
import type { Config } from '../config.ts';
import { requestFromDb, toView, type ApprovalView, type RequestRow } from './view.ts';

export interface ApprovalDeps {
  knex: Knex;
  audit: AuditLog;
  config: Config;
  /** The chair's review page for a request. */
  reviewUrl(id: string): string;
  /** Called after a new request is committed (the notification webhook); must not throw. */
  onRequested?(view: ApprovalView, review: Record<string, unknown>, agentName: string): void;
}

/** What approvals are bound to besides content: the approval policy in force when they were issued. */
export function policyVersion(config: Config): string {
  const policy = { required_approvers: config.approval.required_approvers };
  return createHash('sha256').update(canonicalize(policy)!).digest('hex').slice(0, 16);
}

export function requiredApprovers(config: Config, tool: string): number {
  return config.approval.required_approvers[tool] ?? 1;
}

export async function loadRow(q: Knex | Knex.Transaction, where: Record<string, string>, forUpdate = false) {
  const query = q('approval_requests').where(where).first();
  if (forUpdate) query.forUpdate();
  const raw = (await query) as Record<string, unknown> | undefined;
  return raw ? requestFromDb(raw) : undefined;
}

export async function approversOf(q: Knex | Knex.Transaction, id: string): Promise<string[]> {
  const rows = (await q('approval_decisions')
    .where({ approval_request_id: id, decision: 'approve' })
    .orderBy('created_at')
    .select('user_name')) as { user_name: string }[];
  return rows.map((r) => r.user_name);
}

export async function viewOf(
  deps: ApprovalDeps,
  q: Knex | Knex.Transaction,
  row: RequestRow,
): Promise<ApprovalView> {
  return toView(row, await approversOf(q, row.id), deps.reviewUrl(row.id));
}
