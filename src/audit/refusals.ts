import type { Knex } from 'knex';
import type { Logger } from '../log.ts';
import type { AuditInput } from './chain.ts';
import type { AuditLog } from './log.ts';

/** The kinds of refusal that anyone on the network can cause, before anyone is known: these are counted. */
export type CountedRefusal = 'auth.denied' | 'slack.refused' | 'user.login_failed';

/** A refusal's audit row; `details.reason` says why. */
export type RefusalRow = AuditInput & { kind: CountedRefusal; details: { reason: string } };

/**
 * Refusals of unauthenticated requests, recorded without flooding the log: per source address, kind and
 * reason, the first `perMinute` of a minute get their own rows; the rest are counted and, once that
 * minute is closed, recorded as one `auth.denied_summary` row with their count and the times of the
 * first and last of them. Counted, never silently dropped.
 */
export interface Refusals {
  /** Appends the row, or counts it when its source had its share of rows this minute. */
  record(source: string, row: RefusalRow): Promise<void>;
  /** Appends the summary rows of every closed minute (every minute, with `all`: on a clean stop). */
  flush(opts?: { all?: boolean }): Promise<void>;
  /** Stops the timer and appends every pending summary, the current minute's too. */
  close(): Promise<void>;
}

export interface RefusalDeps {
  knex: Knex;
  audit: AuditLog;
  log: Logger;
  /** Own rows per source address, kind and reason per minute (config audit.denied_rows_per_minute). */
  perMinute: number;
  /** The clock minutes are read from; tests pass their own. */
  now?: () => number;
}

const MINUTE_MS = 60_000;

interface CountRow {
  kind: CountedRefusal;
  source: string;
  reason: string;
  minute: string | number;
  count: number;
  first_over_at: string | Date | null;
  last_at: string | Date;
  error_code: string | null;
}

const iso = (t: string | Date) => new Date(t).toISOString();

/**
 * The counters live in the database (table refusal_counts), so that the replicas of a cluster share one
 * count: N replicas write N rows per source and reason per minute between them, not N each. Whichever
 * replica flushes a closed minute first takes its counters (deleted in the transaction that appends the
 * summary rows), so each summary is written once.
 */
export function createRefusals(deps: RefusalDeps): Refusals {
  const now = deps.now ?? Date.now;
  const minuteOf = (t: number) => Math.floor(t / MINUTE_MS);
  /** The minute this process last counted in: a refusal in a later one flushes the closed ones first. */
  let lastMinute: number | undefined;
  let timer: NodeJS.Timeout | undefined;
  /** The latest minute in which this process counted a refusal past the share: its summary is pending. */
  let overMinute: number | undefined;
  let flushing: Promise<void> | undefined;

  /** Soon after `minute` closes, flushes it (and again for a later minute counted meanwhile). */
  function flushAfter(minute: number) {
    overMinute = Math.max(overMinute ?? minute, minute);
    if (timer) return;
    timer = setTimeout(
      () => {
        timer = undefined;
        flush().then(
          () => {
            if (overMinute !== undefined && overMinute >= minuteOf(now())) flushAfter(overMinute);
          },
          (err: unknown) => deps.log.error({ err }, 'refusal summaries not written yet'),
        );
      },
      Math.max(0, (minute + 1) * MINUTE_MS - now()) + 1000,
    );
    timer.unref();
  }

  async function flushOnce(all: boolean): Promise<void> {
    const current = minuteOf(now());
    await deps.knex.transaction(async (trx) => {
      const taken = (await trx('refusal_counts')
        .where('minute', all ? '<=' : '<', current)
        .delete()
        .returning('*')) as CountRow[];
      const over = taken
        .filter((r) => r.count > deps.perMinute)
        .sort((a, b) => iso(a.first_over_at ?? a.last_at).localeCompare(iso(b.first_over_at ?? b.last_at)));
      if (over.length > 0) await deps.audit.appendIn(trx, ...over.map((r) => summaryRow(r, deps.perMinute)));
    });
  }

  /** One flush at a time in this process; a second caller waits for the one under way, then runs its own. */
  async function flush(opts: { all?: boolean } = {}): Promise<void> {
    while (flushing) await flushing.catch(() => undefined);
    flushing = flushOnce(opts.all === true);
    try {
      await flushing;
    } finally {
      flushing = undefined;
    }
  }

  return {
    async record(source, row) {
      const at = now();
      const minute = minuteOf(at);
      // The first refusal this process sees, or the first of a new minute: closed minutes are summed first
      // (also those a stopped or crashed replica left).
      if (lastMinute === undefined || minute > lastMinute) await flush();
      lastMinute = minute;
      if ((await countOne(deps, source, row, minute, at)) <= deps.perMinute) {
        await deps.audit.append(row);
        return;
      }
      flushAfter(minute);
    },
    flush,
    async close() {
      if (timer) clearTimeout(timer);
      timer = undefined;
      await flush({ all: true });
    },
  };
}

/** Counts one refusal in its minute, on any replica; returns how many that minute now holds. */
async function countOne(
  deps: RefusalDeps,
  source: string,
  row: RefusalRow,
  minute: number,
  at: number,
): Promise<number> {
  const { rows } = (await deps.knex.raw(
    `insert into refusal_counts as r (kind, source, reason, minute, count, first_over_at, last_at, error_code)
     values (:kind, :source, :reason, :minute, 1, null, :at, :code)
     on conflict (kind, source, reason, minute) do update
       set count = r.count + 1,
           first_over_at = coalesce(r.first_over_at, case when r.count >= :n then excluded.last_at end),
           last_at = excluded.last_at
     returning count`,
    {
      kind: row.kind,
      source,
      reason: row.details.reason,
      minute,
      at: new Date(at).toISOString(),
      code: row.error_code ?? null,
      n: deps.perMinute,
    },
  )) as { rows: { count: number }[] };
  return Number(rows[0]!.count);
}

/** The row that stands for a minute's refusals past the first `perMinute`. */
function summaryRow(r: CountRow, perMinute: number): AuditInput {
  return {
    kind: 'auth.denied_summary',
    result: 'error',
    error_code: r.error_code,
    details: {
      of_kind: r.kind,
      reason: r.reason,
      ip: r.source,
      count: r.count - perMinute,
      first_at: iso(r.first_over_at ?? r.last_at),
      last_at: iso(r.last_at),
      minute_start: new Date(Number(r.minute) * MINUTE_MS).toISOString(),
      rows_per_minute: perMinute,
    },
  };
}
