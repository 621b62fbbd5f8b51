import { setTimeout as sleep } from 'node:timers/promises';
import { AppError, isAppError } from '../core/errors.ts';
import type { Logger } from '../log.ts';
import { isConnectionError, openDatabase, type Database, type DatabaseOptions } from './knex.ts';

export interface ReadyOptions extends DatabaseOptions {
  /** How long start-up keeps trying (config database.startup_timeout_s), in ms. */
  timeoutMs: number;
  log: Logger;
  /**
   * A first question the opened database must answer within an attempt's time (whether the migrations
   * are applied: a lock held on their table, or a server that accepts and never answers, shows here).
   */
  check(db: Database): Promise<unknown>;
  /** What must then succeed before it counts as ready (the migrations), however long it takes. */
  prepare(db: Database): Promise<void>;
  /** A failure said as what is wrong and what to do (the CLI's one line), when there is one. */
  explain?(err: unknown): string | undefined;
}

/**
 * How long one attempt may take (a socket that never answers, a table held by a lock): a third of the
 * whole wait, between 1 and 10 s, so that a short wait still makes several attempts.
 */
const attemptMs = (timeoutMs: number) => Math.min(10_000, Math.max(1_000, Math.floor(timeoutMs / 3)));
const FIRST_DELAY_MS = 250;
const MAX_DELAY_MS = 5_000;

/** The reason start-up gives when the database is still not ready at its deadline. */
export const DATABASE_NOT_READY = 'database_not_ready';

/**
 * Opens the database and prepares it (migrations). A PostgreSQL that cannot be reached yet, or does not
 * answer, or whose migrations another replica is applying, is tried again with backoff until `timeoutMs`
 * has passed, each failed attempt logged with its reason; then start-up fails with SOURCE_UNAVAILABLE
 * and the last reason in one line. Any other failure (a wrong password, a missing database, the embedded
 * database held by another process) is not going to pass by waiting: it fails at once.
 */
export async function openWhenReady(opts: ReadyOptions): Promise<Database> {
  const deadline = Date.now() + opts.timeoutMs;
  let delay = FIRST_DELAY_MS;
  // The last reason that was an answer (refused, reset, …) rather than a wait that ran out.
  let answered: string | undefined;
  for (let attempt = 1; ; attempt++) {
    try {
      return await attemptOnce(opts, Math.max(1, Math.min(attemptMs(opts.timeoutMs), deadline - Date.now())));
    } catch (err) {
      if (!opts.url || !worthRetrying(err)) throw err;
      const timedOut = isAppError(err, 'SOURCE_UNAVAILABLE', ATTEMPT_TIMED_OUT);
      // A last attempt cut short by the deadline says little on its own: the answer before it says more.
      const reason =
        timedOut && answered && answered !== reasonOf(err)
          ? `${reasonOf(err)}; before that: ${answered}`
          : reasonOf(err);
      if (!timedOut) answered = reasonOf(err);
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new AppError(
          'SOURCE_UNAVAILABLE',
          `the database was not ready within ${Math.round(opts.timeoutMs / 1000)} s ` +
            `(database.startup_timeout_s, ${attempt} attempt${attempt === 1 ? '' : 's'}): ${reason}`,
          DATABASE_NOT_READY,
          { cause: err },
        );
      }
      const wait = Math.min(delay, left);
      if (attempt === 1) sayFirstFailure(opts, err, reason);
      opts.log.warn({ attempt, reason, retry_in_ms: wait }, 'database not ready; retrying');
      await sleep(wait);
      delay = Math.min(delay * 2, MAX_DELAY_MS);
    }
  }
}

/**
 * Said at the first failed attempt, not after the whole wait: what is wrong, what to do, and that start-up
 * keeps trying meanwhile (a PostgreSQL that is still starting needs nothing done).
 */
function sayFirstFailure(opts: ReadyOptions, err: unknown, reason: string): void {
  const what = opts.explain?.(err) ?? `the database is not ready (${reason})`;
  const s = Math.round(opts.timeoutMs / 1000);
  opts.log.warn(
    { reason, startup_timeout_s: s },
    `${what}; still trying for up to ${s} s (database.startup_timeout_s)`,
  );
}

/** A marker for an attempt that did not finish in time. */
const ATTEMPT_TIMED_OUT = 'attempt_timed_out';

/**
 * One attempt: open and check, within `ms` on PostgreSQL (past it the attempt is given up, and whatever
 * it opened is closed in the background: a query waiting on a lock may hold its connection until the
 * lock goes), then prepare. Migrating is work, not waiting: it is not cut short, and neither is the
 * embedded database, which has no network to wait on.
 */
async function attemptOnce(opts: ReadyOptions, ms: number): Promise<Database> {
  const opened = (async () => {
    const db = await openDatabase(opts);
    try {
      await opts.check(db);
      return db;
    } catch (err) {
      await db.close().catch(() => {});
      throw err;
    }
  })();
  const db = opts.url ? await bounded(opened, ms) : await opened;
  try {
    await opts.prepare(db);
    return db;
  } catch (err) {
    await db.close().catch(() => {});
    throw err;
  }
}

/** `opened` within `ms`, else a timed-out attempt (and the database, if it opens later, closed). */
async function bounded(opened: Promise<Database>, ms: number): Promise<Database> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new AppError('SOURCE_UNAVAILABLE', `no answer within ${ms} ms`, ATTEMPT_TIMED_OUT)),
      ms,
    );
  });
  try {
    return await Promise.race([opened, late]);
  } catch (err) {
    if (isAppError(err, 'SOURCE_UNAVAILABLE', ATTEMPT_TIMED_OUT)) {
      void opened.then((db) => db.close()).catch(() => {});
    }
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

/** A database that is down, restarting, unanswering, or being migrated by another replica. */
function worthRetrying(err: unknown): boolean {
  if (isAppError(err, 'SOURCE_UNAVAILABLE', ATTEMPT_TIMED_OUT)) return true;
  if ((err as { name?: unknown } | null)?.name === 'MigrationLocked') return true;
  return isConnectionError(err) || isConnectionError((err as { errors?: unknown[] }).errors?.[0]);
}

/** One line saying why an attempt failed; never the URL (it may hold a password). */
export function reasonOf(err: unknown): string {
  if (isAppError(err)) return err.message;
  const e = err as { code?: unknown; message?: unknown; errors?: unknown[] } | null;
  if (e && !e.message && e.errors?.[0]) return reasonOf(e.errors[0]);
  const code = typeof e?.code === 'string' ? e.code : undefined;
  const message = String(e?.message ?? err)
    .split('\n')[0]!
    .slice(0, 200);
  return code && !message.includes(code) ? `${code}: ${message}` : message;
}
