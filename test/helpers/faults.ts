import type { FaultPoint, Faults } from '../../src/core/faults.ts';

/** The process kills itself (SIGKILL: no clean-up of any kind) when a call reaches `point`. */
export const crashAt = (point: FaultPoint): Faults => ({
  at(reached) {
    if (reached === point) process.kill(process.pid, 'SIGKILL');
  },
});

/** Every handler waits `ms` before it starts: a slow tool, for deadline and outage tests. */
export const slowHandlers = (ms: number): Faults => ({
  async at(reached) {
    if (reached === 'before_handler') await new Promise((r) => setTimeout(r, ms));
  },
});
