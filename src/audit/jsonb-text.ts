import { BACKSLASH, bytesOf, copyWords, QUOTE, type Bytes } from './bytes.ts';

/**
 * JCS (RFC 8785) of PostgreSQL's jsonb text, written byte for byte without parsing it into values, for
 * the shapes audit rows hold: objects and arrays of strings, safe integers, booleans and null.
 * PostgreSQL writes jsonb as `{"key": value, …}` (keys by length, then bytes) and escapes strings as
 * JSON.stringify does (`\"`, `\\`, `\b\f\n\r\t`, other controls as lowercase `\u00xx`; no `\u0000` in
 * jsonb), so a string's bytes are its JCS bytes; what remains is to drop the blanks and sort each
 * object's keys by UTF-16 code units — byte order for ASCII keys.
 *
 * Anything else — a key with an escape or a non-ASCII byte, a number that is not a safe integer written
 * as JCS writes it (`1.50`, `1e21`, `-0`, 16 digits) — is refused (`write` returns -1) and the caller
 * takes the general path (JSON.parse, then the canonical writer). test/store/jsonb-text.test.ts holds the two
 * to the same bytes on jsonb written by PostgreSQL.
 */

const COMMA = 0x2c;
const COLON = 0x3a;
const SPACE = 0x20;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
/** Deeper values take the general path (the recursion stays shallow). */
const MAX_DEPTH = 16;
/** Keys of one object written here at most; larger objects take the general path. */
const MAX_KEYS = 64;
/** A JCS integer copied as written: 0, or up to 15 digits (below 2^53) without a leading zero. */
const MAX_DIGITS = 15;

/** Thrown (one instance, no stack) to abandon a text the fast path does not take. */
const REFUSED = Object.freeze({ refused: true });

/** An object's entry: where its key (quotes included) and its value start and end in the text. */
const KEY_START = 0;
const KEY_END = 1;
const VALUE_START = 2;
const VALUE_END = 3;
const ENTRY = 4;

export class JsonbText {
  private from: Bytes = bytesOf(new Uint8Array(0));
  private src: Uint8Array = this.from.bytes;
  private end = 0;
  private i = 0;
  private to: Bytes = bytesOf(new Uint8Array(0));
  private out: Uint8Array = this.to.bytes;
  private p = 0;
  /** Per depth: the object's entries, ENTRY numbers each, and the order they are written in. */
  private readonly entries = Array.from({ length: MAX_DEPTH }, () => new Int32Array(MAX_KEYS * ENTRY));
  private readonly order = Array.from({ length: MAX_DEPTH }, () => new Int32Array(MAX_KEYS));

  /**
   * Writes the JCS of the jsonb text `src[start..end)` at `out[p]`; returns the position after it, or -1
   * when the text is not of the shapes above (what was written is then to be ignored). Never writes
   * more bytes than the text has.
   */
  write(src: Bytes, start: number, end: number, out: Bytes, p: number): number {
    this.from = src;
    this.src = src.bytes;
    this.i = start;
    this.end = end;
    this.to = out;
    this.out = out.bytes;
    this.p = p;
    try {
      this.value(0);
      return this.i === end ? this.p : -1;
    } catch (err) {
      if (err === REFUSED) return -1;
      throw err;
    }
  }

  /** Writes the value at `i` and moves past it. */
  private value(depth: number): void {
    const b = this.src[this.i];
    if (b === OPEN_OBJECT) this.object(depth);
    else if (b === OPEN_ARRAY) this.array(depth);
    else {
      const start = this.i;
      this.scalar();
      this.copy(start, this.i);
    }
  }

  /** Moves past a string, number or literal, checking that JCS writes it as it stands. */
  private scalar(): void {
    const b = this.src[this.i];
    if (b === QUOTE) this.string();
    else if (b === 0x74) this.literal('true');
    else if (b === 0x66) this.literal('false');
    else if (b === 0x6e) this.literal('null');
    else this.number();
  }

  private object(depth: number): void {
    if (depth >= MAX_DEPTH) throw REFUSED;
    const src = this.src;
    const list = this.entries[depth]!;
    this.i++; // {
    let n = 0;
    if (src[this.i] === CLOSE_OBJECT) this.i++;
    else
      for (;;) {
        if (n === MAX_KEYS) throw REFUSED;
        const e = n * ENTRY;
        list[e + KEY_START] = this.i;
        this.key();
        list[e + KEY_END] = this.i;
        this.expect(COLON);
        this.expect(SPACE);
        list[e + VALUE_START] = this.i;
        const b = src[this.i];
        if (b === OPEN_OBJECT || b === OPEN_ARRAY) this.skipContainer(depth + 1);
        else this.scalar();
        list[e + VALUE_END] = this.i;
        n++;
        if (src[this.i] === CLOSE_OBJECT) {
          this.i++;
          break;
        }
        this.expect(COMMA);
        this.expect(SPACE);
      }
    const after = this.i;
    // Insertion sort by key bytes (an object here has a handful of keys).
    const order = this.order[depth]!;
    for (let a = 0; a < n; a++) {
      let b = a - 1;
      while (b >= 0 && this.compareKeys(list, order[b]!, a) > 0) {
        order[b + 1] = order[b]!;
        b--;
      }
      order[b + 1] = a;
    }
    this.emit(OPEN_OBJECT);
    for (let k = 0; k < n; k++) {
      const e = order[k]! * ENTRY;
      if (k > 0) this.emit(COMMA);
      this.copy(list[e + KEY_START]!, list[e + KEY_END]!);
      this.emit(COLON);
      const start = list[e + VALUE_START]!;
      const b = src[start];
      if (b === OPEN_OBJECT || b === OPEN_ARRAY) {
        this.i = start;
        this.value(depth + 1);
      } else this.copy(start, list[e + VALUE_END]!);
    }
    this.emit(CLOSE_OBJECT);
    this.i = after;
  }

