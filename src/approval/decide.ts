import { randomUUID } from 'node:crypto';
import type { User } from '../core/identity.ts';
import { approversOf, expireRows, loadRow, viewOf, type ApprovalDeps } from './deps.ts';
import { toView, type ApprovalView, type RequestRow } from './view.ts';

export type DecisionRefusal =
  | 'not_found'
  | 'not_chair'
  | 'owner_of_agent'
  | 'not_pending'
  | 'expired'
  | 'already_decided'
  | 'note_required';

/** A decision that cannot be taken; `reason` is stable for the CLI, the web form and tests. */
export class DecisionError extends Error {
  override name = 'DecisionError';
  constructor(
    readonly reason: DecisionRefusal,
    message: string,
  ) {
    super(message);
  }
}

/**
 * A chair approves or rejects a pending request. The row is locked for the whole decision; the same
 * user submitting the same decision again changes nothing and records nothing. Approval issues an
 * approval_id once the tool's required number of distinct chairs have approved.
 */
export async function decide(
  deps: ApprovalDeps,
  opts: { id: string; user: User; decision: 'approve' | 'reject'; note?: string | null },
): Promise<ApprovalView> {
  const note = opts.note?.trim() || null;
  if (!opts.user.roles.includes('chair')) {
    throw new DecisionError('not_chair', `${opts.user.name} does not hold the chair role`);
  }
  if (opts.decision === 'reject' && !note)
    throw new DecisionError('note_required', 'a rejection needs a note');
  if (!/^[0-9a-f-]{36}$/i.test(opts.id))
    throw new DecisionError('not_found', `no approval request ${opts.id}`);

  const outcome = await deps.knex.transaction<{
    row: RequestRow;
    refusal: DecisionError | undefined;
    /** Set when the decision leaves the row exactly as known here: its view needs no second read. */
    settled?: { row: RequestRow; approvers: string[] };
  }>(async (trx) => {
    const row = await loadRow(trx, { id: opts.id }, true);
    if (!row) throw new DecisionError('not_found', `no approval request ${opts.id}`);

    const mine = (await trx('approval_decisions')
      .where({ approval_request_id: row.id, user_name: opts.user.name })
      .first()) as { decision: string } | undefined;
    if (mine) {
      if (mine.decision === opts.decision) return { row, refusal: undefined };
      throw new DecisionError('already_decided', `${opts.user.name} already decided: ${mine.decision}`);
    }
    if (row.status === 'pending' && new Date(row.expires_at) <= new Date()) {
      await expireRows(deps, trx, [row]);
      return { row, refusal: new DecisionError('expired', 'this request has expired') };
    }
    if (row.status !== 'pending') throw new DecisionError('not_pending', `this request is ${row.status}`);

    const agent = (await trx('agents').where({ id: row.agent_id }).first()) as {
      owner: string | null;
      name: string;
    };
    if (agent.owner && agent.owner === opts.user.name) {
      throw new DecisionError(
        'owner_of_agent',
        `${opts.user.name} owns agent ${agent.name} and cannot decide its requests`,
      );
    }

    const now = new Date().toISOString();
    await trx('approval_decisions').insert({
      id: randomUUID(),
      approval_request_id: row.id,
      user_name: opts.user.name,
      decision: opts.decision,
      note,
      created_at: now,
    });
    const base = {
      actor: opts.user.name,
      agent_id: row.agent_id,
      tool: row.tool,
      target_type: row.target_type,
      target_ref: row.target_id,
      approval_request_id: row.id,
      content_sha256: row.content_sha256,
      file_sha256: row.file_sha256,
      result: 'ok' as const,
    };

    if (opts.decision === 'reject') {
      await trx('approval_requests')
        .where({ id: row.id })
        .update({ status: 'rejected', decided_at: now, note });
      await deps.audit.appendIn(trx, { ...base, kind: 'approval.rejected', approvers: [opts.user.name] });
      return { row, refusal: undefined };
    }

    const approvers = await approversOf(trx, row.id);
    if (approvers.length < row.required_approvers) {
      await deps.audit.appendIn(trx, {
        ...base,
        kind: 'approval.approved',
        approvers,
        details: { final: false, approvals: approvers.length, required: row.required_approvers },
      });
      return { row, refusal: undefined, settled: { row, approvers } };
    }
    const approvalId = randomUUID();
    const change = {
      status: 'approved' as const,
      approval_id: approvalId,
      decided_at: now,
      note,
      expires_at: new Date(Date.now() + deps.config.approval.execute_ttl_s * 1000).toISOString(),
    };
    await trx('approval_requests').where({ id: row.id }).update(change);
    await deps.audit.appendIn(trx, {
      ...base,
      kind: 'approval.approved',
      approval_id: approvalId,
      approvers,
      details: { final: true, approvals: approvers.length, required: row.required_approvers },
    });
    return { row, refusal: undefined, settled: { row: { ...row, ...change }, approvers } };
  });
  if (outcome.refusal) throw outcome.refusal;
  if (outcome.settled) {
    return toView(outcome.settled.row, outcome.settled.approvers, deps.reviewUrl(outcome.settled.row.id));
  }
  return viewOf(deps, deps.knex, (await loadRow(deps.knex, { id: outcome.row.id }))!);
}
