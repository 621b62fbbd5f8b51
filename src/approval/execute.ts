import type { Agent } from '../core/identity.ts';
import { AppError } from '../core/errors.ts';
import { unsealedApprovers, expireRows, requestFacts, type ApprovalDeps } from './deps.ts';
import { approversColumn, decisions, keys, requests } from './store/index.ts';
import type { z } from 'zod';
import {
  namedRequestFromDb,
  requestFromDb,
  type NamedRequestRow,
  type Preflight as PreflightView,
  type RequestRow,
  type Target,
} from './view.ts';
import { isUuid } from '../core/ids.ts';
import type { Queryable, Transaction } from '../db/knex.ts';
import { retryingTransaction, withRetries } from '../db/retry.ts';
import { policyChange, policyChanged, reopen, type DraftFacts } from './ruling.ts';
import type { HeldPolicy } from './rules/index.ts';
import { sealProblem, tamperedDecision } from './seal.ts';
import type { HostRoots } from '../core/host-roots.ts';

export type RefusalReason =
  | 'missing'
  | 'unknown'
  | 'pending'
  | 'rejected'
  | 'expired'
  | 'consumed'
  | 'mismatch'
  | 'wrong_agent'
  | 'approver_disabled'
  | 'approver_not_eligible'
  | 'policy_changed';

const MESSAGES: Record<RefusalReason, string> = {
  missing: 'a real write needs an approval_id: run it with dry_run first and have it approved',
  unknown: 'no approval with this approval_id',
  pending: 'this request is still waiting for approval',
  rejected: 'this request was rejected',
  expired: 'this approval has expired: draft the write again',
  consumed: 'this approval has already been used',
  mismatch: 'this approval was issued for another tool, source, target or content',
  wrong_agent: 'this approval was issued to another agent',
  approver_disabled: 'a user who approved this request has been disabled since: draft the write again',
  approver_not_eligible:
    'a user who approved this request is no longer one the approval rule accepts (a role or team removed): draft the write again',
  policy_changed:
    'the approval policy changed since this was approved and now asks more: the request waits for approval again',
};

export const approvalRequired = (reason: RefusalReason, detail?: string) =>
  new AppError('APPROVAL_REQUIRED', detail ? `${MESSAGES[reason]} (${detail})` : MESSAGES[reason], reason);

export interface ExecutionRequest {
  agent: Agent;
  tool: string;
  approval_id: string;
  target: Target;
  content_sha256: string;
  file_sha256: string | null;
  idempotency_key?: string;
  request_id: string;
  trace_id: string;
  /** The connector this call resolved to: bound by the approval like the target. */
  source: string;
  /**
   * What the approval rules look at, to decide again under a policy changed since the approval; without
   * it, a changed policy is taken to ask more.
   */
  facts?: DraftFacts;
  /** The task this execution runs for, when the task runner runs it. */
  task_id?: string;
}

/** What a replayed idempotency key answers: the stored outcome of the first execution. */
export type Replay = { row: NamedRequestRow };

const EXECUTED = new Set(['executing', 'succeeded', 'failed', 'unknown']);

/** A key names one write: the same key with another tool or content is refused, dry run or not. */
export function refuseOtherContent(
  prior: { tool: string; content_sha256: string },
  req: { tool: string; content_sha256: string },
): void {
  if (prior.tool !== req.tool || prior.content_sha256 !== req.content_sha256) {
    throw new AppError(
      'IDEMPOTENCY_CONFLICT',
      'this idempotency_key was already used for a different write',
      'key_reused_for_other_content',
    );
  }
}

async function checkIdempotencyKey(trx: Transaction, req: ExecutionRequest): Promise<Replay | undefined> {
  if (!req.idempotency_key) return undefined;
  const prior = await keys.keyOf(trx, req.agent.id, req.idempotency_key, { forUpdate: true });
  if (!prior) return undefined;
  refuseOtherContent(prior, req);
  return { row: (await requests.loadRow(trx, { id: prior.approval_request_id }))! };
}

/**
 * The first transaction of an execution: lock the approval, check every binding, mark it executing
 * and append write.started — all or nothing. Returns the locked row, or the stored outcome when the
 * idempotency key was seen before with the same content. Refusals that change state (expiry) commit
 * before they are thrown.
 */
