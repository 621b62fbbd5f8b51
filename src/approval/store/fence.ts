import type { WriteFence } from '../../connectors/index.ts';

/**
 * The fence every local write passes (src/connectors/local/send.ts runs it, bound to the write's key,
 * the approval_id): the approval must still be `executing`, and its row stays locked (shared) until the
 * write commits. Reconciliation locks the same row before it looks for the write (../maintenance.ts), so a
 * write it cannot see cannot land after it either: a stalled insert that outlives the call's deadline
 * keeps the row locked (and reconciliation waits), or finds the approval settled and writes nothing.
 * The approval's row is approval's: the connectors are handed the fence, they do not write it.
 */
export const WRITE_FENCE: WriteFence = {
  sql: `select 1 from approval_requests where approval_id = ?::uuid and status = 'executing' for share`,
};
