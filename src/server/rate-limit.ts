import type { Knex } from 'knex';

export interface RateLimiter {
  /** Counts the call and returns 0, or refuses it (uncounted) and returns the seconds until one is allowed. */
  take(agentId: string, limit: number): Promise<number>;
  /** Forgets windows no estimate reads any more. */
  purge(): Promise<void>;
}

/**
 * Calls per agent in a sliding minute, counted in the database so that all replicas of a cluster count
 * against one limit. O(1) per call and per agent: the current minute's count and the previous minute's,
 * the previous weighted by how much of it the sliding minute still covers (the estimate commonly used
 * for sliding windows). One statement both decides and counts; concurrent calls of one agent serialise
 * on the row of its current minute, so the limit holds under races, on any number of replicas.
 */
export function createRateLimiter(knex: Knex): RateLimiter {
  return {
    async take(agentId, limit) {
      const { rows } = (await knex.raw(
        `with t as (select extract(epoch from clock_timestamp())::float8 as e),
              m as (select floor(e / 60)::bigint as minute, 1 - (e - floor(e / 60) * 60) / 60 as w from t),
              p as (select coalesce((select calls from rate_windows
                                      where agent_id = :agent and minute = (select minute from m) - 1), 0) as n),
              ins as (
                insert into rate_windows as r (agent_id, minute, calls)
                select :agent, m.minute, 1 from m, p where p.n * m.w + 1 <= :limit
                on conflict (agent_id, minute) do update set calls = r.calls + 1
                  where r.calls + 1 + (select n from p) * (select w from m) <= :limit
                returning calls)
         select (select calls from ins) as admitted, p.n as prev, m.w as weight,
                coalesce((select calls from rate_windows
                           where agent_id = :agent and minute = m.minute), 0) as current
           from m, p`,
        { agent: agentId, limit },
      )) as { rows: { admitted: number | null; prev: number; weight: number; current: number }[] };
      const row = rows[0]!;
      if (row.admitted !== null) return 0;
      return retryAfterSeconds(Number(row.current), Number(row.prev), Number(row.weight), limit);
    },
    async purge() {
      await knex.raw(
        `delete from rate_windows where minute < floor(extract(epoch from clock_timestamp()) / 60)::bigint - 1`,
      );
    },
  };
}

/**
 * Seconds until one more call fits: the previous minute's share shrinks as the window slides; when the
 * current minute alone is full, the next minute starts with it as the previous one.
 */
export function retryAfterSeconds(current: number, prev: number, weight: number, limit: number): number {
  const secondsLeft = weight * 60;
  if (current + 1 <= limit && prev > 0) {
    // prev * w' + current + 1 <= limit  ⇒  w' <= (limit - current - 1) / prev
    const target = (limit - current - 1) / prev;
    return Math.max(1, Math.ceil((weight - target) * 60));
  }
  // Next minute: current becomes the previous, weighted from 1 down.
  const next = current > 0 ? Math.max(0, 1 - (limit - 1) / current) * 60 : 0;
  return Math.max(1, Math.ceil(secondsLeft + next));
}
