import type { Knex } from 'knex';

/**
 * SQLSTATEs with which PostgreSQL aborts a transaction that did nothing wrong: it lost a deadlock
 * (40P01) or a serialization conflict (40001). Everything it did is rolled back, so running it again
 * from the start is safe.
 */
const RETRYABLE = new Set(['40P01', '40001']);

/** Whether `err` is PostgreSQL aborting a transaction that may simply be run again. */
export function isRetryable(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && RETRYABLE.has(code);
}

/** How often a transaction aborted as a deadlock or serialization failure is run in all. */
export const TRANSACTION_ATTEMPTS = 4;

/**
 * `knex.transaction(work)`, run again (up to TRANSACTION_ATTEMPTS in all) when PostgreSQL aborts it as
 * a deadlock or a serialization failure. Only for work that is safe to repeat: everything it wrote,
 * its audit rows included, was rolled back with it, so a retry appends them once. A short random pause
 * before each retry keeps the same racers from meeting again in the same order.
 */
export async function retryingTransaction<T>(
  knex: Knex,
  work: (trx: Knex.Transaction) => Promise<T>,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await knex.transaction(work);
    } catch (err) {
      if (!isRetryable(err) || attempt >= TRANSACTION_ATTEMPTS) throw err;
      await new Promise((resolve) => setTimeout(resolve, Math.random() * 20 * attempt));
    }
  }
}

/** `knex` as far as transactions go, each run with retryingTransaction. */
export const withRetries = (knex: Knex) => ({
  transaction: <T>(work: (trx: Knex.Transaction) => Promise<T>) => retryingTransaction(knex, work),
});
