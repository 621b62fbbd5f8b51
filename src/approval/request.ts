import { randomUUID } from 'node:crypto';
import { sealDecision } from './seal.ts';
import type { Agent } from '../core/identity.ts';
import { refuseOtherContent } from './execute.ts';
import { expireRows, viewOf, viewsOf, type ApprovalDeps } from './deps.ts';
import type { ApprovalStatus } from '../core/schemas.ts';
import { asksOf, requestFromDb, toView, type ApprovalView, type Target } from './view.ts';
import { isUuid } from '../core/ids.ts';
import { retryingTransaction } from '../db/retry.ts';
import { approversColumn, keys, requests, withQueued } from './store/index.ts';
import { deliveriesFor } from './outbox.ts';
import { bindingOf, policyDenied, ruleOn, type DraftFacts } from './ruling.ts';
import type { Decision } from './rules/index.ts';

export interface DraftWrite {
  agent: Agent;
  /** Unprefixed tool name, e.g. send_message. */
  tool: string;
  /** The connector the write resolved to (local, bridge, mcp:<name>): bound by the approval. */
  source: string;
  target: Target;
  content_sha256: string;
  file_sha256: string | null;
  /** The exact content the chair will review. */
  review: Record<string, unknown>;
  request_id: string;
  trace_id: string;
  /** The key the agent will execute with, if it gave one: a key already spent on other content is refused now. */
  idempotency_key?: string;
  /** What the approval rules look at (docs/policy.md). */
  facts: DraftFacts;
}

/** A dry run naming an idempotency_key already spent on other content is refused now, not at execution. */
async function refuseSpentKey(deps: ApprovalDeps, draft: DraftWrite): Promise<void> {
  if (!draft.idempotency_key) return;
  const prior = await keys.keyOf(deps.knex, draft.agent.id, draft.idempotency_key);
  if (prior) refuseOtherContent(prior, draft);
}

/** A new pending request for `draft`, as its row, bound to the policy's decision on it. */
function newRequest(deps: ApprovalDeps, draft: DraftWrite, decision: Decision, now: Date) {
  return {
    id: randomUUID(),
    agent_id: draft.agent.id,
    tool: draft.tool,
    source: draft.source,
    target_type: draft.target.target_type,
    target_id: draft.target.target_id,
    target_display: draft.target.display_name,
    content_sha256: draft.content_sha256,
    file_sha256: draft.file_sha256,
    status: 'pending' as ApprovalStatus,
    ...bindingOf(decision),
    created_at: now.toISOString(),
    expires_at: new Date(now.getTime() + deps.config.approval.pending_ttl_s * 1000).toISOString(),
  };
}
type NewRequest = ReturnType<typeof newRequest>;

/** The row as a knex insert takes it: jsonb columns as JSON text. */
const insertable = (created: NewRequest, review: Record<string, unknown>) => ({
  ...created,
  review: JSON.stringify(review),
  policy_requirement: created.policy_requirement && JSON.stringify(created.policy_requirement),
});

const requestedRow = (draft: DraftWrite, id: string) => ({
  kind: 'approval.requested' as const,
  request_id: draft.request_id,
  trace_id: draft.trace_id,
  agent_id: draft.agent.id,
  tool: draft.tool,
  source: draft.source,
  target_type: draft.target.target_type,
  target_ref: draft.target.target_id,
  approval_request_id: id,
  dry_run: true,
  content_sha256: draft.content_sha256,
  file_sha256: draft.file_sha256,
  result: 'ok' as const,
  details: { agent_name: draft.agent.name },
});

/** A drafted write's request, whether this draft made it, and who must approve it (asksOf). */
export interface Requested {
  view: ApprovalView;
  created: boolean;
  /** Absent for a request a rule let through without review (already approved). */
  asks?: string;
}

/**
 * Creates the approval request for a drafted write — or returns the agent's open request (pending or
 * approved, not yet executed) for the same content. The partial unique index settles races. The
 * common case, new content, is one statement: the request and its approval.requested row together.
 */
export async function requestApproval(deps: ApprovalDeps, draft: DraftWrite): Promise<Requested> {
  await refuseSpentKey(deps, draft);
  const now = new Date();
  const decision = await ruleOn(deps.knex, await deps.rules.current(), draft, now);
  if (decision.requirement.kind === 'deny')
    throw policyDenied({ ...decision, requirement: decision.requirement });
  const created = newRequest(deps, draft, decision, now);
  if (decision.requirement.kind === 'allow_without_review')
    return allowWithoutReview(deps, draft, created, decision.requirement.reason);
  const row = { ...created, review: draft.review };
  const done = await deps.audit.appendWith(
    withQueued(requests.newRequestChange(row), noticesOf(deps, draft, created)),
    requestedRow(draft, created.id),
  );
  if (done) return { view: announce(deps, draft, created), created: true, asks: asksOf(created) };
  return requestInTransaction(deps, draft, created);
}

/** The notices a new request queues with itself (none when no channel is configured). */
const noticesOf = (deps: ApprovalDeps, draft: DraftWrite, created: NewRequest) =>
  deliveriesFor(deps, 'requested', { ...created, status: 'pending', review: draft.review, note: null });

