import { AppError, isAppError } from '../core/errors.ts';
import { isConnectionError } from './knex.ts';

/** The audit log could not take a row because the database cannot be reached (no SQL in the message). */
export const auditUnavailable = (cause: unknown) =>
  new AppError(
    'SOURCE_UNAVAILABLE',
    'the audit log cannot be written: the database is unavailable',
    'audit_unavailable',
    { cause },
  );

/**
 * Whether `err` says the database cannot be reached — a connection that failed, or an audit row the log
 * could not take for that reason — rather than that something was wrong. Answers the outage as a tool
 * call says it (SOURCE_UNAVAILABLE, retry in a second), or undefined for any other error. The one test
 * for an outage: every floor that answers one asks it.
 */
export function outageOf(err: unknown): AppError | undefined {
  if (!isAppError(err, 'SOURCE_UNAVAILABLE', 'audit_unavailable') && !isConnectionError(err))
    return undefined;
  return new AppError(
    'SOURCE_UNAVAILABLE',
    'the database is unavailable; retry shortly',
    'database_unavailable',
    {
      details: { retry_after_s: 1 },
      cause: err,
    },
  );
}
