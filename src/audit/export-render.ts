import { AUDIT_FIELDS, type AuditField } from './chain.ts';
import { canonicalText } from './export-pages.ts';
import { bytesOf, copyPlainText, copyWords, QUOTE, type Bytes } from './bytes.ts';
import { JsonbText } from './jsonb-text.ts';

/**
 * toJsonLine over the binary COPY of a row's columns: each line written into a buffer field by field,
 * in JCS key order, straight from the bytes the database sent. The database does no more than a
 * plain COPY of the columns; this process writes the JSON. test/audit-export-lines.test.ts holds the
 * bytes to toJsonLine and to the canonicalize package for awkward values of every field.
 */

/** How a field travels in binary COPY: the type RAW_COLUMNS.sql casts it to. */
type Encoding = 'int8' | 'uuid' | 'timestamptz' | 'bool' | 'jsonb' | 'text';

const ENCODING: Partial<Record<AuditField, Encoding>> = {
  seq: 'int8',
  event_id: 'uuid',
  ts: 'timestamptz',
  dry_run: 'bool',
  approvers: 'jsonb',
  details: 'jsonb',
};

/** The line's fields in order: the hashed ones in JCS key order (all ASCII: code unit order), then the links. */
const FIELDS: readonly { name: string; encoding: Encoding }[] = [
  ...[...AUDIT_FIELDS].sort().map((name) => ({ name, encoding: ENCODING[name] ?? 'text' })),
  { name: 'prev_hash', encoding: 'text' },
  { name: 'hash', encoding: 'text' },
];

/** The COPY's select list (each column cast to the encoding read here), and where seq and hash sit in it. */
export const RAW_COLUMNS = {
  sql: FIELDS.map((f) => `${f.name}::${f.encoding}`).join(', '),
  count: FIELDS.length,
  seq: FIELDS.findIndex((f) => f.name === 'seq'),
  hash: FIELDS.length - 1,
};

const ascii = (s: string) => Uint8Array.from(s, (c) => c.charCodeAt(0));
/** What precedes each field's value — `{"actor":`, then `,"agent_id":`, … — one after the other in KEYS. */
const KEY_TEXT = FIELDS.map((f, i) => `${i === 0 ? '{' : ','}${JSON.stringify(f.name)}:`);
const KEYS = Buffer.from(KEY_TEXT.join(''), 'latin1');
const KEY_BYTES_OF = bytesOf(KEYS);
const KEY_END = Int32Array.from(KEY_TEXT, (_, i) => KEY_TEXT.slice(0, i + 1).join('').length);
const KEY_BYTES = KEYS.length;
const CODE: Record<Encoding, number> = { text: 0, jsonb: 1, uuid: 2, timestamptz: 3, int8: 4, bool: 5 };
const ENCODINGS = Int8Array.from(FIELDS, (f) => CODE[f.encoding]);
const NULL = ascii('null');
const TRUE = ascii('true');
const FALSE = ascii('false');
/** Two lowercase hex digits per byte value. */
const HEX = ascii(Array.from({ length: 256 }, (_, b) => b.toString(16).padStart(2, '0')).join(''));
/** 2000-01-01T00:00:00Z, PostgreSQL's epoch for binary timestamps, in Unix milliseconds. */
const PG_EPOCH_MS = 946_684_800_000;

/** Writes `bytes` at `p`; returns the position after them. */
function put(out: Uint8Array, p: number, bytes: Uint8Array): number {
  for (let i = 0; i < bytes.length; i++) out[p++] = bytes[i]!;
  return p;
}

/**
 * Writes the rows of one export as JSONL lines, one binary COPY tuple at a time (its fields in
 * RAW_COLUMNS order, at `start[i]..end[i]` of `buf`, start -1 for NULL): `bound` measures the line
 * (and makes its jsonb values canonical), then `write` writes it where there is room for that.
 */
export class LineRenderer {
  private readonly canonical = canonicalText();
  /** The buffers last read and written, each with a DataView over it (bytesOf). */
  private in: Bytes = bytesOf(Buffer.alloc(0));
  private out: Bytes = bytesOf(Buffer.alloc(0));
  private readonly jsonbText = new JsonbText();
  /** This row's jsonb values made canonical: bytes in `scratch` (from..to), or else a string. */
  private scratch: Buffer = Buffer.allocUnsafe(16 * 1024);
  private scratchBytes: Bytes = bytesOf(this.scratch);
  private readonly from: number[] = [];
  private readonly to: number[] = [];
  private readonly jsonb: string[] = [];
  /** The ISO text of the last second written up to its '.', and that second (rows come in time order). */
  private second = Number.NaN;
  private secondText: Uint8Array = new Uint8Array(0);

  /**
   * The most bytes `write` can need for this row. Strings that need escapes grow at most sixfold
   * (`\u001f` for one byte); the jsonb values are made canonical here, and counted as written.
   */
  bound(buf: Buffer, start: Int32Array, end: Int32Array): number {
    let bytes = KEY_BYTES + 2; // the closing brace and the newline
    let used = 0;
    for (let f = 0; f < ENCODINGS.length; f++) {
      const s = start[f]!;
      if (s === -1) bytes += 4;
      else if (ENCODINGS[f] === CODE.jsonb) {
        if (buf[s] !== 1) throw new Error(`jsonb binary format ${buf[s]}, not 1`);
        const length = end[f]! - s - 1;
        if (used + length > this.scratch.length) {
          this.scratch = grow(this.scratch, used + length);
          this.scratchBytes = bytesOf(this.scratch);
        }
        const written = this.jsonbText.write(this.reading(buf), s + 1, end[f]!, this.scratchBytes, used);
        if (written >= 0) {
          this.from[f] = used;
          this.to[f] = written;
          bytes += written - used;
          used = written;
        } else {
          const text = this.canonical(buf.toString('utf8', s + 1, end[f]));
          this.from[f] = -1;
          this.jsonb[f] = text;
          bytes += text.length * 3; // at most three UTF-8 bytes per UTF-16 unit
        }
      } else bytes += 6 * (end[f]! - s) + 40; // 40: a uuid's or a timestamp's text, quoted
    }
    return bytes;
  }

