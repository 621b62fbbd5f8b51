import { ProtocolError } from '@modelcontextprotocol/server';
import {
  ANSWERS,
  DATABASE_UNAVAILABLE,
  type Answer,
  outageAt,
  type NamedFailure,
  type Stage,
} from '../core/answers.ts';
import type { AppError } from '../core/errors.ts';
import type { Problem } from '../core/problem.ts';

/*
 * The answers of the server's transports, built from the one map from failure to answer
 * (core/answers.ts): a named failure as the JSON-RPC error that crosses the wire, or as the HTTP problem
 * of a request no MCP handler answered. After a failure the call cannot record (the database gone), what
 * the agent is told is decided from how far the call's write got — what is committed — and never from
 * the failure's code:
 *
 *   nothing started           SOURCE_UNAVAILABLE: nothing was done, retry shortly
 *   write.started committed   OUTCOME_UNKNOWN with where to learn it (get_approval, the task)
 *   write.succeeded/.failed   OUTCOME_RECORDED with the outcome (status, and the failure's code)
 *
 * The call seam (server/call.ts) answers its refusals, outages and held commits with it, the MCP server
 * (server/mcp.ts) and the HTTP layer their failures before a call began, and the task runner asks it
 * whether a failed call may be run again.
 */

export { DATABASE_UNAVAILABLE, type Stage };

/**
 * The JSON-RPC error of a named failure: its row's code, and data with the row's `code` (and `reason`
 * when it has one) first, then `data`. Throws on a failure that is never answered on the wire.
 */
export function wireError(failure: NamedFailure, message: string, data: Record<string, unknown> = {}) {
  const rpc: Answer['rpc'] = ANSWERS[failure].rpc;
  if (!rpc) throw new Error(`${failure} is not answered as a JSON-RPC error`);
  const head =
    rpc.reason === undefined ? { code: rpc.data_code } : { code: rpc.data_code, reason: rpc.reason };
  return new ProtocolError(rpc.code, message, { ...head, ...data });
}

/**
 * The HTTP problem of a named failure answered before any MCP handler began (core/problem.ts sends
 * it). Throws on a failure that is never answered so.
 */
export function problemOf(failure: NamedFailure, title: string, detail?: string): Problem {
  const http: Answer['http'] = ANSWERS[failure].http;
  if (!http) throw new Error(`${failure} is not answered as an HTTP problem`);
  return { code: http.code, reason: http.reason, title, ...(detail === undefined ? {} : { detail }) };
}

/** How far a call's write got, as committed: filled in by the approval gate while the call runs. */
export interface WriteProgress {
  /**
   * write.started committed: the approval is spent and the write may be made. `in_doubt`: the
   * database went away while the statement that commits it was out, so whether it committed is not
   * known (approval_request_id null when the request was not read yet).
   */
  started?: { approval_id: string; approval_request_id: string | null; in_doubt?: true };
  /** Its outcome committed (write.succeeded, write.failed), with the failure's code when it failed. */
  finished?: { status: 'succeeded' | 'failed'; error_code?: string };
}

/** The recorder the gate is handed (GateContext.progress) and the seam reads. */
export function createProgress(): WriteProgress & {
  start(approval_id: string, approval_request_id: string | null, inDoubt?: boolean): void;
  finish(status: 'succeeded' | 'failed', error_code?: string): void;
} {
  const progress: WriteProgress & {
    start(approval_id: string, approval_request_id: string | null, inDoubt?: boolean): void;
    finish(status: 'succeeded' | 'failed', error_code?: string): void;
  } = {
    start(approval_id, approval_request_id, inDoubt) {
      progress.started = {
        approval_id,
        approval_request_id,
        ...(inDoubt ? { in_doubt: true as const } : {}),
      };
    },
    finish(status, error_code) {
      progress.finished = error_code === undefined ? { status } : { status, error_code };
    },
  };
  return progress;
}

/** Which of the three answers a call's progress calls for. */
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
  const { approval_id, approval_request_id, in_doubt } = progress!.started!;
  const where = {
    approval_id,
    approval_request_id,
    next_step: { tool: getApprovalTool, arguments: { approval_id } },
    trace_id,
  };
  if (stage === 'started' && in_doubt) {
    // Never "nothing was done": the statement that spends the approval may have committed.
    return wireError(
      outageAt(stage),
      'The database became unavailable while this write was starting: whether it started is not known; ' +
        `do not repeat it before ${getApprovalTool} shows its approval (still approved: it did not start)`,
      { in_doubt: true, ...where },
    );
  }
  if (stage === 'started') {
    return wireError(
      outageAt(stage),
      'The database is unavailable: this write started and whether it was made is not known yet; ' +
        `do not repeat it, check its outcome with ${getApprovalTool}`,
      { ...(failure?.reason === undefined ? {} : { reason: failure.reason }), ...where },
    );
  }
  const { status, error_code } = progress!.finished!;
  return wireError(
    outageAt(stage),
    `The database became unavailable after this write's outcome was recorded: it ${status}` +
      `${error_code ? ` (${error_code})` : ''}; this call's own audit row could not be written. ` +
      `Do not repeat it; ${getApprovalTool} shows the outcome`,
    { status, ...(error_code ? { error_code } : {}), ...where },
  );
}

/** Nothing was started: the call may be retried. */
export const nothingDone = (trace_id: string) =>
  wireError('outage.not_started', 'The database is unavailable: the call was not completed; retry shortly', {
    retry_after_s: 1,
    trace_id,
  });

/** The HTTP problem for a request the database failed before any call began: nothing was done. */
export const nothingDoneProblem = problemOf(
  'outage.not_started',
  'Service unavailable',
  'the database is unavailable; nothing was done; retry shortly',
);

/**
 * Whether a call answered with this protocol error may be made again as it was: only when nothing had
 * started. An answer of any other stage (or any other error) is not a retry's to settle.
 */
export const retryable = (err: unknown): boolean => {
  const rpc = ANSWERS['outage.not_started'].rpc;
  return (
    err instanceof ProtocolError &&
    err.code === rpc.code &&
    (err.data as { code?: string } | undefined)?.code === rpc.data_code
  );
};

/** The metrics code an answer of this stage is counted under. */
export const stageCode = (stage: Stage) => ANSWERS[outageAt(stage)].counted;