export async function beginExecution(
  deps: ApprovalDeps,
  req: ExecutionRequest,
  early?: Promise<ApprovedRow>,
): Promise<{ row: ExecutingRow; replay: boolean }> {
  // Read before any transaction: inside one, PGlite's single connection is the transaction's.
  const policy = await deps.rules.current();
  if (!req.idempotency_key) {
    const row = await beginAtOnce(deps, req, policy, early);
    if (row) return { row, replay: false };
  }
  // Locks in the one order (idempotency key, approval row, then the chain's lock in appendIn); a
  // deadlock or serialization failure rolls it all back and it runs again.
  const result = await withRetries(deps.knex)
    .transaction(async (trx) => {
      const replay = await checkIdempotencyKey(trx, req);
      if (replay) return { row: replay.row, replay: true };
      const { approvers: _unread, ...row } = await lockApproval(trx, req, await deps.roots());
      const approvers = await decisions.approversOf(trx, row.id);
      if (new Date(row.expires_at) <= new Date()) {
        await expireRows(deps, trx, [row]);
        return { refusal: approvalRequired('expired') };
      }
      const mismatch = bindingMismatch(row, req);
      if (mismatch) throw mismatchError(mismatch);
      // Before anything acts on it as approved (a changed policy reopens it): a decision this server made.
      refuseUnsealed(await deps.roots(), row, approvers);
      // The policy as stored now, read under this transaction: a replica's copy may be a second old.
      const changed = await policyChange(deps, trx, undefined, row, req);
      if (changed) {
        return { refusal: policyChanged(row, changed, await reopen(deps, trx, row, changed)) };
      }
      return { row: await markExecuting(deps, trx, row, req, approvers), replay: false };
    })
    .catch((err: unknown) => {
      // Two calls racing with one new idempotency key: the loser sees the key's primary key taken.
      if ((err as { code?: string }).code === '23505' && /idempotency_keys/.test(String(err))) {
        throw new AppError(
          'IDEMPOTENCY_CONFLICT',
          'a write with this idempotency_key is in progress',
          'in_progress',
        );
      }
      throw err;
    });
  if ('refusal' in result) throw result.refusal;
  return result;
}

/**
 * The approval this approval_id names, locked, if the agent may execute it; otherwise APPROVAL_REQUIRED
 * with the reason. An approval_request_id passed as approval_id tells the agent where its request stands.
 */
async function lockApproval(
  trx: Queryable,
  req: ExecutionRequest,
  roots: HostRoots,
  lock = true,
): Promise<NamedRequestRow & { approvers?: string[] }> {
  const row = isUuid(req.approval_id) ? await loadApproval(trx, req.approval_id, lock, roots) : undefined;
  if (!row) {
    const asRequest = isUuid(req.approval_id)
      ? await requests.loadRow(trx, { id: req.approval_id, agent_id: req.agent.id })
      : undefined;
    if (asRequest?.status === 'pending') throw approvalRequired('pending');
    if (asRequest?.status === 'rejected') throw approvalRequired('rejected', asRequest.note ?? undefined);
    if (asRequest?.status === 'expired') throw approvalRequired('expired');
    throw approvalRequired('unknown');
  }
  if (row.agent_id !== req.agent.id) throw approvalRequired('wrong_agent');
  if (row.status === 'rejected') throw approvalRequired('rejected');
  if (row.status === 'expired') throw approvalRequired('expired');
  if (EXECUTED.has(row.status)) throw approvalRequired('consumed');
  const {
    approver_disabled,
    approver_not_eligible,
    started_before,
    approver_tampered,
    approvers,
    ...request
  } = row;
  if (started_before) throw reusedApproval();
  if (approver_disabled) throw approvalRequired('approver_disabled');
  // An approver whose record was changed by SQL since (roles, teams, password, identity): refused, as
  // tampering, before eligibility is read from roles the server did not give (accounts/authority.ts).
  if (approver_tampered.length > 0) throw tamperedApprover(approver_tampered);
  if (approver_not_eligible) throw approvalRequired('approver_not_eligible');
  return { ...request, approvers };
}

/**
 * The request an approval_id names, with its agent's name and whether one of its approvers is now
 * disabled, in one statement; `lock` locks the request alone (the rest are sub-selects).
 */
async function loadApproval(q: Queryable, approval_id: string, lock: boolean, roots: HostRoots) {
  // Read without a lock (a dry run's check), the approvers come with the row.
  const raw = await requests.loadApproval(q, approval_id, lock);
  if (!raw) return undefined;
  const flags = {
    approver_disabled: raw.approver_disabled === true,
    approver_not_eligible: raw.approver_not_eligible === true,
    started_before: raw.started_before === true,
    approver_tampered: unsealedApprovers(raw, roots),
  };
  return { ...namedRequestFromDb(raw), ...flags, approvers: lock ? undefined : approversColumn(raw) };
}

