import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Clock } from '../../../src/core/clock.ts';

/** What the seam asks of a clock: a valid Date, never earlier than the one before it. */
export function clockContract(name: string, make: () => Clock) {
  describe(`the clock contract: ${name}`, () => {
    it('tells the time as a valid Date', () => {
      const now = make().now();
      assert.ok(now instanceof Date);
      assert.ok(Number.isFinite(now.getTime()));
    });

    it('never goes backwards', () => {
      const clock = make();
      let last = clock.now().getTime();
      for (let i = 0; i < 1000; i++) {
        const t = clock.now().getTime();
        assert.ok(t >= last, `${t} < ${last}`);
        last = t;
      }
    });

    it('gives a new Date each time: a caller that changes one changes no other', () => {
      const clock = make();
      const a = clock.now();
      a.setTime(0);
      assert.notEqual(clock.now().getTime(), 0);
    });
  });
}
