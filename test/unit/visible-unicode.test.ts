import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { compilePolicy, inputOf, type WriteFacts } from '../../src/approval/rules/index.ts';
import { VARIATION_BASES } from '../../src/core/unicode-tables.ts';
import {
  countHidden,
  flagsOf,
  marked,
  markerOf,
  mixesScripts,
  normalizedText,
  pieces,
  skeletonOf,
} from '../../src/core/visible.ts';

/**
 * The visible form of text, tested on the categories Unicode defines rather than on a few examples:
 * the cases are generated from Node's ICU (property escapes) and from the tables generated from the UCD.
 */

const cp = (n: number) => String.fromCodePoint(n);
/** Every code point of the given class. */
function every(re: RegExp): number[] {
  const out: number[] = [];
  for (let n = 0; n <= 0x10ffff; n++) {
    if (n >= 0xd800 && n <= 0xdfff) continue;
    if (re.test(cp(n))) out.push(n);
  }
  return out;
}
const hexOf = (n: number) => `U+${n.toString(16).toUpperCase().padStart(4, '0')}`;

const SELECTORS = every(/\p{Variation_Selector}/u);
const DEFINED = new Map<number, number[]>(
  Object.entries(VARIATION_BASES).map(([s, ranges]) => [
    Number(s),
    ranges.split(',').flatMap((r) => {
      const [a, b] = r.split('-').map((h) => parseInt(h, 16));
      return Array.from({ length: (b ?? a!) - a! + 1 }, (_, i) => a! + i);
    }),
  ]),
);

const facts = (text: string): WriteFacts => ({
  tool: 'send_message',
  facet: 'send',
  target: { target_type: 'contact', target_id: 'c-1', display_name: 'Ada' },
  text,
  agent: { name: 'helper', owner: null },
});
const input = (text: string) => inputOf(facts(text), new Date(), 'UTC');

describe('every default-ignorable, format and bidi control character', () => {
  const points = every(/[\p{Default_Ignorable_Code_Point}\p{Cf}\p{Bidi_Control}]/u);
  it(`marks each of the ${points.length} between two letters, named, counted, and out of the rules' text`, () => {
    assert.ok(points.length > 4000);
    for (const n of points) {
      // "a" completes no variation sequence, so a selector after it is a marker like the rest.
      const text = `a${cp(n)}b`;
      assert.equal(marked(text), `a${markerOf(n)}b`, hexOf(n));
      assert.equal(countHidden(text), 1, hexOf(n));
      assert.equal(normalizedText(text), 'ab', hexOf(n));
      assert.ok(flagsOf(text).length > 0, hexOf(n));
    }
  });

  it('names every bidi control and flags it as bidi', () => {
    for (const n of every(/\p{Bidi_Control}/u)) {
      assert.match(markerOf(n), /^⟦U\+[0-9A-F]{4} [A-Z][A-Z -]+⟧$/, hexOf(n));
      assert.deepEqual(flagsOf(`x${cp(n)}y`), ['bidi'], hexOf(n));
    }
  });
});

describe('variation selectors', () => {
  it('keeps every sequence Unicode defines, and marks a second selector after it', () => {
    let sequences = 0;
    for (const [selector, bases] of DEFINED) {
      for (const base of bases) {
        const seq = cp(base) + cp(selector);
        assert.equal(countHidden(seq), 0, `${hexOf(base)} ${hexOf(selector)}`);
        assert.equal(countHidden(seq + cp(selector)), 1, `${hexOf(base)} ${hexOf(selector)} twice`);
        sequences++;
      }
    }
    assert.ok(sequences > 1500, `${sequences} sequences`);
  });

  it('marks every selector outside a defined sequence, and flags it', () => {
    for (const selector of SELECTORS) {
      const text = `x${cp(selector)}`;
      assert.equal(countHidden(text), 1, hexOf(selector));
      assert.deepEqual(flagsOf(text), ['variation_selector'], hexOf(selector));
      // At the start of a text, after a space, after another selector: never a sequence.
      assert.equal(countHidden(`${cp(selector)} ${cp(selector)}`), 2, hexOf(selector));
    }
  });

  it('shows the bytes smuggled behind an emoji, one marker each', () => {
    // One selector per byte: "IBAN DE89…" riding on the 🙂 of a friendly message.
    const payload = Array.from(Buffer.from('IBAN DE89370400440532013000'), (b) =>
      cp(b < 16 ? 0xfe00 + b : 0xe0100 + b - 16),
    ).join('');
    const text = `Thanks for the update, talk soon 🙂${payload}`;
    assert.equal(countHidden(text), Array.from(payload).length);
    assert.ok(marked(text).startsWith('Thanks for the update, talk soon 🙂⟦U+E01'));
    assert.equal(normalizedText(text), 'thanks for the update, talk soon 🙂');
    // The emoji presentation of a heart is a defined sequence, and stays as written.
    assert.equal(marked('I ❤️ it'), 'I ❤️ it');
  });

  it('keeps an ideographic variation selector after an ideograph only', () => {
    assert.equal(countHidden('葛\u{E0100}'), 0);
    assert.equal(countHidden('g\u{E0100}'), 1);
  });
});

