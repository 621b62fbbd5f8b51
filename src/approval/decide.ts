import { randomUUID } from 'node:crypto';
import { AppError, type AppErrorCode } from '../core/errors.ts';
import type { User } from '../core/identity.ts';
import { expireRows, viewOf, type ApprovalDeps } from './deps.ts';
import { lockingRow } from './store/guarded.ts';
import { approversColumn, decisions, requests, withQueued } from './store/index.ts';
import { deliveriesFor } from './outbox.ts';
import {
  namedRequestFromDb,
  toView,
  type ApprovalView,
  type NamedRequestRow,
  type RequestRow,
} from './view.ts';
import { isUuid } from '../core/ids.ts';
import type { Transaction } from '../db/knex.ts';
import { retryingTransaction } from '../db/retry.ts';
import { agentById, agentSealed, tamperedRecord } from '../accounts/index.ts';
import { eligibleApprovers, restrictionOf, whoMayApprove } from './eligible.ts';
import { sealDecision } from './seal.ts';

export type DecisionRefusal =
  | 'not_found'
  | 'not_chair'
  | 'owner_of_agent'
  | 'owner_unresolved'
  | 'not_pending'
  | 'expired'
  | 'already_decided'
  | 'note_required'
  | 'not_eligible';

/** The code each refusal is answered with; the reason is stable for the CLI, the web form and tests. */
export const DECISION_CODE = {
  not_found: 'NOT_FOUND',
  not_chair: 'PERMISSION_DENIED',
  owner_of_agent: 'PERMISSION_DENIED',
  owner_unresolved: 'PERMISSION_DENIED',
  note_required: 'INVALID_ARGUMENT',
  not_pending: 'CONFLICT',
  expired: 'CONFLICT',
  already_decided: 'CONFLICT',
  not_eligible: 'PERMISSION_DENIED',
} as const satisfies Record<DecisionRefusal, AppErrorCode>;

/** A decision that cannot be taken. */
const refused = (reason: DecisionRefusal, message: string) =>
  new AppError(DECISION_CODE[reason], message, reason);

/** Whether `err` is a refused decision; its `reason` then says which. */
export const isDecisionRefusal = (err: unknown): err is AppError & { reason: DecisionRefusal } =>
  err instanceof AppError &&
  err.reason !== undefined &&
  Object.hasOwn(DECISION_CODE, err.reason) &&
  DECISION_CODE[err.reason as DecisionRefusal] === err.code;

type Decision = { id: string; user: User; decision: 'approve' | 'reject'; note?: string | null };

/** What a decision's transaction leaves: a refusal to throw after commit, or the row as now known. */
interface Outcome {
  row: RequestRow;
  refusal: AppError | undefined;
  /** Set when the decision leaves the row exactly as known here: its view needs no second read. */
  settled?: { row: RequestRow; approvers: string[] };
  /** The user had already decided so: nothing new is recorded unless it completes the count. */
  repeat?: true;
}

/**
 * A chair approves or rejects a pending request. The row is locked for the whole decision; the same
 * user submitting the same decision again changes nothing and records nothing. Approval issues an
 * approval_id once the tool's required number of distinct chairs have approved.
 */
export async function decide(deps: ApprovalDeps, opts: Decision): Promise<ApprovalView> {
  const note = opts.note?.trim() || null;
  if (!opts.user.roles.includes('chair')) {
    throw refused('not_chair', `${opts.user.name} does not hold the chair role`);
  }
  if (opts.decision === 'reject' && !note) throw refused('note_required', 'a rejection needs a note');
  if (!isUuid(opts.id)) throw refused('not_found', `no approval request ${opts.id}`);
  if (opts.decision === 'approve') {
    const done = await approveAtOnce(deps, opts, note);
    if (done) {
      deps.onQueued?.();
      return done;
    }
  }

  // Row lock first, the chain's lock (appendIn) last; a deadlock or serialization failure rolls the
  // whole decision back, audit row included, and it is taken again from the start.
  const outcome = await retryingTransaction<Outcome>(deps.knex, async (trx) => {
    const row = await requests.loadRow(trx, { id: opts.id }, true);
    if (!row) throw refused('not_found', `no approval request ${opts.id}`);
    const early = await refusalOrRepeat(deps, trx, row, opts);
    const now = new Date().toISOString();
    // A repeated approval of a request still pending counts again what it has: one left short of a
    // count that was met (approvals kept by a reopened request) is approved now, and the answer says so.
    if (
      early?.repeat &&
      opts.decision === 'approve' &&
      row.status === 'pending' &&
      new Date(row.expires_at) > new Date()
    ) {
      return approve({ deps, trx, row, user: opts.user, now, note, repeat: true });
    }
    if (early) return early;

    await decisions.insertDecision(trx, {
      id: randomUUID(),
      approval_request_id: row.id,
      user_name: opts.user.name,
      decision: opts.decision,
      note,
      created_at: now,
    });
    const step = { deps, trx, row, user: opts.user, now, note };
    return opts.decision === 'reject' ? reject(step) : approve(step);
  });
  if (outcome.refusal) throw outcome.refusal;
  deps.onQueued?.();
  // The transaction path does not read whether a task follows: the runner looks (one statement).
  if (outcome.settled?.row.status === 'approved') deps.onTaskApproved?.();
  if (outcome.settled) {
    return toView(outcome.settled.row, outcome.settled.approvers, deps.reviewUrl(outcome.settled.row.id));
  }
  return viewOf(deps, deps.knex, (await requests.loadRow(deps.knex, { id: outcome.row.id }))!);
}

