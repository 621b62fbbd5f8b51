import { rectifyConfusion } from 'unicode-confusables';
import { BIDI, HIDDEN, SELECTOR } from './visible-classes.ts';
import { HIDDEN_NAMES, SCRIPTS, VARIATION_BASES } from './unicode-tables.ts';

/**
 * The visible form of text: what a chair is shown on every channel (web, CLI, Slack, e-mail) and what
 * approval rules match against. Built on Unicode's data, not on lists of characters kept by hand:
 *
 * - every control (other than newline and tab), format character (bidi controls, zero-width
 *   characters, tags), default-ignorable, unassigned, private-use or surrogate code point, and every
 *   line or paragraph separator is shown as a marker naming it (`⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧`) and
 *   counted: the classes come from Node's ICU (visible-classes.ts), the names from the UCD
 *   (unicode-tables.ts);
 * - a variation selector is kept only where it completes a sequence Unicode defines for the character
 *   before it (StandardizedVariants.txt, emoji-variation-sequences.txt; an ideographic selector after
 *   an ideograph, whose sequences the Ideographic Variation Database registers outside the UCD), and
 *   only the first after it: anywhere else it is a marker. One selector can carry a byte, so a run of
 *   them behind an emoji can carry a whole hidden message.
 */

const NAMES = new Map<number, string>(
  HIDDEN_NAMES.split(';').map((entry) => {
    const colon = entry.indexOf(':');
    return [parseInt(entry.slice(0, colon), 16), entry.slice(colon + 1)];
  }),
);

/** Selector → the base characters it completes a defined sequence for. */
const BASES = new Map<number, Set<number>>(
  Object.entries(VARIATION_BASES).map(([selector, ranges]) => {
    const set = new Set<number>();
    for (const range of ranges.split(',')) {
      const [from, to] = range.split('-').map((h) => parseInt(h, 16));
      for (let cp = from!; cp <= (to ?? from!); cp++) set.add(cp);
    }
    return [Number(selector), set];
  }),
);

const IDEOGRAPHIC = /\p{Ideographic}/u;
const isIdeographicSelector = (cp: number) => cp >= 0xe0100 && cp <= 0xe01ef;

/** Whether `selector` right after `base` is a variation sequence Unicode defines. */
function completes(base: number | undefined, selector: number): boolean {
  if (base === undefined) return false;
  if (BASES.get(selector)?.has(base)) return true;
  return isIdeographicSelector(selector) && IDEOGRAPHIC.test(String.fromCodePoint(base));
}

/** Whether `ch` is shown as a marker wherever it stands (selectors are decided by their context). */
const hiddenAlone = (ch: string): boolean => ch !== '\n' && ch !== '\t' && HIDDEN.test(ch);

const isPlainAscii = (cp: number) => cp >= 0x20 && cp < 0x7f;

/** Plain ASCII text (the common case): nothing hidden, nothing to fold, its own NFKC and NFD. */
const PLAIN_ASCII = /^[\x20-\x7e\n\t]*$/;

