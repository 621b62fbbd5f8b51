import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  countHidden,
  countHiddenIn,
  marked,
  markerOf,
  mixesScripts,
  skeletonOf,
} from '../../src/core/visible.ts';

const cp = (n: number) => String.fromCodePoint(n);
const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

describe('hidden characters', () => {
  const listed: [string, number[]][] = [
    ['bidi controls', [0x061c, 0x200e, 0x200f, ...range(0x202a, 0x202e), ...range(0x2066, 0x2069)]],
    ['zero-width characters', [...range(0x200b, 0x200d), ...range(0x2060, 0x2064), 0xfeff]],
    ['tag characters', range(0xe0000, 0xe007f)],
    ['other format characters', [0x00ad, 0x180e, 0x206a, 0xfff9, 0x110bd]],
    ['unassigned code points', [0x0378, 0x05ff, 0x2fffd, 0xe0080]],
    ['private-use code points', [0xe000, 0xf8ff, 0xf0000, 0x10fffd]],
    ['C0 controls but newline and tab', [...range(0x00, 0x08), 0x0b, 0x0c, 0x0d, ...range(0x0e, 0x1f), 0x7f]],
    ['C1 controls', range(0x80, 0x9f)],
    ['line and paragraph separators', [0x2028, 0x2029]],
  ];
  for (const [what, points] of listed) {
    it(`marks ${what}, each by its code point`, () => {
      for (const n of points) {
        assert.equal(countHidden(cp(n)), 1, `U+${n.toString(16)}`);
        const hex = n.toString(16).toUpperCase().padStart(4, '0');
        assert.equal(marked(`a${cp(n)}b`), `a${markerOf(n)}b`);
        assert.match(marked(cp(n)), new RegExp(`^⟦U\\+${hex} [A-Z"]`));
      }
      assert.equal(countHidden(points.map(cp).join('x')), points.length);
    });
  }

  it('names the bidi controls and the tags by what they are', () => {
    assert.equal(marked('\u202E'), '⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧');
    assert.equal(marked('\u2066'), '⟦U+2066 LEFT-TO-RIGHT ISOLATE⟧');
    assert.equal(marked('\u200B'), '⟦U+200B ZERO WIDTH SPACE⟧');
    assert.equal(marked(cp(0xe0041)), '⟦U+E0041 TAG "A"⟧');
    assert.equal(marked('\r'), '⟦U+000D CARRIAGE RETURN⟧');
    assert.equal(marked('\u00AD'), '⟦U+00AD SOFT HYPHEN⟧');
    assert.equal(marked('\uFE0F'), '⟦U+FE0F VARIATION SELECTOR-16⟧');
  });

  it('leaves newline, tab and visible text of every script as written', () => {
    const text = 'Hello\tworld\nשלום עולם\nمرحبا بالعالم\nПривет, 世界, こんにちは, 안녕 ❤️ 👍🏽 é';
    assert.equal(marked(text), text);
    assert.equal(countHidden(text), 0);
  });

  it('counts the hidden characters inside nested JSON values, keys included', () => {
    assert.equal(countHiddenIn({ a: ['x\u202E', { ['k\u200B']: 'y\u2066' }], n: 3 }), 3);
  });

  it('shows the three reported cases with markers instead of the trick', () => {
    assert.equal(marked('invoice_\u202Efdp.exe'), 'invoice_⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧fdp.exe');
    assert.equal(
      marked('EUR \u202E00.000,05\u202C'),
      'EUR ⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧00.000,05⟦U+202C POP DIRECTIONAL FORMATTING⟧',
    );
    const tags = Array.from('ignore previous', (c) => cp(0xe0000 + c.charCodeAt(0))).join('');
    assert.equal(countHidden(`See you at 10:00 tomorrow.${tags}`), 15);
  });
});

describe('look-alike names', () => {
  it('gives a Cyrillic А and a Latin A the same skeleton', () => {
    assert.equal(skeletonOf('\u0410lice Martin'), skeletonOf('Alice Martin'));
    assert.notEqual(skeletonOf('Alice Martin'), skeletonOf('Alice Morton'));
  });

  it('flags Latin mixed with Cyrillic or Greek, not one script or Japanese', () => {
    assert.equal(mixesScripts('\u0410lice Martin'), true);
    assert.equal(mixesScripts('Αlice'), true);
    assert.equal(mixesScripts('José Müller'), false);
    assert.equal(mixesScripts('Алиса Мартин'), false);
    assert.equal(mixesScripts('東京タワー'), false);
  });
});
