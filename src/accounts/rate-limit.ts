import type { Connection } from '../db/knex.ts';
import { systemClock, type Clock } from '../core/clock.ts';
import { rateWindows } from './store/index.ts';

export interface RateLimiter {
  /** Counts the call and returns 0, or refuses it (uncounted) and returns the seconds until one is allowed. */
  take(agentId: string, limit: number): Promise<number>;
  /** Forgets windows no estimate reads any more. */
  purge(): Promise<void>;
}

/**
 * How many calls one replica takes from the database at a time: one under 200 a minute (so the limits
 * people set are exact), a hundredth of the limit above that (so an agent allowed thousands of calls a
 * minute costs a query per hundredth, not per call). A replica that took calls it does not use keeps
 * them until the minute ends: across replicas the limit is never exceeded, and is at worst reached
 * early by what the other replicas hold.
 */
export const leaseSize = (limit: number) => Math.min(1000, Math.max(1, Math.floor(limit / 100)));

/**
 * Calls per agent in a sliding minute, counted in the database so that all replicas of a cluster count
 * against one limit. O(1) per call and per agent: the current minute's count and the previous minute's,
 * the previous weighted by how much of it the sliding minute still covers (the estimate commonly used
 * for sliding windows). One statement both decides and counts; concurrent calls of one agent serialise
 * on the row of its current minute, so the limit holds under races, on any number of replicas. The
 * minute is the database's, so replicas with skewed clocks agree.
 */
export function createRateLimiter(knex: Connection): RateLimiter {
  /** Calls taken from the database and not used yet, per agent, until the minute they count in ends. */
  const leases = new Map<string, { left: number; until: number }>();
  /** Per agent, until when it is refused: its calls past the limit are refused without a statement each. */
  const refused = refusedUntil();
  /** The lease request in flight per agent: calls that find none left wait for it rather than ask too. */
  const asking = new Map<string, Promise<number>>();

  const fromLease = (agentId: string) => {
    const lease = leases.get(agentId);
    if (!lease || lease.left <= 0 || performance.now() >= lease.until) return false;
    lease.left--;
    return true;
  };

  /** One statement: counts up to `lease` calls if the estimate allows; the first is this call's. */
  async function ask(agentId: string, limit: number, lease: number): Promise<number> {
    const asked = performance.now();
    const row = await rateWindows.lease(knex, agentId, limit, lease);
    if (!row.admitted) {
      const [current, prev, weight] = [Number(row.current), Number(row.prev), Number(row.weight)];
      // Timed from before the statement: the database's moment was later, so this is never too late.
      refused.set(agentId, limit, asked + secondsUntilOneFits(current, prev, weight, limit) * 1000);
      return retryAfterSeconds(current, prev, weight, limit);
    }
    const granted = Number(row.granted);
    if (granted > 1) {
      const until = asked + Number(row.weight) * 60_000;
      const held = leases.get(agentId);
      const left = held && performance.now() < held.until ? held.left : 0;
      leases.set(agentId, { left: left + granted - 1, until });
    }
    return 0;
  }

  return {
    async take(agentId, limit) {
      const wait = refused.wait(agentId, limit);
      if (wait > 0) return wait;
      const lease = leaseSize(limit);
      // Exact limits: one statement per call, racing calls settled by the database.
      if (lease === 1) return ask(agentId, limit, 1);
      for (;;) {
        if (fromLease(agentId)) return 0;
        const inFlight = asking.get(agentId);
        if (!inFlight) break;
        await inFlight.catch(() => undefined);
      }
      const asked = ask(agentId, limit, lease);
      asking.set(agentId, asked);
      try {
        return await asked;
      } finally {
        if (asking.get(agentId) === asked) asking.delete(agentId);
      }
    },
    async purge() {
      await rateWindows.purge(knex);
    },
  };
}

/**
 * Per agent, the moment (performance.now()) before which no call of it fits at a limit, as the database
 * last said; a changed limit forgets it.
 */
function refusedUntil() {
  const held = new Map<string, { until: number; limit: number }>();
  return {
    set(agentId: string, limit: number, until: number) {
      held.set(agentId, { until, limit });
    },
    /** Seconds to wait, if the agent was refused at this limit and no call fits yet; else 0. */
    wait(agentId: string, limit: number): number {
      const refused = held.get(agentId);
      if (!refused) return 0;
      const left = refused.until - performance.now();
      if (left > 0 && refused.limit === limit) return Math.max(1, Math.ceil(left / 1000));
      held.delete(agentId);
      return 0;
    },
  };
}

/**
 * The same sliding minute counted in this process's memory, for the embedded database: while the
 * server runs, its process alone holds the database (the data directory's lock), so a count kept here
 * is as exact as the database's, without a statement per call (at the default 60 a minute every call
 * is its own lease, one statement each in rate_windows). The minute is `clock`'s. A restart starts the
 * count afresh: within the minute of a restart an agent may be allowed up to one more limit's worth.
 */
export function createMemoryRateLimiter(clock: Clock = systemClock): RateLimiter {
  const windows = new Map<string, number>();
  const key = (agentId: string, minute: number) => `${agentId}\u0000${minute}`;
  return {
    async take(agentId, limit) {
      const e = clock.now().getTime() / 1000;
      const minute = Math.floor(e / 60);
      const weight = 1 - (e - minute * 60) / 60;
      const prev = windows.get(key(agentId, minute - 1)) ?? 0;
      const current = windows.get(key(agentId, minute)) ?? 0;
      if (current + 1 + prev * weight > limit) return retryAfterSeconds(current, prev, weight, limit);
      windows.set(key(agentId, minute), current + 1);
      return 0;
    },
    async purge() {
      const minute = Math.floor(clock.now().getTime() / 60_000);
      for (const k of windows.keys()) if (Number(k.split('\u0000')[1]) < minute - 1) windows.delete(k);
    },
  };
}

/**
 * Seconds until one more call fits: the previous minute's share shrinks as the window slides; when the
 * current minute alone is full, the next minute starts with it as the previous one.
 */
export function retryAfterSeconds(current: number, prev: number, weight: number, limit: number): number {
  return Math.max(1, Math.ceil(secondsUntilOneFits(current, prev, weight, limit)));
}

/**
 * The same, exactly: no call fits sooner, whatever any replica counts meanwhile (counts only grow,
 * and the previous minute's weight only shrinks).
 */
function secondsUntilOneFits(current: number, prev: number, weight: number, limit: number): number {
  const secondsLeft = weight * 60;
  if (current + 1 <= limit && prev > 0) {
    // prev * w' + current + 1 <= limit  ⇒  w' <= (limit - current - 1) / prev
    const target = (limit - current - 1) / prev;
    return (weight - target) * 60;
  }
  // Next minute: current becomes the previous, weighted from 1 down.
  const next = current > 0 ? Math.max(0, 1 - (limit - 1) / current) * 60 : 0;
  return secondsLeft + next;
}
