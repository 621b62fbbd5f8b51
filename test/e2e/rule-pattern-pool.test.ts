import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import {
  compilePolicy,
  createPatternPool,
  INLINE_COST,
  PatternRunFailed,
  type PatternPool,
  type WriteFacts,
} from '../../src/approval/rules/index.ts';
import { matchOne, re2 } from '../../src/approval/rules/patterns.ts';
import { call, connectHttp, startTestServer } from '../helpers/server.ts';
import { databaseKinds } from '../helpers/db.ts';

const facts = (text: string): WriteFacts => ({
  tool: 'send_message',
  facet: 'send',
  target: { target_type: 'contact', target_id: 'ct_david', display_name: 'David' },
  text,
  agent: { name: 'bot', owner: null },
});

/** A budget no match of these tests comes near: the answers, not the clock, are under test. */
const ROOMY = { chars: 10_000_000, ms: 60_000 };

/** A text long enough that every pattern below costs more than may run inline. */
const long = (body: string) => `${body} ${'lorem ipsum dolor sit amet '.repeat(400)}`.trim();

/** Pattern, then texts: each pair is run inline and on the worker, and both answers compared. */
const CASES: [string, string[]][] = [
  ['^(\\w+\\s?)*$', [long('plain words'), long('a comma, here'), 'a'.repeat(30_000) + '!']],
  ['\\b(iban|password)\\b', [long('the password is'), long('no such words'), long('IBAN DE12')]],
  [
    '(?i)iban\\s*([a-z]{2}\\d{2})',
    [long('pay to IBAN DE89 3704'), long('pay to iban fr76 3000'), long('none')],
  ],
  ['(\\d{5,})', [long('an amount of 1234567 euros'), long('12 34 567')]],
  ['^lorem', [long(''), long('x')]],
];

describe('rule patterns on worker threads', () => {
  const pools: PatternPool[] = [];
  const pool = (size?: number) => {
    const p = createPatternPool(size);
    pools.push(p);
    return p;
  };
  after(async () => {
    for (const p of pools) await p.close();
  });

  it('answers every match on a worker as the main thread does', async () => {
    const p = pool(2);
    for (const [pattern, texts] of CASES) {
      for (const text of texts) {
        assert.ok(text.length * re2(pattern).programSize() > INLINE_COST, `${pattern} is long enough`);
        for (const op of ['matches', 'find'] as const) {
          const inline = matchOne(re2(pattern), text, op);
          const answer = await p.run({ op, pattern, text }, ROOMY.ms);
          assert.equal(answer.value, inline, `${op} ${pattern} on ${text.slice(0, 30)}…`);
        }
      }
    }
    assert.ok(p.stats().workers >= 1 && p.stats().workers <= 2);
  });

  it('decides a long text the same with a worker pool as without', async () => {
    const p = pool(1);
    for (const [pattern, texts] of CASES) {
      const rules = {
        rules: [
          {
            name: 'found',
            when: `content.text.find(${JSON.stringify(pattern)}) != ""`,
            then: { require: { approvers: 3 } },
          },
          {
            name: 'matched',
            when: `content.text.matches(${JSON.stringify(pattern)})`,
            then: { require: { approvers: 2 } },
          },
        ],
      };
      const inline = compilePolicy(rules, {}, { budget: ROOMY });
      const pooled = compilePolicy(rules, {}, { budget: ROOMY, patterns: p });
      for (const text of texts) {
        assert.deepEqual(await pooled.decide(facts(text)), await inline.decide(facts(text)), pattern);
      }
    }
    assert.equal(p.stats().workers, 1, 'the long matches ran on the worker');
  });

  it('terminates a worker past its deadline, fails the rule safe, and answers the next match on a new one', async () => {
    const p = pool(1);
    // A program of some 2,100 instructions over 20,000 characters: seconds on re2js.
    const slow = { op: 'matches' as const, pattern: '(\\w+\\s?){1,300}!', text: `${'a'.repeat(20_000)}!` };
    await assert.rejects(
      p.run(slow, 20),
      (err) => err instanceof PatternRunFailed && err.reason === 'deadline',
    );
    assert.deepEqual(p.stats(), { workers: 0, terminated: 1, waiting: 0 });

    const when = `content.text.matches(${JSON.stringify(slow.pattern)})`;
    const review = compilePolicy(
      { rules: [{ name: 'slow', when, then: { require: { approvers: 3 } } }] },
      {},
      { patterns: p },
    );
    const allow = compilePolicy(
      {
        rules: [{ name: 'slow', when: `!(${when})`, then: { allow_without_review: { reason: 'no bang' } } }],
      },
      {},
      { patterns: p },
    );
    // Past the budget (20 ms): the rule that asks for review counts as matching, the one that lets the
    // write through does not.
    assert.equal((await review.decide(facts(slow.text))).rule, 'slow');
    assert.equal((await allow.decide(facts(slow.text))).rule, null);
    assert.equal(p.stats().terminated, 3);

    // The pool recovers: the next match starts a worker and is answered.
    const answer = await p.run({ op: 'find', pattern: '(b+)', text: `${'a'.repeat(50_000)}bbb` }, ROOMY.ms);
    assert.equal(answer.value, 'bbb');
    assert.equal(p.stats().workers, 1);
  });

  it('refuses matches once closed, and leaves no worker behind', async () => {
    const p = createPatternPool(2);
    await p.run({ op: 'matches', pattern: 'x', text: 'x'.repeat(100_000) }, ROOMY.ms);
    const slow = { op: 'matches' as const, pattern: '(\\w+\\s?){1,300}!', text: `${'a'.repeat(20_000)}!` };
    // Its refusal is taken at once (an unhandled rejection would fail the test before it is awaited).
    const running = p.run(slow, ROOMY.ms).then(
      () => undefined,
      (err: unknown) => err,
    );
    await p.close();
    const refused = await running;
    assert.ok(refused instanceof PatternRunFailed && refused.reason === 'closed');
    await assert.rejects(
      p.run({ op: 'matches', pattern: 'x', text: 'x' }, ROOMY.ms),
      (err) => err instanceof PatternRunFailed && err.reason === 'closed',
    );
    assert.equal(p.stats().workers, 0);
  });
});

