import { z } from 'zod';
import { ErrorCode } from './errors.ts';

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

/** The exact shape of a successful result, for tests and clients that want the strict form. */
export function successSchema(fields: z.ZodObject) {
  return z.object({ ...fields.shape, ...EnvelopeFields, ok: z.literal(true) });
}
