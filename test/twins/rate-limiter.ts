import { retryAfterSeconds, type RateLimiter } from '../../src/accounts/rate-limit.ts';
import { systemClock, type Clock } from '../../src/core/clock.ts';

/**
 * The rate limiter's twin: the same sliding minute as accounts/rate-limit.ts (the current minute's
 * calls plus the previous minute's, weighted by how much of it the window still covers), counted in a
 * map on `clock` instead of in rate_windows on the database's clock. The same answer when refused
 * (retryAfterSeconds). test/twins/contracts/rate-limiter.ts holds both to it.
 */
export function twinRateLimiter(
  clock: Clock = systemClock,
): RateLimiter & { calls(agentId: string): number } {
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
    /** The calls counted for the agent in the current minute (what the test can look at). */
    calls(agentId) {
      return windows.get(key(agentId, Math.floor(clock.now().getTime() / 60_000))) ?? 0;
    },
  };
}
