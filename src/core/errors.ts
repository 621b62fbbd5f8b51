import { z } from 'zod';

/** Tool-level error codes (SPEC §4). */
export const ErrorCode = z.enum([
  'INVALID_ARGUMENT',
  'SOURCE_UNAVAILABLE',
  'NOT_LOGGED_IN',
  'PERMISSION_DENIED',
  'APPROVAL_REQUIRED',
  'DRY_RUN_ONLY',
  'TARGET_NOT_FOUND',
  'AMBIGUOUS_TARGET',
  'TIMEOUT',
  'CONNECTOR_FAILED',
  'RATE_LIMITED',
  'IDEMPOTENCY_CONFLICT',
  'INTERNAL_ERROR',
]);
export type ErrorCode = z.infer<typeof ErrorCode>;

/** The one error class of countersign: a code from the enum, a human message, an optional machine reason. */
export class AppError extends Error {
  override name = 'AppError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly reason?: string,
    options?: { cause?: unknown; details?: Record<string, unknown> },
  ) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.details = options?.details;
  }
  readonly details: Record<string, unknown> | undefined;
}

export const invalidArgument = (message: string, reason?: string) =>
  new AppError('INVALID_ARGUMENT', message, reason);