/** The request as just written, with no decision yet (no second read); the deliverer is woken. */
function announce(
  deps: ApprovalDeps,
  draft: DraftWrite,
  created: NewRequest,
  decided: { approval_id: string; note: string; decided_at: string } | undefined = undefined,
): ApprovalView {
  const view = toView(
    requestFromDb({
      approval_id: null,
      note: null,
      decided_at: null,
      ...created,
      ...decided,
      review: draft.review,
      execution_started_at: null,
      execution_finished_at: null,
      execution_result: null,
      execution_error: null,
      execution_source: null,
    }),
    [],
    deps.reviewUrl(created.id),
  );
  deps.onQueued?.();
  return view;
}

/**
 * A write a rule lets through without review: recorded approved at once by `policy:<rule>` under this
 * policy version (approval.requested, then approval.approved naming the rule), never silently. The
 * agent's open request for the same content, if it has one, is the answer instead.
 */
async function allowWithoutReview(
  deps: ApprovalDeps,
  draft: DraftWrite,
  pending: NewRequest,
  reason: string,
): Promise<Requested> {
  const expires = new Date(Date.parse(pending.created_at) + deps.config.approval.execute_ttl_s * 1000);
  const created = { ...pending, status: 'approved' as const, expires_at: expires.toISOString() };
  const approval_id = randomUUID();
  const decision_mac = sealDecision(
    await deps.roots(),
    { ...created, agent_id: draft.agent.id },
    {
      approval_id,
      approvers: [],
      expires_at: created.expires_at,
    },
  );
  const decided = { approval_id, note: reason, decided_at: pending.created_at, decision_mac };
  const actor = `policy:${pending.policy_rule}`;
  try {
    await retryingTransaction(deps.knex, async (trx) => {
      await requests.insertRequest(trx, { ...insertable(created, draft.review), ...decided });
      await deps.audit.appendIn(trx, requestedRow(draft, created.id), {
        ...requestedRow(draft, created.id),
        kind: 'approval.approved',
        actor,
        approval_id: decided.approval_id,
        approvers: [],
        details: {
          agent_name: draft.agent.name,
          rule: pending.policy_rule,
          reason,
          policy_version: pending.policy_version,
          final: true,
        },
      });
    });
  } catch (err) {
    const open = await openRequest(deps, draft);
    if (open)
      return {
        view: await viewOf(deps, deps.knex, open.request),
        created: false,
        asks: asksOf(open.request),
      };
    throw err;
  }
  return { view: announce(deps, draft, created, decided), created: true };
}

/** The agent's open request (pending or approved, not yet executed) for the draft's content. */
async function openRequest(deps: ApprovalDeps, draft: DraftWrite) {
  const row = await requests.openRequestOf(deps.knex, draft.agent.id, draft.content_sha256);
  if (!row) return undefined;
  const voided =
    row.approver_disabled === true
      ? 'approver_disabled'
      : row.approver_not_eligible === true
        ? 'approver_not_eligible'
        : undefined;
  return { request: requestFromDb(row), voided };
}

/** The general path: the open request if there is one, else a new one (expiring a stale open one). */
async function requestInTransaction(
  deps: ApprovalDeps,
  draft: DraftWrite,
  created: NewRequest,
): Promise<Requested> {
  const existing = () => openRequest(deps, draft);
  const found = await existing();
  if (found && !found.voided && new Date(found.request.expires_at) > new Date())
    return {
      view: await viewOf(deps, deps.knex, found.request),
      created: false,
      asks: asksOf(found.request),
    };
  try {
    await retryingTransaction(deps.knex, async (trx) => {
      // Past its expiry but not yet swept, or approved by a user disabled since (it can never execute):
      // expire it so a fresh request can take its place. It is this agent's own request, so its name
      // is the draft's.
      if (found) {
        const why = found.voided ? { reason: found.voided } : {};
        await expireRows(deps, trx, [{ ...found.request, agent_name: draft.agent.name }], why);
      }
      await requests.insertRequest(trx, insertable(created, draft.review), noticesOf(deps, draft, created));
      await deps.audit.appendIn(trx, requestedRow(draft, created.id));
    });
  } catch (err) {
    // Lost a race with the same agent drafting the same content: answer with the winner's request.
    const winner = await existing();
    if (winner)
      return {
        view: await viewOf(deps, deps.knex, winner.request),
        created: false,
        asks: asksOf(winner.request),
      };
    throw err;
  }
  return { view: announce(deps, draft, created), created: true, asks: asksOf(created) };
}

/** One of the agent's own requests, by request id or approval id; another agent's is not found. */
export async function getOwnApproval(
  deps: ApprovalDeps,
  agentId: string,
  by: { approval_request_id?: string; approval_id?: string },
): Promise<ApprovalView | undefined> {
  if (!isUuid(by.approval_request_id) && !isUuid(by.approval_id)) return undefined;
  const raw = await requests.ownRequest(deps.knex, agentId, by);
  return raw ? toView(requestFromDb(raw), approversColumn(raw), deps.reviewUrl(String(raw.id))) : undefined;
}

/** The agent's own requests, newest first, keyset-paged on (created_at, id). */
export async function listOwnApprovals(
  deps: ApprovalDeps,
  agentId: string,
  opts: { status?: ApprovalStatus; limit: number; after?: { t: string; id: string } },
): Promise<{ items: ApprovalView[]; next: { t: string; id: string } | null }> {
  const rows = (await requests.ownRequests(deps.knex, agentId, opts)).map(requestFromDb);
  const page = rows.slice(0, opts.limit);
  const items = await viewsOf(deps, deps.knex, page);
  const last = page.at(-1);
  return { items, next: rows.length > opts.limit && last ? { t: last.created_at, id: last.id } : null };
}
