import type { Clock } from '../../src/core/clock.ts';

/** The clock's twin: time stands still until the test moves it (test/twins/contracts/clock.ts). */
export interface TwinClock extends Clock {
  /** Moves the time on by `ms`. */
  advance(ms: number): void;
}

export function twinClock(start = '2026-12-07T12:00:00.000Z'): TwinClock {
  let t = Date.parse(start);
  return {
    now: () => new Date(t),
    advance(ms) {
      if (ms < 0) throw new Error('the twin clock never goes backwards');
      t += ms;
    },
  };
}
