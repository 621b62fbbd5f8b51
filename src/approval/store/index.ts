/**
 * Approval's stores: every statement on the tables approval owns (approval_requests,
 * approval_decisions, idempotency_keys, approval_tasks, notification_outbox). The rule files of
 * approval/ hand these a connection or their transaction; they never build a statement themselves.
 */
export * as requests from './requests.ts';
export * as decisions from './decisions.ts';
export * as keys from './idempotency.ts';
export * as tasks from './tasks.ts';
export * as review from './review.ts';
export { claimDueNotices, requestedNoticeWaiting, settleNotice } from './outbox.ts';
export { withQueued, type Delivery } from './guarded.ts';
export { approversColumn, approverRecordsColumn } from './sql.ts';
