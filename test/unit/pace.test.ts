import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createPace } from '../../src/audit/pace.ts';

describe('the pace of refusals per address', () => {
  it('answers a burst at once, then one every 1/perSecond s, in order', async () => {
    const pace = createPace({ perSecond: 20 });
    const started = performance.now();
    const done: number[] = [];
    const waits = Array.from({ length: 40 }, (_, i) => pace.wait('198.51.100.7').then(() => done.push(i)));
    // The first 20 (one second's worth) are not held; the other 20 wait their turn.
    assert.equal(pace.waiting(), 20);
    await Promise.all(waits);
    assert.deepEqual(
      done,
      [...done].sort((a, b) => a - b),
      'answered in the order they came',
    );
    // The 40th is due 20 intervals of 50 ms after the first: no sooner (a loaded machine is only later).
    assert.ok(performance.now() - started >= 950, `${performance.now() - started} ms`);
    assert.equal(pace.waiting(), 0);
  });

  it('holds only the address that is past its pace', async () => {
    const pace = createPace({ perSecond: 5 });
    const order: string[] = [];
    const flood = Array.from({ length: 15 }, () => pace.wait('203.0.113.9').then(() => order.push('flood')));
    await pace.wait('192.0.2.1').then(() => order.push('other'));
    assert.ok(order.filter((o) => o === 'flood').length <= 5, order.join(' '));
    await Promise.all(flood);
  });

  it('answers at once past its most waiting, and not at all held when unpaced', async () => {
    const capped = createPace({ perSecond: 2, maxWaiting: 3 });
    const waits = Array.from({ length: 10 }, () => capped.wait('198.51.100.8'));
    assert.equal(capped.waiting(), 3, 'two in the burst, three waiting, five answered at once');
    await Promise.all(waits);
    const unpaced = createPace({ perSecond: 0 });
    const all = Array.from({ length: 1000 }, () => unpaced.wait('198.51.100.9'));
    assert.equal(unpaced.waiting(), 0);
    await Promise.all(all);
  });

  it('lets every held refusal go at once on a stop', async () => {
    const pace = createPace({ perSecond: 1 });
    const started = performance.now();
    const waits = Array.from({ length: 30 }, () => pace.wait('198.51.100.10'));
    assert.equal(pace.waiting(), 29);
    pace.release();
    await Promise.all(waits);
    // Paced, the 30th would be answered 29 s later.
    assert.ok(performance.now() - started < 29_000);
    assert.equal(pace.waiting(), 0);
  });
});
