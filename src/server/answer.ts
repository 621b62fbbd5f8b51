import { ProtocolError } from '@modelcontextprotocol/server';
import type { AppError } from '../core/errors.ts';

/*
 * What an agent is told after a failure the call cannot record (the database gone), decided in one
 * place from how far the call's write got — what is committed — and never from the failure's code:
 *
 *   nothing started           SOURCE_UNAVAILABLE: nothing was done, retry shortly
 *   write.started committed   OUTCOME_UNKNOWN with where to learn it (get_approval, the task)
 *   write.succeeded/.failed   OUTCOME_RECORDED with the outcome (status, and the failure's code)
 *
 * The call seam (server/call.ts) answers its outages and held commits with it, the HTTP layer its
 * failures before a call began, and the task runner asks it whether a failed call may be run again.
 */

/** JSON-RPC code of a call that could not be audited because the database is unavailable. */
export const DATABASE_UNAVAILABLE = -32003;

/** How far a call's write got, as committed: filled in by the approval gate while the call runs. */
export interface WriteProgress {
  /** write.started committed: the approval is spent and the write may be made. */
  started?: { approval_id: string; approval_request_id: string };
  /** Its outcome committed (write.succeeded, write.failed), with the failure's code when it failed. */
  finished?: { status: 'succeeded' | 'failed'; error_code?: string };
}

/** The recorder the gate is handed (GateContext.progress) and the seam reads. */
export function createProgress(): WriteProgress & {
  start(approval_id: string, approval_request_id: string): void;
  finish(status: 'succeeded' | 'failed', error_code?: string): void;
} {
  const progress: WriteProgress & {
    start(approval_id: string, approval_request_id: string): void;
    finish(status: 'succeeded' | 'failed', error_code?: string): void;
  } = {
    start(approval_id, approval_request_id) {
      progress.started = { approval_id, approval_request_id };
    },
    finish(status, error_code) {
      progress.finished = error_code === undefined ? { status } : { status, error_code };
    },
  };
  return progress;
}

/** Which of the three answers a call's progress calls for. */
export type Stage = 'not_started' | 'started' | 'finished';

export const stageOf = (progress: WriteProgress | undefined): Stage =>
  progress?.finished && progress.started ? 'finished' : progress?.started ? 'started' : 'not_started';

/** The answer to a call the database went away from, by its write's progress. */
export function outageAnswer(
  progress: WriteProgress | undefined,
  trace_id: string,
  getApprovalTool: string,
  failure?: AppError,
): ProtocolError {
  const stage = stageOf(progress);
  if (stage === 'not_started') return nothingDone(trace_id);
  const { approval_id, approval_request_id } = progress!.started!;
  const where = {
    approval_id,
    approval_request_id,
    next_step: { tool: getApprovalTool, arguments: { approval_id } },
    trace_id,
  };
  if (stage === 'started') {
    return new ProtocolError(
      DATABASE_UNAVAILABLE,
      'The database is unavailable: this write started and whether it was made is not known yet; ' +
        `do not repeat it, check its outcome with ${getApprovalTool}`,
      { code: 'OUTCOME_UNKNOWN', reason: failure?.reason ?? 'database_unavailable', ...where },
    );
  }
  const { status, error_code } = progress!.finished!;
  return new ProtocolError(
    DATABASE_UNAVAILABLE,
    `The database became unavailable after this write's outcome was recorded: it ${status}` +
      `${error_code ? ` (${error_code})` : ''}; this call's own audit row could not be written. ` +
      `Do not repeat it; ${getApprovalTool} shows the outcome`,
    {
      code: 'OUTCOME_RECORDED',
      reason: 'call_unaudited',
      status,
      ...(error_code ? { error_code } : {}),
      ...where,
    },
  );
}

/** Nothing was started: the call may be retried. */
export const nothingDone = (trace_id: string) =>
  new ProtocolError(
    DATABASE_UNAVAILABLE,
    'The database is unavailable: the call was not completed; retry shortly',
    { code: 'SOURCE_UNAVAILABLE', reason: 'database_unavailable', retry_after_s: 1, trace_id },
  );

/** The HTTP problem for a request the database failed before any call began: nothing was done. */
export const nothingDoneProblem = {
  code: 'SOURCE_UNAVAILABLE',
  reason: 'database_unavailable',
  title: 'Service unavailable',
  detail: 'the database is unavailable; nothing was done; retry shortly',
} as const;

/**
 * Whether a call answered with this protocol error may be made again as it was: only when nothing had
 * started. An answer of any other stage (or any other error) is not a retry's to settle.
 */
export const retryable = (err: unknown): boolean =>
  err instanceof ProtocolError &&
  err.code === DATABASE_UNAVAILABLE &&
  (err.data as { code?: string } | undefined)?.code === 'SOURCE_UNAVAILABLE';

/** The metrics code an answer of this stage is counted under. */
export const stageCode = (stage: Stage) =>
  stage === 'not_started'
    ? 'SOURCE_UNAVAILABLE'
    : stage === 'started'
      ? 'OUTCOME_UNKNOWN'
      : 'OUTCOME_RECORDED';