/**
 * Whatever stops this user deciding this (locked) row now: a repeat of their own decision (nothing
 * to do), an expiry (committed, then refused), or a refusal thrown at once.
 */
async function refusalOrRepeat(
  deps: ApprovalDeps,
  trx: Transaction,
  row: NamedRequestRow,
  opts: Decision,
): Promise<Outcome | undefined> {
  const mine = await decisions.decisionBy(trx, row.id, opts.user.name);
  if (mine) {
    if (mine.decision === opts.decision) return { row, refusal: undefined, repeat: true };
    throw refused('already_decided', `${opts.user.name} already decided: ${mine.decision}`);
  }
  if (row.status === 'pending' && new Date(row.expires_at) <= new Date()) {
    await expireRows(deps, trx, [row]);
    return { row, refusal: refused('expired', 'this request has expired') };
  }
  if (row.status !== 'pending') throw refused('not_pending', `this request is ${row.status}`);

  const agent = (await agentById(trx, row.agent_id))!;
  const roots = await deps.roots();
  // The owner rule holds to the agent's record as this server sealed it: an owner changed by SQL (so that
  // the owner may decide, or a chair named owner be kept out) is refused, never taken as it reads.
  if (!agentSealed(roots, agent)) throw tamperedRecord('agent', agent.name);
  // The owner is a person, compared by user id; an owner name that names no user lets nobody through.
  if (agent.owner_id !== null && agent.owner_id === opts.user.id) {
    throw refused(
      'owner_of_agent',
      `${opts.user.name} owns agent ${agent.name} and cannot decide its requests`,
    );
  }
  if (agent.owner_unresolved !== null) {
    throw refused(
      'owner_unresolved',
      `agent ${agent.name}'s owner "${agent.owner_unresolved}" names no user: set its owner first`,
    );
  }
  const restriction = restrictionOf(row);
  if (restriction && (await eligibleApprovers(trx, restriction, [opts.user.name], roots)).length === 0) {
    throw refused(
      'not_eligible',
      `${opts.user.name} is not among those approval rule "${row.policy_rule}" asks for (${whoMayApprove(restriction)})`,
    );
  }
  return undefined;
}

/** The facts every decision row repeats; `details` (given) with the agent's name. */
const decisionFacts = (row: NamedRequestRow, user: User, details: Record<string, unknown> = {}) => ({
  actor: user.name,
  agent_id: row.agent_id,
  tool: row.tool,
  source: row.source,
  target_type: row.target_type,
  target_ref: row.target_id,
  approval_request_id: row.id,
  content_sha256: row.content_sha256,
  file_sha256: row.file_sha256,
  result: 'ok' as const,
  details: { ...details, agent_name: row.agent_name },
});

/** A decision being recorded: on this locked row, by this user, in this transaction. */
interface Recording {
  deps: ApprovalDeps;
  trx: Transaction;
  row: NamedRequestRow;
  user: User;
  now: string;
  note: string | null;
  /** A repeat of this user's approval: recorded only when it completes the count. */
  repeat?: true;
}

async function reject({ deps, trx, row, user, now, note }: Recording): Promise<Outcome> {
  const decision = { approvers: [], decided_by: user.name };
  await requests.changeRequest(
    trx,
    row.id,
    undefined,
    { status: 'rejected', decided_at: now, note },
    deliveriesFor(deps, 'decided', { ...row, status: 'rejected', note }, decision),
  );
  await deps.audit.appendIn(trx, {
    ...decisionFacts(row, user),
    kind: 'approval.rejected',
    approvers: [user.name],
  });
  return { row, refusal: undefined };
}

