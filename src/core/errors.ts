import { z } from 'zod';

/** Tool-level error codes (README, "The response envelope"). */
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
  /** A write started (write.started is recorded) and whether it happened is not known: check, never repeat. */
  'OUTCOME_UNKNOWN',
  /**
   * What the database holds contradicts what this server made (an approval it did not decide, or one
   * already used): nothing is executed, signed or trusted on it (docs/audit.md, "Host roots").
   */
  'TAMPERED',
  'INTERNAL_ERROR',
]);
export type ErrorCode = z.infer<typeof ErrorCode>;

/**
 * Codes of refusals outside a tool call (CLI, admin endpoint, web forms, start-up). They never reach a
 * tool envelope: there, anything but an ErrorCode is INTERNAL_ERROR.
 */
export const OperatorCode = z.enum([
  /** The name is taken (an agent, a user). */
  'CONFLICT',
  /** No such thing (an approval request, a user, an agent, a file). */
  'NOT_FOUND',
  /** The configuration, a profile or a command's input is not valid. */
  'CONFIG_INVALID',
  /** Something this process needs is held by another (the data directory, the port). */
  'LOCKED',
  /** The user stopped it (Ctrl-C at a prompt). */
  'INTERRUPTED',
]);
export type OperatorCode = z.infer<typeof OperatorCode>;

/** Error codes audit rows may carry: the tool codes plus the protocol-level refusals (docs/audit.md). */
export const AuditErrorCode = z.enum([
  ...ErrorCode.options,
  'UNKNOWN_TOOL',
  'TOOL_DENIED',
  'CALL_TIMEOUT',
  'UNAUTHENTICATED',
]);
export type AuditErrorCode = z.infer<typeof AuditErrorCode>;

export type AppErrorCode = ErrorCode | OperatorCode;

/** The one error class of countersign: a code from the enums, a human message, an optional machine reason. */
export class AppError extends Error {
  override name = 'AppError';
  constructor(
    readonly code: AppErrorCode,
    message: string,
    readonly reason?: string,
    options?: { cause?: unknown; details?: Record<string, unknown> },
  ) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.details = options?.details;
  }
  readonly details: Record<string, unknown> | undefined;
}

/** Whether `err` is an AppError with one of these codes (and, when given, this reason). */
export function isAppError(err: unknown, code?: AppErrorCode, reason?: string): err is AppError {
  return (
    err instanceof AppError &&
    (code === undefined || err.code === code) &&
    (reason === undefined || err.reason === reason)
  );
}

/** The tool-level code an error is answered with in an envelope (README, "The response envelope"). */
export const toolCodeOf = (err: Pick<AppError, 'code'>): ErrorCode =>
  ErrorCode.safeParse(err.code).success ? (err.code as ErrorCode) : 'INTERNAL_ERROR';

/** HTTP status of a code, for problem+json answers (RFC 9457). */
export const HTTP_STATUS: Record<AppErrorCode, number> = {
  INVALID_ARGUMENT: 400,
  CONFIG_INVALID: 400,
  NOT_LOGGED_IN: 401,
  PERMISSION_DENIED: 403,
  APPROVAL_REQUIRED: 403,
  DRY_RUN_ONLY: 403,
  NOT_FOUND: 404,
  TARGET_NOT_FOUND: 404,
  AMBIGUOUS_TARGET: 409,
  CONFLICT: 409,
  IDEMPOTENCY_CONFLICT: 409,
  LOCKED: 409,
  TAMPERED: 422,
  RATE_LIMITED: 429,
  INTERRUPTED: 499,
  INTERNAL_ERROR: 500,
  CONNECTOR_FAILED: 502,
  OUTCOME_UNKNOWN: 502,
  SOURCE_UNAVAILABLE: 503,
  TIMEOUT: 504,
};