  private array(depth: number): void {
    if (depth >= MAX_DEPTH) throw REFUSED;
    this.i++; // [
    this.emit(OPEN_ARRAY);
    if (this.src[this.i] === CLOSE_ARRAY) {
      this.i++;
      this.emit(CLOSE_ARRAY);
      return;
    }
    for (let k = 0; ; k++) {
      if (k > 0) this.emit(COMMA);
      this.value(depth + 1);
      if (this.src[this.i] === CLOSE_ARRAY) {
        this.i++;
        break;
      }
      this.expect(COMMA);
      this.expect(SPACE);
    }
    this.emit(CLOSE_ARRAY);
  }

  /** Moves past an object or array without writing it (written once its parent's keys are sorted). */
  private skipContainer(depth: number): void {
    if (depth >= MAX_DEPTH) throw REFUSED;
    const src = this.src;
    const isObject = src[this.i] === OPEN_OBJECT;
    const close = isObject ? CLOSE_OBJECT : CLOSE_ARRAY;
    this.i++;
    if (src[this.i] === close) {
      this.i++;
      return;
    }
    for (;;) {
      if (isObject) {
        this.key();
        this.expect(COLON);
        this.expect(SPACE);
      }
      const b = src[this.i];
      if (b === OPEN_OBJECT || b === OPEN_ARRAY) this.skipContainer(depth + 1);
      else this.scalar();
      if (src[this.i] === close) {
        this.i++;
        return;
      }
      this.expect(COMMA);
      this.expect(SPACE);
    }
  }

  /** Moves past a key: a string of plain ASCII, whose bytes sort as its UTF-16 code units do. */
  private key(): void {
    const src = this.src;
    if (src[this.i] !== QUOTE) throw REFUSED;
    for (let k = this.i + 1; k < this.end; k++) {
      const c = src[k]!;
      if (c === QUOTE) {
        this.i = k + 1;
        return;
      }
      if (c === BACKSLASH || c >= 0x80) throw REFUSED;
    }
    throw REFUSED;
  }

  /** Moves past a string: to the first quote not escaped, four bytes at a time where none is near. */
  private string(): void {
    const src = this.src;
    const view = this.from.view;
    let k = this.i + 1;
    for (;;) {
      for (; k + 4 <= this.end; k += 4) {
        const w = view.getUint32(k, true);
        const quote = w ^ 0x22222222;
        const backslash = w ^ 0x5c5c5c5c;
        if ((((quote - 0x01010101) & ~quote) | ((backslash - 0x01010101) & ~backslash)) & 0x80808080) break;
      }
      if (k >= this.end) throw REFUSED;
      const c = src[k];
      if (c === QUOTE) {
        this.i = k + 1;
        return;
      }
      k += c === BACKSLASH ? 2 : 1;
    }
  }

  private number(): void {
    const src = this.src;
    const start = this.i;
    let k = start;
    if (src[k] === 0x2d) k++;
    const first = k;
    while (k < this.end && src[k]! >= 0x30 && src[k]! <= 0x39) k++;
    const digits = k - first;
    if (digits === 0 || digits > MAX_DIGITS) throw REFUSED;
    if (src[first] === 0x30 && (digits > 1 || first > start)) throw REFUSED; // 01, -0
    const next = src[k];
    if (k < this.end && next !== COMMA && next !== CLOSE_OBJECT && next !== CLOSE_ARRAY) throw REFUSED; // . e E
    this.i = k;
  }

  private literal(word: string): void {
    for (let k = 0; k < word.length; k++) if (this.src[this.i + k] !== word.charCodeAt(k)) throw REFUSED;
    this.i += word.length;
  }

  private expect(byte: number): void {
    if (this.src[this.i] !== byte) throw REFUSED;
    this.i++;
  }

  /** Entry a's key against entry b's, by bytes, quotes excluded. */
  private compareKeys(list: Int32Array, a: number, b: number): number {
    const src = this.src;
    let x = list[a * ENTRY + KEY_START]! + 1;
    const xEnd = list[a * ENTRY + KEY_END]! - 1;
    let y = list[b * ENTRY + KEY_START]! + 1;
    const yEnd = list[b * ENTRY + KEY_END]! - 1;
    for (; x < xEnd && y < yEnd; x++, y++) if (src[x] !== src[y]) return src[x]! - src[y]!;
    return xEnd - x - (yEnd - y);
  }

  private copy(from: number, to: number): void {
    this.p = copyWords(this.from, from, to, this.to, this.p);
  }

  private emit(byte: number): void {
    this.out[this.p++] = byte;
  }
}