/** What a hidden code point is called: its Unicode name, a tag's letter, or its kind. */
export function nameOf(cp: number): string {
  const named = NAMES.get(cp);
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

/** Why a code point is a marker: it reorders text, is a stray variation selector, or renders as nothing. */
export type HiddenKind = 'bidi' | 'variation_selector' | 'invisible';

/** A run of text as shown: plain text, or a hidden code point. */
export type Piece = { text: string } | { hidden: number; marker: string; kind: HiddenKind };

/** `text` split into plain runs and hidden code points, in order. */
export function pieces(text: string): Piece[] {
  const out: Piece[] = [];
  let plain = '';
  // The character a selector may complete a sequence with: the one just before it, if shown plainly.
  let base: number | undefined;
  for (const ch of text) {
    const cp = ch.codePointAt(0)!;
    let kind: HiddenKind | undefined;
    if (isPlainAscii(cp)) kind = undefined;
    else if (SELECTOR.test(ch)) kind = completes(base, cp) ? undefined : 'variation_selector';
    else if (hiddenAlone(ch)) kind = BIDI.test(ch) ? 'bidi' : 'invisible';
    base = kind || SELECTOR.test(ch) ? undefined : cp;
    if (!kind) {
      plain += ch;
      continue;
    }
    if (plain) out.push({ text: plain });
    plain = '';
    out.push({ hidden: cp, marker: markerOf(cp), kind });
  }
  if (plain) out.push({ text: plain });
  return out;
}

/** How many hidden code points `text` holds. */
export function countHidden(text: string): number {
  // Plain ASCII text (the common case) holds none: no need to split it.
  if (PLAIN_ASCII.test(text)) return 0;
  return pieces(text).filter((p) => 'hidden' in p).length;
}

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

const HIDDEN_OR_SELECTOR = new RegExp(`${HIDDEN.source}|${SELECTOR.source}`, 'gu');

/** `text` without any hidden code point and without any variation selector (newline and tab stay). */
export function withoutHidden(text: string): string {
  if (PLAIN_ASCII.test(text)) return text;
  // One pass of the regular expression engine: a character at a time in JavaScript took 1 µs a character.
  return text.replace(HIDDEN_OR_SELECTOR, (ch) => (ch === '\n' || ch === '\t' ? ch : ''));
}

const NON_ASCII_DIGIT = /(?![0-9])\p{Nd}/u;
const DIGIT = /\p{Nd}/u;
const digitValues = new Map<number, number>();

/**
 * The value of a decimal digit (`\p{Nd}`): Unicode encodes every decimal digit set as ten consecutive
 * code points from 0 to 9, sets sometimes one after the other (the mathematical digits), so the value
 * is the distance from the start of the run of digits, modulo ten.
 */
function digitValue(cp: number): number {
  let v = digitValues.get(cp);
  if (v === undefined) {
    let start = cp;
    while (DIGIT.test(String.fromCodePoint(start - 1))) start--;
    v = (cp - start) % 10;
    digitValues.set(cp, v);
  }
  return v;
}

/** `text` with every decimal digit of any script (`\p{Nd}`) replaced by the ASCII digit of its value. */
export const foldDigits = (text: string): string =>
  NON_ASCII_DIGIT.test(text) ? text.replace(/\p{Nd}/gu, (d) => String(digitValue(d.codePointAt(0)!))) : text;

/**
 * The form of a text a rule matches against without being dodged (content.normalized): no hidden code
 * points and no variation selectors, compatibility forms folded (NFKC: full-width and mathematical
 * letters become letters), every decimal digit ASCII, lower case.
 */
export const normalizedText = (text: string): string =>
  PLAIN_ASCII.test(text)
    ? text.toLowerCase()
    : foldDigits(withoutHidden(text.normalize('NFKC')).normalize('NFKC')).toLowerCase();

/**
 * The Unicode TR39 skeleton of `text`: NFD, each character replaced by its prototype from UTS 39's
 * confusables data, NFD again. Two strings that look alike have the same skeleton. Hidden code points
 * and variation selectors are dropped and compatibility forms folded first (NFKC), so that a
 * full-width or mathematical imitation has the skeleton of what it imitates.
 */
export const skeletonOf = (text: string): string =>
  prototypesOf(withoutHidden(text.normalize('NFKC')).normalize('NFD')).normalize('NFD');

const prototypes = new Map<string, string>();

/**
 * Each character replaced by its UTS 39 prototype (unicode-confusables' data), one character at a time
 * as UTS 39 defines it, each character's prototype looked up once: the library builds an object per
 * character of the whole text, about 1 µs a character, where a rule may read 64 KiB of it.
 */
function prototypesOf(text: string): string {
  const out: string[] = [];
  for (const ch of text) {
    let prototype = prototypes.get(ch);
    if (prototype === undefined) {
      prototype = rectifyConfusion(ch);
      if (prototypes.size >= 20_000) prototypes.clear();
      prototypes.set(ch, prototype);
    }
    out.push(prototype);
  }
  return out.join('');
}

/** For UTS 39's resolved script sets: writing systems that combine scripts, per script. */
const AUGMENTED: Readonly<Record<string, readonly string[]>> = {
  Han: ['Han_with_Bopomofo', 'Japanese', 'Korean'],
  Hiragana: ['Japanese'],
  Katakana: ['Japanese'],
  Hangul: ['Korean'],
  Bopomofo: ['Han_with_Bopomofo'],
};
const SCRIPT_RES = SCRIPTS.map((s) => [s, new RegExp(`\\p{Script_Extensions=${s}}`, 'u')] as const);
const scriptCache = new Map<number, readonly string[]>();

/** A code point's Script_Extensions (ICU's), empty for Common and Inherited (they go with any script). */
function scriptsOfChar(ch: string): readonly string[] {
  const cp = ch.codePointAt(0)!;
  if (cp < 0x80) return /[A-Za-z]/.test(ch) ? ['Latin'] : [];
  let found = scriptCache.get(cp);
  if (!found) {
    found = SCRIPT_RES.filter(([, re]) => re.test(ch)).map(([s]) => s);
    if (scriptCache.size >= 20_000) scriptCache.clear();
    scriptCache.set(cp, found);
  }
  return found;
}

/** The scripts the letters of `text` belong to (Script_Extensions; Common and Inherited left out), sorted. */
export function scriptsOf(text: string): string[] {
  const all = new Set<string>();
  for (const ch of text) for (const s of scriptsOfChar(ch)) all.add(s);
  return [...all].sort();
}

/**
 * Whether `text` is mixed-script in UTS 39's sense: no one script (or writing system such as Japanese,
 * which combines Han and kana) covers every character, by the intersection of their augmented
 * Script_Extensions. "Аlice" with a Cyrillic А is mixed; "東京タワー" is not.
 */
export function mixesScripts(text: string): boolean {
  let resolved: ReadonlySet<string> | undefined;
  for (const ch of text) {
    const set = augmentedOf(ch);
    if (set === undefined || set === resolved) continue;
    resolved = resolved ? new Set([...resolved].filter((s) => set.has(s))) : set;
    if (resolved.size === 0) return true;
  }
  return false;
}

const augmentedCache = new Map<number, ReadonlySet<string> | undefined>();

/**
 * A code point's augmented Script_Extensions (its scripts and the writing systems that combine them),
 * undefined for Common and Inherited; one set per code point, looked up once, so that a run of letters
 * of one script is one comparison each.
 */
function augmentedOf(ch: string): ReadonlySet<string> | undefined {
  const cp = ch.codePointAt(0)!;
  if (augmentedCache.has(cp)) return augmentedCache.get(cp);
  const scx = scriptsOfChar(ch);
  const set = scx.length === 0 ? undefined : new Set(scx.flatMap((s) => [s, ...(AUGMENTED[s] ?? [])]));
  if (augmentedCache.size >= 20_000) augmentedCache.clear();
  augmentedCache.set(cp, set);
  return set;
}

/**
 * Whether `word` is written with characters from beyond ASCII yet looks like an ASCII word: its skeleton
 * is all ASCII (a Cyrillic "раураl", a full-width or mathematical "payroll").
 */
export const imitatesAscii = (word: string): boolean => !isAscii(word) && isAscii(skeletonOf(word));

/** Whether every code unit of `text` is ASCII. */
function isAscii(text: string): boolean {
  for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) > 0x7f) return false;
  return true;
}

