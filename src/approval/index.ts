/**
 * The approval module's front door: the only file of approval/ that modules outside it import
 * (.dependency-cruiser.cjs holds every floor to it). Requests, decisions, the write gate, the
 * outbox's notices and the views of a request.
 */
export { DECISION_CODE, isDecisionRefusal, type DecisionRefusal } from './decide.ts';
export { runWrite, type PreparedWrite, type WriteResult } from './gate.ts';
export { WRITE_FENCE } from './store/fence.ts';
export { noticeWarnings, reviewShowsEverything, showsEverything, targetLine, type Notice } from './outbox.ts';
export { claimDueNotices, requestedNoticeWaiting, settleNotice } from './store/index.ts';
export { ApprovalSummary, ApprovalView, Preflight, Target } from './view.ts';
export { createApprovals, type Approvals, type SeamApprovals } from './approvals.ts';
export { describeRequirement, type RuleSummary } from './eligible.ts';
export {
  compilePolicy,
  createPatternPool,
  PolicyDoc,
  requirementOf,
  sealUnsealedPolicy,
  type CompiledPolicy,
  type Decision,
  type PatternRunner,
} from './rules/index.ts';
export {
  TASK_FAILED,
  TASK_POLL_INTERVAL_MS,
  type CancelOutcome,
  type ClaimedTask,
  type TaskError,
  type TaskView,
} from './tasks.ts';