/** An approval one of whose approvers has a record this server did not seal as it stands. */
const tamperedApprover = (names: string[]) =>
  new AppError(
    'TAMPERED',
    `the record of ${names.map((n) => `"${n}"`).join(', ')}, who approved this, was changed in the database ` +
      'outside this server: the approval does not execute until an operator checks it (countersign user reseal NAME)',
    'approver_record_tampered',
    { details: { approvers: names } },
  );

/** An approval whose row says approved though the log holds its write.started: set back by SQL. */
const reusedApproval = () =>
  new AppError(
    'TAMPERED',
    'this approval was already used (the log holds its write.started) though its row says approved',
    'consumed',
  );

/** Refuses (TAMPERED) an approval whose decision MAC is missing or does not match (seal.ts). */
function refuseUnsealed(roots: HostRoots, row: RequestRow, approvers: readonly string[]): void {
  const problem = sealProblem(roots, row, approvers);
  if (problem) throw tamperedDecision(problem);
}

/** What a dry run given an approval_id learns: would a real run with these arguments be accepted? */
export type Preflight = z.infer<typeof PreflightView>;

/**
 * The checks a real run makes, read-only: nothing is locked, consumed or expired. A real run that
 * follows may still meet a change made in between (another chair, the expiry); it checks again.
 */
export async function preflightExecution(deps: ApprovalDeps, req: ExecutionRequest): Promise<Preflight> {
  const no = (err: AppError): Preflight => ({
    would_execute: false,
    code: err.code,
    reason: err.reason ?? null,
    message: err.message,
  });
  try {
    if (req.idempotency_key) {
      const prior = await keys.keyOf(deps.knex, req.agent.id, req.idempotency_key);
      if (prior) {
        refuseOtherContent(prior, req);
        const message = 'this idempotency_key already ran this write: a real run returns its stored outcome';
        return { would_execute: false, code: null, reason: 'replayed', message };
      }
    }
    const row = await lockApproval(deps.knex, req, await deps.roots(), false);
    if (new Date(row.expires_at) <= new Date()) return no(approvalRequired('expired'));
    const mismatch = bindingMismatch(row, req);
    if (mismatch) return no(mismatchError(mismatch));
    const unsealed = sealProblem(await deps.roots(), row, row.approvers ?? []);
    if (unsealed) return no(tamperedDecision(unsealed));
    const changed = await policyChange(deps, deps.knex, await deps.rules.current(), row, req);
    if (changed) return no(policyChanged(row, changed));
    return { would_execute: true, code: null, reason: null, message: null };
  } catch (err) {
    if (err instanceof AppError) return no(err);
    throw err;
  }
}

/** The bindings of an approval a call can break, each as the refusal's message names it. */
const BINDINGS = {
  tool: 'tool',
  source: 'source',
  target: 'target',
  target_display: "target's display name",
  content: 'content',
} as const;
type Binding = keyof typeof BINDINGS;

/** `mismatch`, naming the binding that differs in words and in `details.differs`. */
const mismatchError = (differs: Binding) =>
  new AppError(
    'APPROVAL_REQUIRED',
    `${MESSAGES.mismatch} (${BINDINGS[differs]} differs from what was approved)`,
    'mismatch',
    { details: { differs } },
  );

/**
 * Which binding of the approval this call breaks, if any: tool, where the write goes (the source, the
 * target, the target's display name as the chair saw it) or content. A request drafted before its source
 * was recorded (null) matches no source. The policy version is checked apart (policyChange): a changed
 * policy that asks no more lets the approval through.
 */
function bindingMismatch(row: RequestRow, req: ExecutionRequest): Binding | undefined {
  if (row.tool !== req.tool) return 'tool';
  if (row.source !== req.source) return 'source';
  if (row.target_type !== req.target.target_type || row.target_id !== req.target.target_id) return 'target';
  if (row.target_display !== req.target.display_name) return 'target_display';
  if (row.content_sha256 !== req.content_sha256) return 'content';
  return undefined;
}

