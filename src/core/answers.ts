import { HTTP_STATUS, toolCodeOf, type AppErrorCode, type AuditErrorCode, type ErrorCode } from './errors.ts';

/*
 * The one map from a failure to what the agent is told, for every transport. As in the MCP SDK v2,
 * errors are of two sorts: those that cross the wire as a JSON-RPC error (its ProtocolError), and
 * those that do not — here an AppError, which a tool call answers inside its envelope (ok: false) and
 * an HTTP request answers as problem JSON (RFC 9457). A failure is either a tool failure (an AppError:
 * its code and reason) or one of the named failures below, which the call seam cannot answer in an
 * envelope (no such tool, a denied tool, the deadline, a crash) or cannot record (the database gone,
 * named by how far the call's write got as committed: docs/adr/0007-one-map-from-failure-to-answer.md).
 *
 * Each row says, for each of the three answers, how it is given — or null where that answer is never
 * given for it. The messages stay with the code that knows their particulars (the tool's name, the
 * profile's reason); the codes, which clients and tests read, are decided here.
 */

/** How far a call's write got, as committed: nothing started, write.started, or its outcome recorded. */
export type Stage = 'not_started' | 'started' | 'finished';

/** A refusal of a call that its audit row records, answered on the wire (a JSON-RPC error). */
export type Refusal = 'unknown_tool' | 'tool_denied' | 'call_timeout' | 'crash';

/** A failure with a row of its own in the map: a refusal, or an outage at a stage. */
export type NamedFailure = Refusal | `outage.${Stage}`;

/** What a failure is answered with, by transport; `Row` is what its audit row's error_code can be. */
export interface Answer<Row extends string | null = string | null> {
  /** The error block of a tool envelope (ok: false), when the call's row can still be written. */
  envelope: { code: ErrorCode; reason: string | null } | null;
  /** The JSON-RPC error: its code, and the `data.code` (and default `data.reason`) it carries. */
  rpc: { code: number; data_code: string; reason?: string } | null;
  /**
   * The HTTP problem (RFC 9457), for a request refused before any MCP handler answered it: its status,
   * its code, and the reason its type ends with (problemType).
   */
  http: { status: number; code: AppErrorCode; reason: string } | null;
  /** The error_code of the call's audit row; null for an outage, which the call cannot record. */
  audit: Row;
  /** What /metrics counts it under. */
  counted: string;
}

/** JSON-RPC code of a call that could not be audited because the database is unavailable. */
export const DATABASE_UNAVAILABLE = -32003;

/** The JSON-RPC codes used below (JSON-RPC 2.0 and the MCP specification). */
const INVALID_PARAMS = -32602;
const INTERNAL_ERROR = -32603;
const CALL_TIMEOUT = -32001;

/** The `type` of a problem answer (core/problem.ts): its reason, or its code when it has none. */
export const problemType = (reasonOrCode: string) => `urn:countersign:problem:${reasonOrCode}`;

/** The named failures: one row each. */
export const ANSWERS = Object.freeze({
  // An unknown tool and a denied one are -32602 (SDK v2 sends a handler's -32002 as -32602:
  // docs/adr/0001-denied-tool-error-code.md); data.code tells them apart.
  unknown_tool: {
    envelope: null,
    rpc: { code: INVALID_PARAMS, data_code: 'UNKNOWN_TOOL' },
    http: null,
    audit: 'UNKNOWN_TOOL',
    counted: 'UNKNOWN_TOOL',
  },
  tool_denied: {
    envelope: null,
    rpc: { code: INVALID_PARAMS, data_code: 'TOOL_DENIED' },
    http: null,
    audit: 'TOOL_DENIED',
    counted: 'TOOL_DENIED',
  },
  call_timeout: {
    envelope: null,
    rpc: { code: CALL_TIMEOUT, data_code: 'CALL_TIMEOUT' },
    http: null,
    audit: 'CALL_TIMEOUT',
    counted: 'CALL_TIMEOUT',
  },
  // Never the error's own text, never a stack: the trace id finds it in the log.
  crash: {
    envelope: null,
    rpc: { code: INTERNAL_ERROR, data_code: 'INTERNAL' },
    http: { status: HTTP_STATUS.INTERNAL_ERROR, code: 'INTERNAL_ERROR', reason: 'internal' },
    audit: 'INTERNAL_ERROR',
    counted: 'INTERNAL_ERROR',
  },
  // The database gone. Nothing started: nothing was done, retry (over HTTP before any call began, 503).
  'outage.not_started': {
    envelope: { code: 'SOURCE_UNAVAILABLE', reason: 'database_unavailable' },
    rpc: { code: DATABASE_UNAVAILABLE, data_code: 'SOURCE_UNAVAILABLE', reason: 'database_unavailable' },
    http: {
      status: HTTP_STATUS.SOURCE_UNAVAILABLE,
      code: 'SOURCE_UNAVAILABLE',
      reason: 'database_unavailable',
    },
    audit: null,
    counted: 'SOURCE_UNAVAILABLE',
  },
  // write.started committed: the write may have been made; never "retry", always where to learn it.
  'outage.started': {
    envelope: { code: 'OUTCOME_UNKNOWN', reason: 'database_unavailable' },
    rpc: { code: DATABASE_UNAVAILABLE, data_code: 'OUTCOME_UNKNOWN', reason: 'database_unavailable' },
    http: null,
    audit: null,
    counted: 'OUTCOME_UNKNOWN',
  },
  // The outcome committed, the call's own row not: the outcome is told, the call is not repeated.
  'outage.finished': {
    envelope: null,
    rpc: { code: DATABASE_UNAVAILABLE, data_code: 'OUTCOME_RECORDED', reason: 'call_unaudited' },
    http: null,
    audit: null,
    counted: 'OUTCOME_RECORDED',
  },
} as const satisfies Record<Refusal, Answer<AuditErrorCode>> & Record<`outage.${Stage}`, Answer<null>>);

/**
 * A tool failure (an AppError): answered in the envelope under its tool code (an operator code there
 * is INTERNAL_ERROR), never as a JSON-RPC error; over HTTP as problem JSON by its own code.
 */
export function answerOfError(err: {
  code: AppErrorCode;
  reason?: string;
}): Answer<ErrorCode> & { envelope: NonNullable<Answer['envelope']>; rpc: null } {
  const code = toolCodeOf(err);
  return {
    envelope: { code, reason: err.reason ?? null },
    rpc: null,
    http: { status: HTTP_STATUS[err.code], code: err.code, reason: err.reason ?? err.code },
    audit: code,
    counted: code,
  };
}

/** The row of an outage, by how far the call's write got. */
export const outageAt = (stage: Stage): NamedFailure => `outage.${stage}`;