for (const kind of databaseKinds()) {
  describe(`a catastrophic rule pattern through the server on ${kind}`, () => {
    it('answers long drafts pending, keeps other calls answered, and stops its workers with the server', async () => {
      const ports = () => process.getActiveResourcesInfo().filter((r) => r === 'MessagePort').length;
      const before = ports();
      const server = await startTestServer(kind);
      try {
        await server.services.approvals.policy.set(
          {
            rules: [
              {
                name: 'Plain words pass',
                when: 'content.text.matches("^(\\\\w+\\\\s?)*$")',
                then: { allow_without_review: { reason: 'plain words' } },
              },
            ],
          },
          'test-admin',
        );
        const agent = await connectHttp(server.url, server.demoToken);
        const drafts = Array.from({ length: 6 }, (_, i) =>
          call(agent, 'isphere_send_message', {
            target_type: 'contact',
            target_id: 'ct_david',
            content_text: `${'a'.repeat(20_000)} ${i}!`,
          }),
        );
        // Another agent's read while the drafts are evaluated: answered.
        const reader = await connectHttp(server.url, await server.addAgent('reader'));
        const read = await call(reader, 'isphere_search_contacts', { query: 'david', limit: 5 });
        assert.equal(read.ok, true);
        for (const res of await Promise.all(drafts)) {
          assert.equal(res.ok, true, JSON.stringify(res.error));
          assert.equal(res.approval.status, 'pending', 'a chair reviews: the pattern never lets it through');
        }
        // Plain words under the same rule, short enough to run inline: let through.
        const plain = await call(agent, 'isphere_send_message', {
          target_type: 'contact',
          target_id: 'ct_david',
          content_text: 'see you at the meeting',
        });
        assert.equal(plain.approval?.status, 'approved');
        await agent.close();
        await reader.close();
      } finally {
        await server.stop();
      }
      assert.equal(ports(), before, 'no worker left running after the server stopped');
    });
  });
}
