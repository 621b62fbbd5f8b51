import type { Queryable, Transaction } from '../db/knex.ts';
import { userNameOf } from '../accounts/index.ts';
import { AppError } from '../core/errors.ts';
import type { Agent } from '../core/identity.ts';
import { randomUUID } from 'node:crypto';
import { expireRows, requestFacts, type ApprovalDeps } from './deps.ts';
import { decisions, requests } from './store/index.ts';
import { eligibleApprovers, restrictionOf } from './eligible.ts';
import { sealDecision } from './seal.ts';
import {
  asksMore,
  type CompiledPolicy,
  type Decision,
  type Requirement,
  type WriteFacts,
} from './rules/index.ts';
import type { NamedRequestRow, RequestRow } from './view.ts';

/** What the gate knows of a write for the approval rules; the agent and tool come with the draft. */
export type DraftFacts = Omit<WriteFacts, 'agent' | 'tool'>;

/**
 * The policy's decision on one write, at `at`. A policy without rules decides from the tool alone, with
 * nothing read; otherwise the agent's owner is looked up by name, in `q`, for `agent.owner`.
 */
export async function ruleOn(
  q: Queryable,
  policy: CompiledPolicy,
  write: { agent: Pick<Agent, 'name' | 'owner_id'>; tool: string; facts: DraftFacts },
  at: Date,
): Promise<Decision> {
  if (policy.doc.rules.length === 0) return policy.defaultFor(write.tool);
  const owner = write.agent.owner_id ? ((await userNameOf(q, write.agent.owner_id)) ?? null) : null;
  return policy.decide({ ...write.facts, tool: write.tool, agent: { name: write.agent.name, owner } }, at);
}

/** A write a rule refuses: PERMISSION_DENIED, reason policy_denied, the rule and its reason in details. */
export const policyDenied = (decision: Decision & { requirement: { kind: 'deny' } }) =>
  new AppError(
    'PERMISSION_DENIED',
    `approval rule "${decision.rule}" refuses this write: ${decision.requirement.reason}`,
    'policy_denied',
    {
      details: { rule: decision.rule, reason: decision.requirement.reason, policy_version: decision.version },
    },
  );

/** What a request records of the decision: the approvers it needs, the rule and what it asked. */
export function bindingOf(decision: Decision & { requirement: Requirement }) {
  const { requirement } = decision;
  return {
    required_approvers: requirement.kind === 'require' ? requirement.approvers : 0,
    policy_version: decision.version,
    policy_rule: decision.rule,
    policy_requirement: decision.rule === null ? null : requirement,
  };
}

/** A policy's decision on an approved request that asks more than the one it was approved under. */
export interface PolicyChange {
  decision: Decision;
}

/** The requirement a request was approved under: its rule's, or the per-tool default it recorded. */
const requirementOf = (row: RequestRow): Requirement =>
  (row.policy_requirement as Requirement | null) ?? { kind: 'require', approvers: row.required_approvers };

/**
 * Whether the policy in force asks more of this approved request than the policy it was approved under:
 * decided again on the same content, at the time it was drafted. Undefined when the version is the same
 * or the new decision asks the same or less (the approval then executes). The stored policy is read
 * again, in `q`, unless `policy` (this replica's copy) is given and is the request's version.
 */
export async function policyChange(
  deps: ApprovalDeps,
  q: Queryable,
  policy: CompiledPolicy | undefined,
  row: NamedRequestRow,
  req: { agent: Agent; tool: string; facts?: DraftFacts },
): Promise<PolicyChange | undefined> {
  if (policy && row.policy_version === policy.version) return undefined;
  const current = await deps.rules.fresh(q);
  if (row.policy_version === current.version) return undefined;
  const decision = req.facts
    ? await ruleOn(
        q,
        current,
        { agent: req.agent, tool: req.tool, facts: req.facts },
        new Date(row.created_at),
      )
    : current.defaultFor(req.tool);
  if (req.facts && !asksMore(decision.requirement, requirementOf(row))) return undefined;
  return { decision };
}

/**
 * The refusal of an execution under a policy that asks more (APPROVAL_REQUIRED, policy_changed); with
 * what the request became (`reopened`), when the approvals it kept approved it again at once: then its
 * new approval_id, to run it with.
 */
export const policyChanged = (row: RequestRow, change: PolicyChange, reopened?: Reopened) =>
  new AppError(
    'APPROVAL_REQUIRED',
    change.decision.requirement.kind === 'deny'
      ? `the approval policy changed since this was approved, and approval rule "${change.decision.rule}" now refuses this write`
      : reopened?.status === 'approved'
        ? 'the approval policy changed since this was approved; the approvals it keeps meet the new policy, so it is approved again under a new approval_id: run it with that'
        : 'the approval policy changed since this was approved and now asks more: the request waits for approval again',
    'policy_changed',
    {
      details: {
        approval_request_id: row.id,
        policy_version_before: row.policy_version,
        policy_version: change.decision.version,
        rule: change.decision.rule,
        ...(reopened ? { status: reopened.status } : {}),
        ...(reopened?.status === 'approved' ? { approval_id: reopened.approval_id } : {}),
      },
    },
  );