/** Consumes the approval: status executing, the idempotency key taken, write.started appended. */
async function markExecuting(
  deps: ApprovalDeps,
  trx: Transaction,
  row: NamedRequestRow,
  req: ExecutionRequest,
  approvers: string[],
): Promise<ExecutingRow> {
  const now = new Date().toISOString();
  const updated = await requests.changeRequest(trx, row.id, ['approved'], {
    status: 'executing',
    execution_started_at: now,
    execution_source: req.source,
  });
  if (updated !== 1) throw approvalRequired('consumed');
  if (req.idempotency_key) {
    await keys.takeKey(trx, {
      agent_id: req.agent.id,
      key: req.idempotency_key,
      tool: req.tool,
      content_sha256: req.content_sha256,
      approval_request_id: row.id,
    });
  }
  await deps.audit.appendIn(trx, startedRow(row, req, approvers));
  return {
    ...row,
    status: 'executing' as const,
    execution_started_at: now,
    execution_source: req.source,
    approvers,
  };
}

/** A request as execution knows it; `approvers` when they were read with it (they no longer change). */
export type ExecutingRow = NamedRequestRow & { approvers?: string[] };

/**
 * An approval's request as the one-statement start reads it: its row, its approvers, and whether one of
 * them is now disabled.
 */
export type ApprovedRow = Record<string, unknown> | undefined;

/**
 * The request an approval_id names, read for the one-statement start, with nothing locked. A real run
 * may read it before its own checks, while the tool resolves its target (runWrite): nothing the start
 * decides rests on it alone, since its statement changes the request only while it is still approved
 * and unexpired, and its bindings never change.
 */
export async function readApproval(deps: ApprovalDeps, approval_id: string): Promise<ApprovedRow> {
  if (!isUuid(approval_id)) return undefined;
  return requests.readApproval(deps.knex, approval_id);
}

/**
 * The common execution start in one read and one statement: an approved, unexpired approval of this
 * agent whose bindings all match is marked executing with its write.started row. Anything else is
 * left to the locking transaction, which refuses with the exact reason. Calls with an idempotency key
 * always take that transaction (the key's row is checked under lock). Relies on every change to a
 * request appending an audit row in its transaction (AuditLog.appendWith).
 */
async function beginAtOnce(
  deps: ApprovalDeps,
  req: ExecutionRequest,
  policy: HeldPolicy,
  early?: Promise<ApprovedRow>,
): Promise<ExecutingRow | undefined> {
  const raw = await (early ?? readApproval(deps, req.approval_id));
  if (!raw || raw.approval_id !== req.approval_id) return undefined;
  const row = requestFromDb(raw);
  const now = new Date();
  if (row.agent_id !== req.agent.id || row.status !== 'approved' || new Date(row.expires_at) <= now) return;
  if (raw.approver_disabled === true || raw.approver_not_eligible === true || bindingMismatch(row, req))
    return undefined;
  // A decision this server did not make, or an approval already used: the transaction refuses it.
  const approvers = approversColumn(raw);
  const roots = await deps.roots();
  if (raw.started_before === true || sealProblem(roots, row, approvers)) return undefined;
  if (unsealedApprovers(raw, roots).length > 0) return undefined;
  // Bound to another policy version: the locking transaction decides whether the new one asks more.
  if (row.policy_version !== policy.version) return undefined;
  // The calling agent's own request: its name is the one the call carries.
  const named = { ...row, agent_name: req.agent.name };
  const started = {
    status: 'executing' as const,
    execution_started_at: now.toISOString(),
    execution_source: req.source,
  };
  // An approver disabled (or taken off the rule's team) since the read above is caught in the same
  // statement. So is an approval policy stored meanwhile by another replica (then the transaction decides).
  const done = await deps.audit.appendWith(
    requests.startChange(row.id, started, now.toISOString(), policy.stored),
    startedRow(named, req, approvers),
  );
  return done ? { ...named, ...started, approvers } : undefined;
}

/** What the rows of an execution run for a task add to their details. */
const taskDetails = (task_id: string | undefined) => (task_id ? { origin: 'task', task_id } : {});

const startedRow = (row: NamedRequestRow, req: ExecutionRequest, approvers: string[]) => ({
  kind: 'write.started' as const,
  ...requestFacts(row, taskDetails(req.task_id)),
  request_id: req.request_id,
  trace_id: req.trace_id,
  source: req.source,
  approvers,
  dry_run: false,
});

export type ExecutionOutcome =
  | { status: 'succeeded'; result: Record<string, unknown> }
  | { status: 'failed'; error_code: string; details?: Record<string, unknown> }
  | { status: 'unknown'; error_code: string; details?: Record<string, unknown> };