describe('decimal digits of every script', () => {
  const zeros = every(/\p{Nd}/u).filter((n) => !/\p{Nd}/u.test(cp(n - 1)) || (n - zeroOf(n)) % 10 === 0);
  function zeroOf(n: number): number {
    let z = n;
    while (/\p{Nd}/u.test(cp(z - 1))) z--;
    return z;
  }
  it(`folds each of the ${zeros.length} digit sets to ASCII for the rules, and flags them`, () => {
    assert.ok(zeros.length > 60);
    for (const zero of zeros) {
      const digits = Array.from({ length: 10 }, (_, i) => cp(zero + i)).join('');
      assert.equal(normalizedText(`EUR ${digits}`), 'eur 0123456789', hexOf(zero));
      if (zero !== 0x30) assert.ok(flagsOf(digits).includes('non_ascii_digits'), hexOf(zero));
    }
  });

  it('lets a rule read an amount written in Arabic-Indic digits', async () => {
    const p = compilePolicy(
      {
        rules: [
          {
            name: 'Large amounts',
            when: 'content.normalized.find("([0-9]+)") != "" && int(content.normalized.find("([0-9]+)")) > 10000',
            then: { require: { approvers: 2 } },
          },
        ],
      },
      {},
    );
    assert.equal((await p.decide(facts('pay \u0665\u0660\u0660\u0660\u0660 now'))).rule, 'Large amounts');
    assert.equal((await p.decide(facts('pay \u0665\u0660 now'))).rule, null);
  });
});

describe('letters of other scripts that look Latin', () => {
  // Every letter outside Latin whose skeleton is one ASCII letter: a homoglyph of it.
  const homoglyphs = every(/(?!\p{Script=Latin})\p{L}/u).filter((n) => /^[A-Za-z]$/.test(skeletonOf(cp(n))));

  it(`flags each of the ${homoglyphs.length} inside a Latin word, and folds it in the skeleton`, () => {
    assert.ok(homoglyphs.length > 100);
    for (const n of homoglyphs) {
      const word = `pa${cp(n)}roll`;
      const flags = flagsOf(word);
      // Letters of a script are mixed with the Latin ones; compatibility forms (mathematical letters,
      // Common script) imitate them.
      assert.ok(
        flags.includes('mixed_script') || flags.includes('confusable'),
        `${hexOf(n)} ${flags.join()}`,
      );
      assert.equal(skeletonOf(word), skeletonOf(`pa${skeletonOf(cp(n))}roll`), hexOf(n));
    }
  });

  it('flags a word written wholly in another script that looks Latin as confusable, not mixed', () => {
    for (const word of [
      '\u0440\u0430\u0443\u0440\u0430l'.slice(0, 5),
      '\u0441\u043e\u0440',
      'ｐａｙｒｏｌｌ',
    ]) {
      assert.deepEqual(flagsOf(word), ['confusable'], word);
    }
    assert.deepEqual(flagsOf('Привет, как дела? 東京タワー'), []);
    assert.equal(mixesScripts('\u0410lice'), true);
  });

  it('gives rules the skeleton, so "pаyroll" with a Cyrillic а is "payroll"', async () => {
    const p = compilePolicy(
      {
        rules: [
          {
            name: 'Payroll',
            when: 'content.skeleton.contains(skeleton("payroll"))',
            then: { deny: { reason: 'payroll goes by the HR system' } },
          },
          {
            name: 'Disguised',
            when: 'content.flags.exists(f, f in ["invisible", "bidi", "variation_selector", "mixed_script", "confusable"])',
            then: { require: { approvers: 2 } },
          },
        ],
      },
      {},
    );
    for (const text of [
      'the p\u0430yroll file',
      'the PAYROLL file',
      'the ｐａｙｒｏｌｌ file',
      'the pay\uFE0Froll file',
    ])
      assert.equal((await p.decide(facts(text))).rule, 'Payroll', text);
    for (const text of ['\u202Edrowssap\u202C', 'p\u0430ss', 'hi\u200B', 'see \u{1D41A}'])
      assert.equal((await p.decide(facts(text))).rule, 'Disguised', text);
    assert.equal((await p.decide(facts('the figures for Q3'))).rule, null);
    assert.deepEqual(input('p\u0430y \u0665').content.flags, [
      'mixed_script',
      'confusable',
      'non_ascii_digits',
    ]);
  });
});

describe('the pieces of a text', () => {
  it('say why each marker is one', () => {
    const kinds = pieces('a\u202Eb\u200Bc\uFE0F').flatMap((p) => ('kind' in p ? [p.kind] : []));
    assert.deepEqual(kinds, ['bidi', 'invisible', 'variation_selector']);
  });
});