/** What a reopened request became: pending again, approved at once by the approvals it kept, or expired. */
export type Reopened =
  { status: 'pending' } | { status: 'approved'; approval_id: string } | { status: 'expired' };

/**
 * Inside `trx`, on the locked request: back to pending under the new decision (its approval_id void, the
 * approvals given so far kept), or expired when a rule now refuses the write; each with its audit row.
 * The approvals it keeps are counted again at once under the new rule, in the same transaction: when
 * they meet it, the request is approved again with a new approval_id (approval.approved, `reevaluated`),
 * so that no request is left waiting for approvals it already has.
 */
export async function reopen(
  deps: ApprovalDeps,
  trx: Transaction,
  row: NamedRequestRow,
  change: PolicyChange,
): Promise<Reopened> {
  const { decision } = change;
  const why = { reason: 'policy_changed', policy_version_before: row.policy_version, rule: decision.rule };
  if (decision.requirement.kind === 'deny') {
    await expireRows(deps, trx, [row], { ...why, policy_version: decision.version });
    return { status: 'expired' };
  }
  const binding = bindingOf(decision);
  const expires_at = new Date(Date.now() + deps.config.approval.pending_ttl_s * 1000).toISOString();
  await requests.changeRequest(trx, row.id, ['approved'], {
    status: 'pending',
    approval_id: null,
    decided_at: null,
    expires_at,
    ...binding,
    policy_requirement: binding.policy_requirement && JSON.stringify(binding.policy_requirement),
  });
  await deps.audit.appendIn(trx, {
    kind: 'approval.reopened',
    ...requestFacts(row, { ...why, policy_version: decision.version, required: binding.required_approvers }),
  });
  return approveIfCounted(deps, trx, { ...row, ...binding, status: 'pending', approval_id: null });
}

/** The reopened (locked, pending) request approved at once when the approvals it kept meet its rule. */
async function approveIfCounted(
  deps: ApprovalDeps,
  trx: Transaction,
  row: NamedRequestRow,
): Promise<Reopened> {
  const approvers = await decisions.approversOf(trx, row.id);
  const restriction = restrictionOf(row);
  const counted = restriction
    ? await eligibleApprovers(trx, restriction, approvers, await deps.roots())
    : approvers;
  if (row.required_approvers <= 0 || counted.length < row.required_approvers) return { status: 'pending' };
  const now = new Date();
  const decided = {
    approval_id: randomUUID(),
    approvers,
    expires_at: new Date(now.getTime() + deps.config.approval.execute_ttl_s * 1000).toISOString(),
  };
  // Sealed like a chair's decision (seal.ts): execution refuses an approval without the host's MAC.
  const change = {
    status: 'approved' as const,
    approval_id: decided.approval_id,
    decided_at: now.toISOString(),
    expires_at: decided.expires_at,
    decision_mac: sealDecision(await deps.roots(), row, decided),
  };
  await requests.changeRequest(trx, row.id, ['pending'], change);
  await deps.audit.appendIn(trx, {
    kind: 'approval.approved',
    ...requestFacts(
      { ...row, approval_id: change.approval_id },
      {
        final: true,
        reevaluated: 'policy_changed',
        approvals: counted.length,
        required: row.required_approvers,
      },
    ),
    approvers,
    result: 'ok',
  });
  return { status: 'approved', approval_id: change.approval_id };
}

/**
 * The facts of a write as `countersign policy explain` gives it: a tool (unprefixed) and the arguments an
 * agent would call it with, nothing resolved or drafted — the target is as given (its display name is
 * its id, and it counts as external), a file is known by the name given only.
 */
export function explainFacts(tool: string, args: Record<string, unknown>): DraftFacts {
  const str = (v: unknown) => (typeof v === 'string' ? v : '');
  const split = tool.indexOf('__');
  const upstream =
    split > 0 ? { name: tool.slice(0, split), tool: tool.slice(split + 2), arguments: args } : undefined;
  const target_id = upstream ? tool : str(args.target_id);
  return {
    facet: upstream ? 'upstream_write' : 'send',
    target: {
      target_type: upstream ? 'mcp_tool' : str(args.target_type),
      target_id,
      display_name: upstream ? `${upstream.name} / ${upstream.tool}` : target_id,
    },
    text: str(args.content_text) || str(args.caption),
    file:
      args.path || args.file_id
        ? { name: str(args.file_name) || str(args.path), size: 0, type: '' }
        : undefined,
    upstream,
  };
}
