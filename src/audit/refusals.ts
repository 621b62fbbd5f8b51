import type { Logger } from '../log.ts';
import type { AuditInput } from './chain.ts';
import type { AuditLog } from './log.ts';
import type { Pace } from './pace.ts';
import type { Connection, Transaction } from '../db/knex.ts';
import { refusals } from './store/index.ts';

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
  /** Appends the row, or counts it when its source had its share of rows this minute; first waits for the source's pace. */
  record(source: string, row: RefusalRow): Promise<void>;
  /** Appends the summary rows of every closed minute (every minute, with `all`: on a clean stop). */
  flush(opts?: { all?: boolean }): Promise<void>;
  /** Stops the timer and appends every pending summary, the current minute's too. */
  close(): Promise<void>;
}

export interface RefusalDeps {
  knex: Connection;
  audit: AuditLog;
  log: Logger;
  /** Own rows per source address, kind and reason per minute (config audit.denied_rows_per_minute). */
  perMinute: number;
  /** How fast one source address is refused (answered): src/audit/pace.ts. Without: at once. */
  pace?: Pace;
  /** The clock minutes are read from; tests pass their own. */
  now?: () => number;
}

const MINUTE_MS = 60_000;
/** How soon refusals counted on this replica past their share are added to the shared counter. */
export const PUSH_MS = 250;
/**
 * How long after a minute closes its counters are taken: the other replicas' pushes of its last
 * moments land first, so a minute has one summary row (a replica stalled past it adds a second one
 * later: counted all the same).
 */
const SETTLE_MS = 1000;

interface CountRow {
  kind: CountedRefusal;
  source: string;
  reason: string;
  minute: string | number;
  count: number;
  pushed: number;
  first_over_at: string | Date | null;
  last_at: string | Date;
  error_code: string | null;
}

/** Refusals of one source, kind and reason in one minute, counted on this replica past their share. */
interface Over {
  kind: CountedRefusal;
  source: string;
  reason: string;
  minute: number;
  error_code: string | null;
  /** Counted here and not yet added to the shared counter, with the times of the first and last. */
  n: number;
  first: number;
  last: number;
}

const iso = (t: string | Date) => new Date(t).toISOString();

/** Runs the functions it is given one after another, each once the one before has settled. */
function inTurn() {
  let tail: Promise<unknown> = Promise.resolve();
  return <T>(fn: () => Promise<T>): Promise<T> => {
    const run = tail.then(fn, fn);
    tail = run.catch(() => undefined);
    return run;
  };
}

/** Counts one more refusal of a source, kind, reason and minute already past its share; false if not. */
function countHere(over: Map<string, Over>, key: string, at: number): boolean {
  const counted = over.get(key);
  if (!counted) return false;
  if (counted.n === 0) counted.first = at;
  counted.n++;
  counted.last = Math.max(counted.last, at);
  return true;
}

/**
 * The counters live in the database (table refusal_counts), so that the replicas of a cluster share one
 * count: N replicas write N rows per source and reason per minute between them, not N each. Whichever
 * replica flushes a closed minute first takes its counters (deleted in the transaction that appends the
 * summary rows), so each summary is written once.
 *
 * Only the refusals that may still have a row of their own ask the database one by one. Once it has
 * said that a source, kind and reason are past their share for the minute, this replica counts the
 * rest of that minute's in memory and adds them to the counter in bulk PUSH_MS later (column `pushed`):
 * a flood from one address costs the database a statement every PUSH_MS, not one per request. A clean
 * stop pushes everything; a replica that crashes loses what it counted in its last PUSH_MS.
 */
