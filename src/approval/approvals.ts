import type { Logger } from '../log.ts';
import type { Agent, User } from '../core/identity.ts';
import { decide } from './decide.ts';
import { countByStatus, countPending, listForReview, showForReview, type QueueFilter } from './review.ts';
import type { ApprovalDeps } from './deps.ts';
import {
  beginExecution,
  finishExecution,
  preflightExecution,
  readApproval,
  type ApprovedRow,
  type ExecutionOutcome,
  type ExecutionRequest,
} from './execute.ts';
import { expireDue, purgeIdempotencyKeys, reconcileStale, type WriteLookup } from './maintenance.ts';
import { getOwnApproval, listOwnApprovals, requestApproval, type DraftWrite } from './request.ts';
import type { ApprovalStatus } from '../core/schemas.ts';
import type { NamedRequestRow } from './view.ts';
import { createPolicySource, type CompiledPolicy, type Decision } from './rules/index.ts';
import { explainFacts, ruleOn } from './ruling.ts';
import {
  cancelTask,
  claimRunnable,
  createTask,
  getTask,
  getTasks,
  listTasks,
  requestStatusOf,
  releaseTask,
  settleTask,
  nextRunnableAt,
  type NewTask,
} from './tasks.ts';

/**
 * The approval module's one face: request, read, decide, execute, expire, reconcile, the approval
 * policy and the tasks that follow requests. The config file's approval rules are compiled here: one
 * that does not compile throws (CONFIG_INVALID, naming the rule), so start-up stops.
 */
export function createApprovals(given: Omit<ApprovalDeps, 'rules'>) {
  // Who hears that a task's request was approved: the caller's hook, and the task runner (onApproved).
  const approved = new Set<() => void>();
  const deps: ApprovalDeps = {
    ...given,
    rules: createPolicySource(given.knex, given.config, given.audit, given.roots, given.patterns),
    onTaskApproved() {
      given.onTaskApproved?.();
      for (const listener of approved) listener();
    },
  };
  return {
    policy: deps.rules,
    /**
     * Which rule a policy applies to this call, what it asks; nothing drafted. The policy in force, or
     * `policy` (a file not yet applied); without an agent, the rules see `agent.name` and `agent.owner`
     * empty, as for any field a write has none of.
     */
    explain: async (
      tool: string,
      args: Record<string, unknown>,
      agent?: Agent,
      policy?: CompiledPolicy,
    ): Promise<Decision> =>
      ruleOn(
        deps.knex,
        policy ?? (await deps.rules.fresh()),
        { agent: agent ?? { name: '', owner_id: null }, tool, facts: explainFacts(tool, args) },
        new Date(),
      ),
    request: (draft: DraftWrite) => requestApproval(deps, draft),
    getOwn: (agent: Agent, by: { approval_request_id?: string; approval_id?: string }) =>
      getOwnApproval(deps, agent.id, by),
    listOwn: (
      agent: Agent,
      opts: { status?: ApprovalStatus; limit: number; after?: { t: string; id: string } },
    ) => listOwnApprovals(deps, agent.id, opts),
    decide: (opts: { id: string; user: User; decision: 'approve' | 'reject'; note?: string | null }) =>
      decide(deps, opts),
    listForReview: (filter: QueueFilter) => listForReview(deps, filter),
    countByStatus: (filter: Pick<QueueFilter, 'tool' | 'agent'>) => countByStatus(deps, filter),
    countPending: () => countPending(deps),
    showForReview: (id: string, viewer?: string) => showForReview(deps, id, viewer),
    preflight: (req: ExecutionRequest) => preflightExecution(deps, req),
    readApproval: (approval_id: string) => readApproval(deps, approval_id),
    beginExecution: (req: ExecutionRequest, early?: Promise<ApprovedRow>) => beginExecution(deps, req, early),
    finishExecution: (
      row: NamedRequestRow,
      outcome: ExecutionOutcome,
      ctx: { request_id?: string; trace_id?: string; source?: string; task_id?: string },
    ) => finishExecution(deps, row, outcome, ctx),
    expireDue: () => expireDue(deps),
    purgeIdempotencyKeys: () => purgeIdempotencyKeys(deps),
    reconcile: (lookup: WriteLookup, log: Logger) => reconcileStale(deps, lookup, log),
    /** Writes asked for as MCP tasks (tasks.ts). */
    tasks: {
      create: (draft: NewTask) => createTask(deps, draft),
      get: (agent: Agent, id: string) => getTask(deps, agent.id, id),
      getMany: (agent: Agent, ids: readonly string[]) => getTasks(deps, agent.id, ids),
      list: (agent: Agent, opts: Parameters<typeof listTasks>[2]) => listTasks(deps, agent.id, opts),
      cancel: (agent: Agent, id: string) => cancelTask(deps, agent.id, id),
      claim: (staleMs: number, limit?: number) => claimRunnable(deps, staleMs, limit),
      /** When the next round can claim a task; undefined when none waits to run. */
      nextDue: (staleMs: number) => nextRunnableAt(deps, staleMs),
      settle: (id: string, outcome: Parameters<typeof settleTask>[2]) => settleTask(deps, id, outcome),
      /** Gives up a claim on a task still working: any round may take it again. */
      release: (id: string) => releaseTask(deps, id),
      requestStatus: (approval_request_id: string) => requestStatusOf(deps, approval_request_id),
      /** Calls `listener` after each approval of a task's request committed here; returns the unsubscribe. */
      onApproved(listener: () => void): () => void {
        approved.add(listener);
        return () => approved.delete(listener);
      },
    },
  };
}

export type Approvals = ReturnType<typeof createApprovals>;

/**
 * What the call seam (server/call.ts) uses of the approvals: the gate's steps, an agent's reads of its
 * own requests, and its tasks. Never a decision: an agent cannot approve. test/twins/approvals.ts is its
 * twin in memory, held to the real one's answers by test/twins/contracts/approvals.ts.
 */
export type SeamApprovals = Pick<
  Approvals,
  'request' | 'preflight' | 'readApproval' | 'beginExecution' | 'finishExecution' | 'getOwn' | 'listOwn'
> & { tasks: Pick<Approvals['tasks'], 'create' | 'get' | 'getMany' | 'list' | 'cancel'> };
