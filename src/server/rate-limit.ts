/**
 * Calls per agent in a sliding minute, across all sessions of the agent in this process. Memory is
 * bounded: at most `limit` timestamps per agent.
 */
export function createRateLimiter(now: () => number = Date.now) {
  const windows = new Map<string, number[]>();
  return {
    /** Counts the call and returns 0, or refuses it and returns the seconds until one is allowed. */
    take(agentId: string, limit: number): number {
      const t = now();
      const recent = (windows.get(agentId) ?? []).filter((s) => s > t - 60_000);
      if (recent.length >= limit) {
        windows.set(agentId, recent);
        return Math.max(1, Math.ceil((recent[0]! + 60_000 - t) / 1000));
      }
      recent.push(t);
      windows.set(agentId, recent);
      return 0;
    },
  };
}
