/** Byte copies for the export's hot loop: a word at a time through DataViews (see copyWords). */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

export function viewOf(buf: Uint8Array): DataView {
  return new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
}

/**
 * Copies `src[s..e)` to `out[p]` four bytes at a time (a JavaScript loop moves a word about as fast as
 * a byte); returns the position after the copy. `out` must have room for it.
 */
export function copyWords(
  sv: DataView,
  src: Uint8Array,
  s: number,
  e: number,
  ov: DataView,
  out: Uint8Array,
  p: number,
) {
  for (; s + 4 <= e; s += 4, p += 4) ov.setUint32(p, sv.getUint32(s, true), true);
  for (; s < e; s++) out[p++] = src[s]!;
  return p;
}

/**
 * copyWords for text that JSON writes as it is — no control character, quote or backslash — or -1 as
 * soon as a word holds one. Per word: a byte below 0x20, or equal to 0x22 or 0x5c, is found with the
 * exact "has a byte less than n / has a zero byte" tests on 32 bits.
 */
export function copyPlainText(
  sv: DataView,
  src: Uint8Array,
  s: number,
  e: number,
  ov: DataView,
  out: Uint8Array,
  p: number,
) {
  for (; s + 4 <= e; s += 4, p += 4) {
    const w = sv.getUint32(s, true);
    const quote = w ^ 0x22222222;
    const backslash = w ^ 0x5c5c5c5c;
    if (
      (((w - 0x20202020) & ~w) | ((quote - 0x01010101) & ~quote) | ((backslash - 0x01010101) & ~backslash)) &
      0x80808080
    )
      return -1;
    ov.setUint32(p, w, true);
  }
  for (; s < e; s++) {
    const b = src[s]!;
    if (b < 0x20 || b === QUOTE || b === BACKSLASH) return -1;
    out[p++] = b;
  }
  return p;
}
