/** Byte copies for the export's hot loop: four bytes at a time through a DataView (see copyWords). */

/** The two bytes JSON text escapes besides control characters. */
export const QUOTE = 0x22;
export const BACKSLASH = 0x5c;

/** A buffer and a DataView over the same bytes. */
export interface Bytes {
  readonly bytes: Uint8Array;
  readonly view: DataView;
}

export function bytesOf(bytes: Uint8Array): Bytes {
  return { bytes, view: new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength) };
}

/**
 * Copies `from[s..e)` to `to[p]`, a 32-bit word at a time (about 2.5 ns a word on the VM of
 * docs/performance.md, against 1.4 ns a byte); returns the position after the copy. `to` must have
 * room for it.
 */
export function copyWords(from: Bytes, s: number, e: number, to: Bytes, p: number): number {
  const { bytes: src, view: sv } = from;
  const { bytes: out, view: ov } = to;
  for (; s + 4 <= e; s += 4, p += 4) ov.setUint32(p, sv.getUint32(s, true), true);
  for (; s < e; s++) out[p++] = src[s]!;
  return p;
}

/**
 * copyWords for text that JSON writes as it is — no control character, quote or backslash — or -1 as
 * soon as a word holds one. Per word: a byte below 0x20, or equal to 0x22 or 0x5c, is found with the
 * exact "has a byte less than n / has a zero byte" tests on 32 bits.
 */
export function copyPlainText(from: Bytes, s: number, e: number, to: Bytes, p: number): number {
  const { bytes: src, view: sv } = from;
  const { bytes: out, view: ov } = to;
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
