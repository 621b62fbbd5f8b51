import type { Queryable, Transaction } from '../../db/knex.ts';

/*
 * The shared counters of refusals past their share (refusal_counts): one row per kind, source, reason
 * and minute, counted by every replica, taken (deleted) when the minute's summary row is appended.
 */

/** What one replica adds to a minute's counter: refusals it counted past the share, and when. */
export interface Pushed {
  kind: string;
  source: string;
  reason: string;
  minute: number;
  pushed: number;
  first_over_at: string;
  last_at: string;
  error_code: string | null;
}

/** Adds each of `pushed` to its counter (created when missing), in `trx`. */
export async function addPushed(trx: Transaction, pushed: Pushed[]): Promise<void> {
  await trx.raw(
    `insert into refusal_counts as r
       (kind, source, reason, minute, count, pushed, first_over_at, last_at, error_code)
     values ${pushed.map(() => '(?, ?, ?, ?, 0, ?, ?, ?, ?)').join(', ')}
     on conflict (kind, source, reason, minute) do update
       set pushed = r.pushed + excluded.pushed,
           first_over_at = coalesce(r.first_over_at, excluded.first_over_at),
           last_at = greatest(r.last_at, excluded.last_at)`,
    pushed.flatMap((p) => [
      ...[p.kind, p.source, p.reason, p.minute, p.pushed],
      ...[p.first_over_at, p.last_at, p.error_code],
    ]),
  );
}

/** Deletes and returns the counters of the minutes before `before` (Infinity: all of them). */
export async function take(trx: Transaction, before: number): Promise<unknown[]> {
  return (await trx('refusal_counts')
    .modify((q) => {
      if (before !== Infinity) void q.where('minute', '<', before);
    })
    .delete()
    .returning('*')) as unknown[];
}

/**
 * Counts one refusal in its minute's counter; the first past `n` sets when the minute went over.
 * Returns how many the minute now holds.
 */
export async function countOne(
  knex: Queryable,
  c: {
    kind: string;
    source: string;
    reason: string;
    minute: number;
    at: string;
    code: string | null;
    n: number;
  },
): Promise<number> {
  const { rows } = (await knex.raw(
    `insert into refusal_counts as r (kind, source, reason, minute, count, first_over_at, last_at, error_code)
     values (:kind, :source, :reason, :minute, 1, null, :at, :code)
     on conflict (kind, source, reason, minute) do update
       set count = r.count + 1,
           first_over_at = coalesce(r.first_over_at, case when r.count >= :n then excluded.last_at end),
           last_at = excluded.last_at
     returning count`,
    c,
  )) as { rows: { count: number }[] };
  return Number(rows[0]!.count);
}
