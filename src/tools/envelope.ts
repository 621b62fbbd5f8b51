import type { CallToolResult } from '@modelcontextprotocol/server';
import { z } from 'zod';
import { factColumns } from '../core/audit-kinds.ts';
import { answerOfError } from '../core/answers.ts';
import { ErrorCode, type AppError } from '../core/errors.ts';
import type { ToolOutcome } from './types.ts';

export const AuditBlock = z.object({
  tool: z.string(),
  request_id: z.string(),
  trace_id: z.string(),
  source: z.string().nullable(),
  operator_id: z.string().nullable(),
  approval_id: z.string().nullable(),
  dry_run: z.boolean(),
  target_ref: z.string().nullable(),
  content_sha256: z.string().nullable(),
  file_sha256: z.string().nullable(),
  started_at: z.string(),
  finished_at: z.string(),
  result: z.enum(['ok', 'error']),
  audit_seq: z.number().int(),
});
export type AuditBlock = z.infer<typeof AuditBlock>;

export const ErrorBlock = z.object({
  code: ErrorCode,
  message: z.string(),
  reason: z.string().nullable(),
  trace_id: z.string(),
  details: z.record(z.string(), z.unknown()).optional(),
  /** With RATE_LIMITED: when to try again. */
  retry_after_s: z.number().int().optional(),
});
export type ErrorBlock = z.infer<typeof ErrorBlock>;

const EnvelopeFields = {
  ok: z.boolean(),
  status: z.enum(['ok', 'empty', 'error']),
  next_cursor: z.string().nullable(),
  error: ErrorBlock.optional(),
  audit: AuditBlock,
};

/**
 * The schema advertised as a tool's outputSchema: the envelope plus the tool's own fields, which are
 * present on success and absent on failure (so they are optional here).
 */
export function envelopeSchema(fields: z.ZodObject) {
  return z.object({ ...fields.partial().shape, ...EnvelopeFields });
}

/** What a call's audit row recorded, as the envelope reports it. */
export interface CallFacts {
  tool: string;
  request_id: string;
  trace_id: string;
  operator_id: string;
  started: Date;
  audit_seq: number;
}

/** A call's outcome as the tool gave it: its own fields and audit facts, or the failure. */
export type Settled =
  | { outcome: ToolOutcome<Record<string, unknown>>; failure?: undefined }
  | { outcome?: undefined; failure: AppError };

/**
 * The tool result every call answers with (README, "The response envelope"): the envelope as
 * structuredContent and the same JSON as text; `isError` exactly when `ok` is false.
 */
export function toCallResult(call: CallFacts, settled: Settled, finished = new Date()): CallToolResult {
  const facts = factColumns(settled.outcome?.audit ?? {});
  // In the envelope's own order (test/__snapshots__), from the same columns as the row.
  const audit: AuditBlock = {
    tool: call.tool,
    request_id: call.request_id,
    trace_id: call.trace_id,
    source: facts.source,
    operator_id: call.operator_id,
    approval_id: facts.approval_id,
    dry_run: facts.dry_run,
    target_ref: facts.target_ref,
    content_sha256: facts.content_sha256,
    file_sha256: facts.file_sha256,
    started_at: call.started.toISOString(),
    finished_at: finished.toISOString(),
    result: settled.failure ? 'error' : 'ok',
    audit_seq: call.audit_seq,
  };
  const envelope = settled.failure
    ? {
        ok: false,
        status: 'error',
        next_cursor: null,
        error: errorBlock(settled.failure, call.trace_id),
        audit,
      }
    : {
        ok: true,
        status: settled.outcome.empty ? 'empty' : 'ok',
        ...settled.outcome.data,
        next_cursor: settled.outcome.next_cursor ?? null,
        audit,
      };
  return {
    structuredContent: envelope,
    content: [{ type: 'text', text: JSON.stringify(envelope) }],
    ...(settled.failure ? { isError: true } : {}),
  };
}

function errorBlock(failure: AppError, trace_id: string): ErrorBlock {
  const retry = failure.details?.retry_after_s;
  // The envelope's error, as the one map from failure to answer gives it (core/answers.ts).
  const { code, reason } = answerOfError(failure).envelope;
  return {
    code,
    message: failure.message,
    reason,
    trace_id,
    ...(failure.details ? { details: failure.details } : {}),
    ...(typeof retry === 'number' ? { retry_after_s: retry } : {}),
  };
}
