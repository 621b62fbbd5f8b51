import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isAppError } from '../../src/core/errors.ts';
import { asksMore, compilePolicy, RULE_BUDGET, type WriteFacts } from '../../src/approval/rules/index.ts';

const facts = (over: Partial<WriteFacts> = {}): WriteFacts => ({
  tool: 'send_message',
  facet: 'send',
  target: { target_type: 'contact', target_id: 'c-1', display_name: 'Ada' },
  text: 'hello',
  agent: { name: 'helper', owner: 'olga' },
  ...over,
});

const policy = (rules: unknown[], extra: Record<string, unknown> = {}) =>
  compilePolicy({ rules, ...extra }, { send_file: 2 });

describe('approval rules', () => {
  it('falls back to the per-tool default when no rule matches', async () => {
    const p = policy([]);
    assert.deepEqual((await p.decide(facts())).requirement, { kind: 'require', approvers: 1 });
    assert.deepEqual((await p.decide(facts({ tool: 'send_file' }))).requirement, {
      kind: 'require',
      approvers: 2,
    });
    assert.equal((await p.decide(facts())).rule, null);
  });

  it('lets the first matching rule decide', async () => {
    const p = policy([
      { name: 'big', when: 'content.length > 3', then: { require: { approvers: 2 } } },
      { name: 'any', when: 'true', then: { deny: { reason: 'no' } } },
    ]);
    const d = await p.decide(facts());
    assert.equal(d.rule, 'big');
    assert.deepEqual(d.requirement, { kind: 'require', approvers: 2 });
    assert.equal((await p.decide(facts({ text: 'hi' }))).rule, 'any');
  });

  it('refuses a rule that does not type-check, naming it', () => {
    const cases: [string, RegExp][] = [
      ['content.length > "x"', /no such overload/],
      ['nobody == 1', /Unknown variable/],
      ['target.nope', /No such key/],
      ['content.text', /not bool/],
      ['content.text ==', /.+/],
      ['content.text.find("EUR (") != ""', /find\(\) pattern/],
      ['content.text.matches("(?=password)")', /matches\(\) pattern: RE2/],
      ['content.text.find("(a)\\\\1") == ""', /find\(\) pattern: RE2/],
      ['content.text.matches("[")', /matches\(\) pattern/],
    ];
    assert.throws(
      () =>
        policy([{ name: 'two of one', when: 'true', then: { require: { approvers: 2, users: ['ada'] } } }]),
      (err: unknown) =>
        isAppError(err, 'CONFIG_INVALID', 'rule_invalid') && /more approvers/.test(err.message),
    );
    for (const [when, message] of cases) {
      assert.throws(
        () => policy([{ name: 'Payments over EUR 10,000', when, then: { deny: { reason: 'r' } } }]),
        (err: unknown) =>
          isAppError(err, 'CONFIG_INVALID', 'rule_invalid') &&
          err.message.includes('"Payments over EUR 10,000"') &&
          message.test(err.message),
        when,
      );
    }
  });

  it('refuses a malformed policy document with the key at fault', () => {
    const bad: unknown[] = [
      { rules: [{ name: 'x', when: 'true', then: { require: { approvers: 0 } } }] },
      { rules: [{ name: 'x', when: 'true', then: { maybe: {} } }] },
      { rules: [{ name: 'x', when: 'true', then: { deny: { reason: 'r' } }, extra: 1 }] },
      {
        rules: [
          { name: 'x', when: 'true', then: { deny: { reason: 'r' } } },
          { name: 'x', when: 'false', then: { deny: { reason: 'r' } } },
        ],
      },
      { timezone: 'Mars/Olympus', rules: [] },
      {
        rules: [{ name: 'x', when: 'true', then: { require: { approvers: 1, roles: ['a'], users: ['b'] } } }],
      },
      { rules: [{ name: 'x\u200b', when: 'true', then: { deny: { reason: 'r' } } }] },
    ];
    for (const doc of bad) {
      assert.throws(
        () => compilePolicy(doc, {}),
        (err: unknown) => isAppError(err, 'CONFIG_INVALID', 'policy_invalid'),
      );
    }
  });

  it('versions the canonical form: key order does not matter, any edit does', () => {
    const rule = { name: 'r', when: 'true', then: { deny: { reason: 'x' } } };
    const a = policy([rule]);
    const b = compilePolicy({ rules: [{ then: rule.then, when: rule.when, name: 'r' }] }, { send_file: 2 });
    assert.equal(a.version, b.version);
    assert.match(a.version, /^[0-9a-f]{64}$/);
    assert.notEqual(policy([{ ...rule, when: 'false' }]).version, a.version);
    assert.notEqual(compilePolicy({ rules: [rule] }, { send_file: 3 }).version, a.version);
  });

  it('matches text an agent disguised with invisible characters, full-width forms or case', async () => {
    const p = policy([
      {
        name: 'invoices',
        when: 'content.normalized.contains("invoice")',
        then: { require: { approvers: 2 } },
      },
    ]);
    for (const text of ['INVOICE', 'in\u200bvoice', 'ｉｎｖｏｉｃｅ', 'inv\u2066oice']) {
      assert.equal((await p.decide(facts({ text }))).rule, 'invoices', text);
    }
  });

  it('reads an amount out of the text with find()', async () => {
    const p = policy([
      {
        name: 'Payments over EUR 10,000',
        when: 'content.text.find("EUR ([0-9]+)") != "" && int(content.text.find("EUR ([0-9]+)")) > 10000',
        then: { require: { approvers: 2 } },
      },
    ]);
    assert.equal((await p.decide(facts({ text: 'pay EUR 12000 now' }))).rule, 'Payments over EUR 10,000');
    assert.equal((await p.decide(facts({ text: 'pay EUR 900 now' }))).rule, null);
    assert.equal((await p.decide(facts({ text: 'no amount' }))).rule, null);
  });

  it('fails safe when an expression cannot be evaluated on this input', async () => {
    const when = 'double(content.text) > 1.0';
    const review = policy([{ name: 'r', when, then: { require: { approvers: 3 } } }]);
    assert.equal((await review.decide(facts({ text: 'not a number' }))).rule, 'r');
    const allow = policy([{ name: 'a', when, then: { allow_without_review: { reason: 'x' } } }]);
    assert.equal((await allow.decide(facts({ text: 'not a number' }))).rule, null);
  });

  it('runs patterns on RE2: a catastrophic pattern answers, and past the budget fails safe', async () => {
    const when = 'content.text.matches("^(\\\\w+\\\\s?)*$")';
    const review = policy([{ name: 'words only', when, then: { require: { approvers: 3 } } }]);
    const allow = policy([{ name: 'words only', when, then: { allow_without_review: { reason: 'x' } } }]);
    // Short texts are answered by the pattern itself, as RE2 reads it.
    assert.equal((await review.decide(facts({ text: 'hello world' }))).rule, 'words only');
    assert.equal((await review.decide(facts({ text: 'hello world!' }))).rule, null);
    assert.equal((await allow.decide(facts({ text: 'hello world' }))).rule, 'words only');
    // A text long enough to exhaust the budget: the review rule counts as matching, the allowing one not.
    const hostile = 'a'.repeat(RULE_BUDGET.chars + 1) + '!';
    assert.equal((await review.decide(facts({ text: hostile }))).rule, 'words only');
    assert.equal((await allow.decide(facts({ text: hostile }))).rule, null);
  });

  it('runs find() on RE2, the budget shared by every pattern of one evaluation', async () => {
    const p = policy([
      {
        name: 'many reads',
        // Each find() of another pattern reads the whole text: a few fit the budget, eleven do not (the
        // same pattern on the same text is read once per decision).
        when: `[${Array.from({ length: 11 }, (_, i) => `content.text.find("(z${i})") == ""`).join(', ')}].all(b, b) == false`,
        then: { require: { approvers: 2 } },
      },
    ]);
    const text = 'y'.repeat(RULE_BUDGET.chars / 10);
    assert.equal((await p.decide(facts({ text: 'short' }))).rule, null);
    assert.equal((await p.decide(facts({ text }))).rule, 'many reads');
  });

  it('flags an upstream write by the short strings of its arguments, keys and values, at any depth', async () => {
    const p = policy([
      {
        name: 'Disguised',
        when: 'content.flags.exists(f, f in ["mixed_script", "confusable", "invisible"])',
        then: { require: { approvers: 2 } },
      },
    ]);
    const upstream = (args: Record<string, unknown>) =>
      facts({
        tool: 'gh__create_issue',
        facet: 'upstream_write',
        target: { target_type: 'mcp_tool', target_id: 'gh__create_issue', display_name: 'gh / create_issue' },
        text: '',
        upstream: { name: 'gh', tool: 'create_issue', arguments: args },
      });
    const lookalike = 'acme/p\u0430yroll'; // a Cyrillic а
    for (const args of [
      { repo: lookalike, title: 'bump' },
      { where: { repos: ['acme/site', lookalike] } },
      { [lookalike]: true },
      { repo: 'acme/payroll\u200B' },
    ])
      assert.equal((await p.decide(upstream(args))).rule, 'Disguised', JSON.stringify(args));
    assert.equal((await p.decide(upstream({ repo: 'acme/payroll', title: 'Привет' }))).rule, null);
    // A long argument is a body, not what the write acts on: not read for flags (ARGUMENT_FLAGS).
    assert.equal((await p.decide(upstream({ body: `${lookalike} ${'x'.repeat(300)}` }))).rule, null);
  });

  it('reads the time of day in the policy time zone', async () => {
    const p = policy([{ name: 'night', when: 'time.hour < 7', then: { require: { approvers: 2 } } }], {
      timezone: 'Europe/Berlin',
    });
    assert.equal((await p.decide(facts(), new Date('2026-12-03T05:30:00Z'))).rule, 'night');
    assert.equal((await p.decide(facts(), new Date('2026-12-03T06:30:00Z'))).rule, null);
  });

  it('says whether a requirement asks more than another', () => {
    const req = (approvers: number, who: { roles?: string[]; users?: string[] } = {}) => ({
      kind: 'require' as const,
      approvers,
      ...who,
    });
    assert.equal(asksMore(req(2), req(1)), true);
    assert.equal(asksMore(req(1), req(2)), false);
    assert.equal(asksMore(req(1), req(1)), false);
    assert.equal(asksMore(req(1, { roles: ['finance'] }), req(1)), true);
    assert.equal(asksMore(req(1), req(1, { roles: ['finance'] })), false);
    assert.equal(asksMore(req(1, { roles: ['finance', 'legal'] }), req(1, { roles: ['finance'] })), false);
    assert.equal(asksMore(req(1, { roles: ['legal'] }), req(1, { roles: ['finance'] })), true);
    assert.equal(asksMore(req(1, { users: ['a'] }), req(1, { roles: ['finance'] })), true);
    assert.equal(asksMore({ kind: 'deny', reason: 'x' }, req(1)), true);
    assert.equal(asksMore({ kind: 'allow_without_review', reason: 'x' }, req(2)), false);
    assert.equal(asksMore(req(1), { kind: 'allow_without_review', reason: 'x' }), true);
  });
});
