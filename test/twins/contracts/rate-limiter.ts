import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { RateLimiter } from '../../../src/accounts/index.ts';

/**
 * What the seam asks of the rate limiter, held for the real one (rate_windows, test/store/) and its
 * twin (test/unit/): calls counted per agent up to the limit; past it, refused uncounted with the
 * seconds to wait. Each case takes agents of its own, so that the minutes they count in are fresh.
 */
export function rateLimiterContract(
  name: string,
  open: () => Promise<{ limiter: RateLimiter; agent(): Promise<string> }>,
) {
  describe(`the rate limiter contract: ${name}`, () => {
    it('counts calls up to the limit, then refuses with whole seconds to wait', async () => {
      const { limiter, agent } = await open();
      const a = await agent();
      const waits = [];
      for (let i = 0; i < 4; i++) waits.push(await limiter.take(a, 3));
      assert.deepEqual(waits.slice(0, 3), [0, 0, 0]);
      assert.ok(Number.isInteger(waits[3]) && waits[3]! >= 1 && waits[3]! <= 120, `waits ${waits[3]}`);
    });

    it('counts each agent apart', async () => {
      const { limiter, agent } = await open();
      const [a, b] = [await agent(), await agent()];
      assert.equal(await limiter.take(a, 1), 0);
      assert.ok((await limiter.take(a, 1)) >= 1);
      assert.equal(await limiter.take(b, 1), 0);
    });

    it('does not count a refused call: a higher limit admits the agent at once', async () => {
      const { limiter, agent } = await open();
      const a = await agent();
      assert.equal(await limiter.take(a, 2), 0);
      assert.equal(await limiter.take(a, 2), 0);
      for (let i = 0; i < 5; i++) assert.ok((await limiter.take(a, 2)) >= 1);
      // Had the refusals counted, 7 calls would be past a limit of 4.
      assert.equal(await limiter.take(a, 4), 0);
      assert.equal(await limiter.take(a, 4), 0);
      assert.ok((await limiter.take(a, 4)) >= 1);
    });

    it('purges without forgetting the current minute', async () => {
      const { limiter, agent } = await open();
      const a = await agent();
      assert.equal(await limiter.take(a, 1), 0);
      await limiter.purge();
      assert.ok((await limiter.take(a, 1)) >= 1);
    });
  });
}