  /** Writes the line of the tuple `bound` last measured; returns the position after its newline. */
  write(buf: Buffer, start: Int32Array, end: Int32Array, out: Buffer, p: number): number {
    this.reading(buf);
    if (out !== this.out.bytes) this.out = bytesOf(out);
    for (let f = 0; f < ENCODINGS.length; f++) {
      p = copyWords(KEY_BYTES_OF, f === 0 ? 0 : KEY_END[f - 1]!, KEY_END[f]!, this.out, p);
      const s = start[f]!;
      if (s === -1) {
        p = put(out, p, NULL);
        continue;
      }
      switch (ENCODINGS[f]) {
        case 0:
          p = this.text(buf, s, end[f]!, out, p);
          break;
        case 1:
          if (this.from[f]! >= 0) p = copyWords(this.scratchBytes, this.from[f]!, this.to[f]!, this.out, p);
          else p += out.write(this.jsonb[f]!, p);
          break;
        case 2:
          p = uuid(buf, s, out, p);
          break;
        case 3:
          p = this.timestamp(buf, s, out, p);
          break;
        case 4:
          p = digits(int8(buf, s), out, p);
          break;
        case 5:
          p = put(out, p, buf[s] ? TRUE : FALSE);
          break;
      }
    }
    out[p++] = 0x7d; // }
    out[p++] = 0x0a;
    return p;
  }

  /** `buf` as the buffer being read (its DataView made once per buffer). */
  private reading(buf: Buffer): Bytes {
    if (buf !== this.in.bytes) this.in = bytesOf(buf);
    return this.in;
  }

  /** A JSON string of UTF-8 text: copied between quotes, or JSON.stringify's escapes where it needs any. */
  private text(buf: Buffer, s: number, e: number, out: Buffer, p: number): number {
    out[p] = QUOTE;
    const after = copyPlainText(this.in, s, e, this.out, p + 1);
    if (after >= 0) {
      out[after] = QUOTE;
      return after + 1;
    }
    // Rare: written as JSON.stringify writes it (what toJsonLine's canonical writer does).
    return p + out.write(JSON.stringify(buf.toString('utf8', s, e)), p);
  }

  /** `"YYYY-MM-DDTHH:MM:SS.mmmZ"`, as Date.toISOString writes the stored millisecond. */
  private timestamp(buf: Buffer, s: number, out: Buffer, p: number): number {
    const ms = Math.floor(int8(buf, s) / 1000) + PG_EPOCH_MS;
    const second = Math.floor(ms / 1000);
    if (second !== this.second) {
      const iso = new Date(second * 1000).toISOString(); // throws for ±infinity, as toJsonLine would
      this.secondText = ascii(`"${iso.slice(0, -4)}`); // through the '.'
      this.second = second;
    }
    p = put(out, p, this.secondText);
    const milli = ms - second * 1000;
    out[p++] = 0x30 + Math.floor(milli / 100);
    out[p++] = 0x30 + (Math.floor(milli / 10) % 10);
    out[p++] = 0x30 + (milli % 10);
    out[p++] = 0x5a; // Z
    out[p++] = QUOTE;
    return p;
  }
}

/** A buffer of at least `size` bytes holding `buf`'s. */
function grow(buf: Buffer, size: number): Buffer {
  const next = Buffer.allocUnsafe(Math.max(size, buf.length * 2));
  buf.copy(next);
  return next;
}

/** A binary int8 as a number; refused beyond 2^53, where a number would round it. */
export function int8(buf: Buffer, s: number): number {
  const high = buf.readInt32BE(s);
  if (high > 0x1fffff || high < -0x200000) throw new Error('a 64-bit integer beyond 2^53 in the export');
  return high * 2 ** 32 + buf.readUInt32BE(s + 4);
}

/** An integer (|n| < 2^53) in decimal, as String(n) writes it. */
function digits(n: number, out: Uint8Array, p: number): number {
  if (n < 0) {
    out[p++] = 0x2d; // -
    n = -n;
  }
  let end = p + 1;
  for (let rest = Math.floor(n / 10); rest > 0; rest = Math.floor(rest / 10)) end++;
  for (let q = end - 1; q >= p; q--) {
    const d = n % 10;
    out[q] = 0x30 + d;
    n = (n - d) / 10;
  }
  return end;
}

/** A binary uuid (16 bytes) as its quoted text: 8-4-4-4-12 lowercase hex digits. */
function uuid(buf: Buffer, s: number, out: Buffer, p: number): number {
  out[p++] = QUOTE;
  for (let i = 0; i < 16; i++) {
    if (i === 4 || i === 6 || i === 8 || i === 10) out[p++] = 0x2d; // -
    const b = buf[s + i]! * 2;
    out[p++] = HEX[b]!;
    out[p++] = HEX[b + 1]!;
  }
  out[p++] = QUOTE;
  return p;
}