/**
 * The common approval in one read and one statement: a pending, unexpired request this user has not
 * decided and whose agent they do not own gets the decision, the status change when it is the last
 * approval needed, and the approval.approved row together. Anything else — or anyone else deciding
 * or appending meanwhile — leaves it to the locking transaction, which says what is true. Relies on
 * every change to a request or its decisions appending an audit row in its transaction (see
 * AuditLog.appendWith): what was read here is still true when the statement commits. The statement
 * locks the request row before the chain's lock, as the transaction does; and the decision row is
 * inserted only with the change that its audit row records, never alone.
 */
async function approveAtOnce(deps: ApprovalDeps, opts: Decision, note: string | null) {
  const raw = await requests.readToDecide(deps.knex, opts.id, opts.user.name);
  if (!raw || raw.mine === true || raw.agent_owner_id === opts.user.id || raw.agent_owner_unresolved !== null)
    return;
  const row = namedRequestFromDb(raw);
  const now = new Date();
  if (row.status !== 'pending' || new Date(row.expires_at) <= now) return;
  // A rule that names who may approve: the locking transaction checks the chair and counts the approvals.
  if (restrictionOf(row)) return;

  const before = approversColumn(raw);
  const approvers = [...before, opts.user.name];
  const decision = {
    id: randomUUID(),
    approval_request_id: row.id,
    user_name: opts.user.name,
    decision: 'approve' as const,
    note,
    created_at: now.toISOString(),
  };
  const final = approvers.length >= row.required_approvers;
  const change = final
    ? await sealed(deps, row, approvers, {
        status: 'approved' as const,
        approval_id: randomUUID(),
        decided_at: now.toISOString(),
        note,
        expires_at: new Date(now.getTime() + deps.config.approval.execute_ttl_s * 1000).toISOString(),
      })
    : undefined;
  const step = requests.decisionChange(row.id, before.length, decision, change);
  const notices = change
    ? deliveriesFor(deps, 'decided', { ...row, ...change }, { approvers, decided_by: opts.user.name })
    : [];
  const statement = { ...withQueued(step, notices), lockFirst: lockingRow('approval_requests', row.id) };
  const done = await deps.audit.appendWith(statement, {
    ...decisionFacts(row, opts.user, {
      final,
      approvals: approvers.length,
      required: row.required_approvers,
    }),
    kind: 'approval.approved',
    approval_id: change?.approval_id ?? null,
    approvers,
  });
  if (!done) return;
  if (change && raw.has_task === true) deps.onTaskApproved?.();
  return toView({ ...row, ...change }, approvers, deps.reviewUrl(row.id));
}

/** One more approval; the last one required issues the approval_id, valid for approval.execute_ttl_s. */
async function approve({ deps, trx, row, user, now, note, repeat }: Recording): Promise<Outcome> {
  const approvers = await decisions.approversOf(trx, row.id);
  // Under a rule that names who may approve, only approvals by those it names count (a request sent back
  // to pending under such a rule keeps the approvals given before, and may not count them all).
  const restriction = restrictionOf(row);
  const counted = restriction
    ? await eligibleApprovers(trx, restriction, approvers, await deps.roots())
    : approvers;
  const tally = { approvals: counted.length, required: row.required_approvers };
  if (counted.length < row.required_approvers) {
    if (repeat) return { row, refusal: undefined };
    await deps.audit.appendIn(trx, {
      ...decisionFacts(row, user, { final: false, ...tally }),
      kind: 'approval.approved',
      approvers,
    });
    return { row, refusal: undefined, settled: { row, approvers } };
  }
  const change = await sealed(deps, row, approvers, {
    status: 'approved' as const,
    approval_id: randomUUID(),
    decided_at: now,
    note,
    expires_at: new Date(Date.now() + deps.config.approval.execute_ttl_s * 1000).toISOString(),
  });
  const decision = { approvers, decided_by: user.name };
  await requests.changeRequest(
    trx,
    row.id,
    undefined,
    change,
    deliveriesFor(deps, 'decided', { ...row, ...change }, decision),
  );
  await deps.audit.appendIn(trx, {
    ...decisionFacts(row, user, { final: true, ...tally, ...(repeat ? { repeated: true } : {}) }),
    kind: 'approval.approved',
    approval_id: change.approval_id,
    approvers,
  });
  return { row, refusal: undefined, settled: { row: { ...row, ...change }, approvers } };
}

/** The change that approves `row`, with the MAC of its decision (seal.ts). */
async function sealed<C extends { approval_id: string; expires_at: string }>(
  deps: ApprovalDeps,
  row: RequestRow,
  approvers: readonly string[],
  change: C,
): Promise<C & { decision_mac: string }> {
  const decided = { approval_id: change.approval_id, approvers, expires_at: change.expires_at };
  return { ...change, decision_mac: sealDecision(await deps.roots(), row, decided) };
}