/** What a text is doing to look like something else, as approval rules read it (content.flags). */
export type TextFlag =
  'invisible' | 'bidi' | 'variation_selector' | 'mixed_script' | 'confusable' | 'non_ascii_digits';

const WORD = /[\p{L}\p{M}\p{Nd}\p{Pc}\p{Cf}\p{Variation_Selector}]+/gu;

/**
 * The flags of `text`, in a fixed order: markers by kind; words that mix scripts or imitate an ASCII
 * word (each word on its own: a message may well hold words of several scripts); digits beyond ASCII.
 */
export function flagsOf(text: string): TextFlag[] {
  const flags = new Set<TextFlag>();
  if (!/^[\x20-\x7e\n\t]*$/.test(text)) {
    for (const p of pieces(text)) if ('hidden' in p) flags.add(p.kind);
    // Each distinct word is read once, and reading stops when both flags are raised: a text repeats its
    // words, and one flagged word flags the text.
    const seen = new Set<string>();
    for (const [word] of text.normalize('NFC').matchAll(WORD)) {
      if (seen.has(word)) continue;
      seen.add(word);
      const plain = withoutHidden(word);
      if (!flags.has('mixed_script') && mixesScripts(plain)) flags.add('mixed_script');
      // Digits alone are non_ascii_digits (below), folded for the rules: an Arabic-Indic ٥ is no "o".
      if (!flags.has('confusable') && /\p{L}/u.test(plain) && imitatesAscii(plain)) flags.add('confusable');
      if (flags.has('mixed_script') && flags.has('confusable')) break;
    }
    if (NON_ASCII_DIGIT.test(text)) flags.add('non_ascii_digits');
  }
  const order: TextFlag[] = [
    'invisible',
    'bidi',
    'variation_selector',
    'mixed_script',
    'confusable',
    'non_ascii_digits',
  ];
  return order.filter((f) => flags.has(f));
}
