import type { Queryable } from '../../db/knex.ts';

/*
 * Calls per agent and minute (rate_windows): the one statement that decides and counts a lease of
 * calls, and the purge. The leases, the refusals held in memory and the retry times are in
 * rate-limit.ts.
 */

/** What the lease statement found: whether it counted, how many it granted, and the estimate's parts. */
export interface LeaseRow {
  admitted: boolean;
  granted: number;
  prev: number;
  weight: number;
  current: number;
}

/**
 * One statement: counts up to `size` calls of `agent` in the database's current minute if the sliding
 * estimate (the previous minute's count weighted by what the window still covers, plus the current
 * one's) stays within `limit`. Concurrent calls of one agent serialise on the row of its minute.
 */
export async function lease(q: Queryable, agent: string, limit: number, size: number): Promise<LeaseRow> {
  const { rows } = (await q.raw(
    `with t as (select extract(epoch from clock_timestamp())::float8 as e),
            m as (select floor(e / 60)::bigint as minute, 1 - (e - floor(e / 60) * 60) / 60 as w from t),
            p as (select coalesce((select calls from rate_windows
                                    where agent_id = :agent and minute = (select minute from m) - 1), 0) as n),
            c as (select coalesce((select calls from rate_windows
                                    where agent_id = :agent and minute = (select minute from m)), 0) as n),
            g as (select least(:lease, floor(:limit - p.n * m.w - c.n))::int as n from m, p, c),
            ins as (
              insert into rate_windows as r (agent_id, minute, calls)
              select :agent, m.minute, g.n from m, g where g.n >= 1
              on conflict (agent_id, minute) do update set calls = r.calls + excluded.calls
                where r.calls + excluded.calls + (select n from p) * (select w from m) <= :limit
              returning calls)
       select (select calls from ins) is not null as admitted, g.n as granted, p.n as prev, m.w as weight,
              c.n as current
         from m, p, c, g`,
    { agent, limit, lease: size },
  )) as { rows: LeaseRow[] };
  return rows[0]!;
}

/** Forgets the minutes no estimate reads any more (all but the current and the previous). */
export async function purge(q: Queryable) {
  await q.raw(
    `delete from rate_windows where minute < floor(extract(epoch from clock_timestamp()) / 60)::bigint - 1`,
  );
}