export function createRefusals(deps: RefusalDeps): Refusals {
  const now = deps.now ?? Date.now;
  const minuteOf = (t: number) => Math.floor(t / MINUTE_MS);
  // The minute this process last counted in (a refusal in a later one flushes the closed ones first,
  // and the refusals of the new minute wait for that flush while it runs).
  let [lastMinute, minuteFlush]: [number | undefined, Promise<void> | undefined] = [undefined, undefined];
  let timer: NodeJS.Timeout | undefined;
  let pushTimer: NodeJS.Timeout | undefined;
  /** The latest minute in which this process counted a refusal past the share: its summary is pending. */
  let overMinute: number | undefined;
  /** Per source, kind, reason and minute past the share: counted here (see Over). */
  const over = new Map<string, Over>();
  /** Pushes and flushes run one after another: a push never lands behind the flush that took its minute. */
  const serially = inTurn();

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
      Math.max(0, (minute + 1) * MINUTE_MS - now()) + SETTLE_MS,
    );
    timer.unref();
  }

  function pushSoon() {
    if (pushTimer) return;
    pushTimer = setTimeout(() => {
      pushTimer = undefined;
      serially(() =>
        deps.knex.transaction((trx) => pushIn(trx, [...over.values()]).then(() => undefined)),
      ).catch((err: unknown) => {
        deps.log.error({ err }, 'refusals past their share not counted in the database yet');
        pushSoon();
      });
    }, PUSH_MS);
    pushTimer.unref();
  }

  /** One flush at a time in this process, after any push or flush under way. */
  const flush = (opts: { all?: boolean } = {}): Promise<void> =>
    serially(() => takeMinutes(deps, over, opts.all ? Infinity : minuteOf(now() - SETTLE_MS)));

  return {
    async record(source, row) {
      await deps.pace?.wait(source);
      const at = now();
      const minute = minuteOf(at);
      // The first refusal this process sees, or the first of a new minute: closed minutes are summed first
      // (also those a stopped or crashed replica left).
      if (lastMinute === undefined || minute > lastMinute) {
        lastMinute = minute;
        minuteFlush = flush().finally(() => (minuteFlush = undefined));
        minuteFlush.catch(() => (lastMinute = undefined)); // tried again by the next refusal
      }
      if (minuteFlush) await minuteFlush;
      const key = `${row.kind}\n${source}\n${row.details.reason}\n${minute}`;
      if (countHere(over, key, at)) return pushSoon();
      if ((await countOne(deps, source, row, minute, at)) <= deps.perMinute) {
        await deps.audit.append(row);
        return;
      }
      // The database counted this one past the share; the rest of the minute's are counted here.
      const { kind, details, error_code } = row;
      if (!over.has(key)) {
        over.set(key, {
          kind,
          source,
          reason: details.reason,
          minute,
          error_code: error_code ?? null,
          ...{ n: 0, first: at, last: at },
        });
      }
      flushAfter(minute);
    },
    flush,
    async close() {
      for (const t of [timer, pushTimer]) clearTimeout(t);
      deps.pace?.release();
      timer = pushTimer = undefined;
      await flush({ all: true });
    },
  };
}

/**
 * Adds what `counted` holds to the shared counters, in `trx`. What it held is taken at once (refusals
 * counted meanwhile wait for the next push) and given back if the transaction does not commit.
 */
async function pushIn(trx: Transaction, counted: Over[]) {
  const taken = counted.filter((o) => o.n > 0).map((o) => ({ o, n: o.n, first: o.first }));
  if (taken.length === 0) return;
  for (const { o } of taken) o.n = 0;
  try {
    await refusals.addPushed(
      trx,
      taken.map(({ o, n, first }) => ({
        ...{ kind: o.kind, source: o.source, reason: o.reason, minute: o.minute, pushed: n },
        first_over_at: new Date(first).toISOString(),
        last_at: new Date(o.last).toISOString(),
        error_code: o.error_code,
      })),
    );
  } catch (err) {
    for (const { o, n, first } of taken) {
      o.first = o.n > 0 ? Math.min(o.first, first) : first;
      o.n += n;
    }
    throw err;
  }
}

/**
 * Takes the counters of the minutes before `before` (Infinity: all of them), with what this replica
 * counted of them, and appends their summary rows, in one transaction.
 */
async function takeMinutes(deps: RefusalDeps, over: Map<string, Over>, before: number) {
  const due = [...over.entries()].filter(([, o]) => o.minute < before);
  await deps.knex.transaction(async (trx) => {
    await pushIn(
      trx,
      due.map(([, o]) => o),
    );
    const taken = (await refusals.take(trx, before)) as CountRow[];
    const summed = taken
      .map((r) => ({ r, count: pastShare(r, deps.perMinute) }))
      .filter(({ count }) => count > 0)
      .sort((a, b) =>
        iso(a.r.first_over_at ?? a.r.last_at).localeCompare(iso(b.r.first_over_at ?? b.r.last_at)),
      );
    if (summed.length > 0) {
      await deps.audit.appendIn(trx, ...summed.map(({ r, count }) => summaryRow(r, count, deps.perMinute)));
    }
  });
  // Their counters are gone: a refusal counted here since (only with `all`) starts a counter anew.
  for (const [key, o] of due) if (o.n === 0) over.delete(key);
}

/** How many of a counter's refusals came past its minute's own rows. */
const pastShare = (r: CountRow, perMinute: number) => Math.max(0, r.count - perMinute) + Number(r.pushed);

/** Counts one refusal in its minute, on any replica; returns how many that minute now holds. */
async function countOne(
  deps: RefusalDeps,
  source: string,
  row: RefusalRow,
  minute: number,
  at: number,
): Promise<number> {
  return refusals.countOne(deps.knex, {
    kind: row.kind,
    source,
    reason: row.details.reason,
    minute,
    at: new Date(at).toISOString(),
    code: row.error_code ?? null,
    n: deps.perMinute,
  });
}

/** The row that stands for a minute's `count` refusals past the first `perMinute`. */
function summaryRow(r: CountRow, count: number, perMinute: number): AuditInput {
  return {
    kind: 'auth.denied_summary',
    result: 'error',
    error_code: r.error_code,
    details: {
      of_kind: r.kind,
      reason: r.reason,
      ip: r.source,
      count,
      first_at: iso(r.first_over_at ?? r.last_at),
      last_at: iso(r.last_at),
      minute_start: new Date(Number(r.minute) * MINUTE_MS).toISOString(),
      rows_per_minute: perMinute,
    },
  };
}
