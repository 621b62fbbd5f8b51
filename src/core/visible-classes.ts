/**
 * The classes of code points the visible form of text is built on, as Node's ICU answers them (its
 * Unicode version: `process.versions.unicode`). Kept apart from visible.ts so that the script writing
 * unicode-tables.ts can use them without the tables it writes.
 */

/**
 * Shown as a marker wherever they stand: controls (other than newline and tab, see visible.ts), format
 * characters (bidi controls, zero-width characters, tags, …), unassigned, private-use and surrogate code
 * points, line and paragraph separators, and every default-ignorable code point (which render as
 * nothing). Variation selectors are default-ignorable too; visible.ts keeps one that completes a
 * sequence Unicode defines.
 */
export const HIDDEN =
  /[\p{Cc}\p{Cf}\p{Cn}\p{Co}\p{Cs}\p{Zl}\p{Zp}\p{Default_Ignorable_Code_Point}\p{Bidi_Control}]/u;

/** Variation selectors: U+FE00–FE0F, U+E0100–E01EF and the Mongolian free variation selectors. */
export const SELECTOR = /\p{Variation_Selector}/u;

/** Characters that change the order in which text is shown. */
export const BIDI = /\p{Bidi_Control}/u;