/**
 * The second transaction: record the connector's answer and append write.succeeded, write.failed or
 * write.unknown. Only an execution still marked executing is finished (reconciliation may race it).
 * An answer that arrives after reconciliation settled the execution is still recorded (lateOutcome):
 * false then says the execution was not finished here.
 */
export async function finishExecution(
  deps: ApprovalDeps,
  row: ExecutingRow,
  outcome: ExecutionOutcome,
  context: FinishContext,
): Promise<boolean> {
  if (row.approvers) {
    const finished = finishedColumns(outcome);
    const done = await deps.audit.appendWith(
      requests.finishChange(row.id, finished),
      finishedRow(row, outcome, context, row.approvers),
    );
    if (done) return true;
  }
  return retryingTransaction(deps.knex, async (trx) => {
    if (await finishIn(deps, trx, row, outcome, context)) return true;
    if (!context.reconciled) await lateOutcome(deps, trx, row, outcome, context);
    return false;
  });
}

/**
 * Inside `trx`: the execution's outcome and its audit row, if the request is still executing (the
 * update takes its row lock; appendIn takes the chain's lock after it).
 */
export async function finishIn(
  deps: ApprovalDeps,
  trx: Transaction,
  row: NamedRequestRow,
  outcome: ExecutionOutcome,
  context: FinishContext,
): Promise<boolean> {
  const updated = await requests.changeRequest(trx, row.id, ['executing'], {
    ...finishedColumns(outcome),
    execution_result: outcome.status === 'succeeded' ? JSON.stringify(outcome.result) : null,
  });
  if (updated !== 1) return false;
  const approvers = await decisions.approversOf(trx, row.id);
  await deps.audit.appendIn(trx, finishedRow(row, outcome, context, approvers));
  return true;
}

/**
 * The connector's answer, arriving after reconciliation settled the execution (the call had passed its
 * deadline): never lost. Its write.* row says `late: true` and the status it found. A write that
 * reconciliation could not settle (`unknown`) and that is now known to have succeeded becomes
 * `succeeded`; any other status stays as it is, so the request is never re-opened.
 */
async function lateOutcome(
  deps: ApprovalDeps,
  trx: Transaction,
  row: NamedRequestRow,
  outcome: ExecutionOutcome,
  context: FinishContext,
): Promise<void> {
  const now = await requests.statusOf(trx, row.id, true);
  if (!now) return;
  const resolves = now.status === 'unknown' && outcome.status === 'succeeded';
  if (resolves) {
    await requests.changeRequest(trx, row.id, ['unknown'], {
      ...finishedColumns(outcome),
      execution_result: JSON.stringify(outcome.result),
    });
  }
  const late = { late: true, status_before: now.status, status_after: resolves ? 'succeeded' : now.status };
  const audited = finishedRow(row, outcome, context, await decisions.approversOf(trx, row.id));
  await deps.audit.appendIn(trx, { ...audited, details: { ...audited.details, ...late } });
}

type FinishContext = {
  request_id?: string;
  trace_id?: string;
  source?: string;
  reconciled?: boolean;
  task_id?: string;
};

/** The request's columns once its execution has an outcome. */
const finishedColumns = (outcome: ExecutionOutcome) => ({
  status: outcome.status,
  execution_finished_at: new Date().toISOString(),
  execution_result: outcome.status === 'succeeded' ? outcome.result : null,
  execution_error: outcome.status === 'succeeded' ? null : outcome.error_code,
});

const FINISHED_KIND = {
  succeeded: 'write.succeeded',
  failed: 'write.failed',
  unknown: 'write.unknown',
} as const;

/** write.succeeded, write.failed or write.unknown for this outcome. */
function finishedRow(
  row: NamedRequestRow,
  outcome: ExecutionOutcome,
  context: FinishContext,
  approvers: string[],
) {
  return {
    kind: FINISHED_KIND[outcome.status],
    ...requestFacts(row, {
      ...(outcome.status === 'succeeded' ? outcome.result : (outcome.details ?? {})),
      ...(context.reconciled ? { reconciled: true } : {}),
      ...taskDetails(context.task_id),
    }),
    request_id: context.request_id ?? null,
    trace_id: context.trace_id ?? null,
    source: context.source ?? null,
    approvers,
    dry_run: false,
    result: outcome.status === 'succeeded' ? ('ok' as const) : ('error' as const),
    error_code: outcome.status === 'succeeded' ? null : outcome.error_code,
  };
}
