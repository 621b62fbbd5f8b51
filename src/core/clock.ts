/**
 * What tells the call seam the time: the system's in production; a twin's in unit tests
 * (test/twins/clock.ts), so that an envelope's started_at and finished_at can be asserted exactly.
 */
export interface Clock {
  now(): Date;
}

export const systemClock: Clock = { now: () => new Date() };
