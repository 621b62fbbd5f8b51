import { AUDIT_FIELDS, type AuditField } from './chain.ts';
import { canonicalText } from './export-pages.ts';
import { bytesOf, copyPlainText, copyWords, QUOTE, type Bytes } from './bytes.ts';
import { JsonbText } from './jsonb-text.ts';

/**
 * toJsonLine over the binary COPY of a row's columns: each line written into a buffer field by field,
 * in JCS key order, straight from the bytes the database sent. The database does no more than a
 * plain COPY of the columns; this process writes the JSON. test/e2e/audit-export-lines.test.ts holds the
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
const CODE: Record<Encoding, number> = { text: 0, jsonb: 1, uuid: 2, timestamptz: 3, int8: 4, bool: 5 };
const ENCODINGS = Int8Array.from(FIELDS, (f) => CODE[f.encoding]);
/** The encodings whose text is written between quotes: their key carries the opening quote. */
const QUOTED = new Set<Encoding>(['text', 'uuid', 'timestamptz']);

/**
 * Constant bytes laid end to end, with where each field's piece starts and ends: copied a run at a
 * time instead of a byte or a field at a time.
 */
function pieces(text: (f: { name: string; encoding: Encoding }, i: number) => string) {
  const parts = FIELDS.map(text);
  const ends = Int32Array.from(parts, (_, i) => parts.slice(0, i + 1).join('').length);
  return {
    bytes: bytesOf(Buffer.from(parts.join(''), 'latin1')),
    start: Int32Array.from(ends, (e, i) => e - parts[i]!.length),
    end: ends,
  };
}
const key = (f: { name: string }, i: number) => `${i === 0 ? '{' : ','}${JSON.stringify(f.name)}:`;
/** What precedes each field's value — `{"actor":`, `,"agent_id":"`, … — the quote too for a quoted one. */
const KEYS = pieces((f, i) => key(f, i) + (QUOTED.has(f.encoding) ? '"' : ''));
/** Each field as it reads when NULL — `{"actor":null`, `,"agent_id":null`, …: a run of NULLs is one copy. */
const NULLS = pieces((f, i) => `${key(f, i)}null`);
/** The most bytes the constant part of a line takes: every field NULL, or every key and its quotes. */
const CONSTANT_BYTES = Math.max(NULLS.bytes.bytes.length, KEYS.bytes.bytes.length + 2 * FIELDS.length) + 2;
const TRUE = ascii('true');
const FALSE = ascii('false');
/** Two lowercase hex digits per byte value. */
const HEX = ascii(Array.from({ length: 256 }, (_, b) => b.toString(16).padStart(2, '0')).join(''));
/** 2000-01-01T00:00:00Z, PostgreSQL's epoch for binary timestamps, in Unix milliseconds. */
const PG_EPOCH_MS = 946_684_800_000;
/** The jsonb fields, in line order. */
const JSONB = FIELDS.flatMap((f, i) => (f.encoding === 'jsonb' ? [i] : []));

/** Writes `bytes` at `p`; returns the position after them. */
function put(out: Uint8Array, p: number, bytes: Uint8Array): number {
  for (let i = 0; i < bytes.length; i++) out[p++] = bytes[i]!;
  return p;
}

/**
 * Writes the rows of one export as JSONL lines, one binary COPY tuple at a time (its fields in
 * RAW_COLUMNS order, at `start[i]..end[i]` of `input`, start -1 for NULL): `bound` measures the line
 * (and makes its jsonb values canonical), then `write` writes it where there is room for that.
 */
export class LineRenderer {
  private readonly canonical = canonicalText();
  /** The buffer last written, with a DataView over it (bytesOf). */
  private out: Bytes = bytesOf(Buffer.alloc(0));
  private readonly jsonbText = new JsonbText();
  /** This row's jsonb values made canonical: bytes in `scratch` (from..to), or else a string. */
  private scratch: Buffer = Buffer.allocUnsafe(16 * 1024);
  private scratchBytes: Bytes = bytesOf(this.scratch);
  private readonly from: number[] = [];
  private readonly to: number[] = [];
  private readonly jsonb: string[] = [];
  /**
   * The ISO text of the last second written, up to its '.', and where that second starts in
   * PostgreSQL's microseconds (rows come in time order: most rows' second is the last one's).
   */
  private secondStart = Number.NaN;
  private secondText: Uint8Array = new Uint8Array(0);

  /**
   * The most bytes `write` can need for this row, whose tuple takes `tupleBytes`: the constant part,
   * and each field's bytes six times over (a string that needs escapes grows at most sixfold, `\u001f`
   * for one byte; a uuid's or a timestamp's text is less). The jsonb values are made canonical here.
   */
  bound(input: Bytes, start: Int32Array, end: Int32Array, tupleBytes: number): number {
    const buf = input.bytes as Buffer;
    let bytes = CONSTANT_BYTES + 6 * tupleBytes;
    let used = 0;
    for (const f of JSONB) {
      const s = start[f]!;
      if (s === -1) continue;
      if (buf[s] !== 1) throw new Error(`jsonb binary format ${buf[s]}, not 1`);
      const length = end[f]! - s - 1;
      if (used + length > this.scratch.length) {
        this.scratch = grow(this.scratch, used + length);
        this.scratchBytes = bytesOf(this.scratch);
      }
      const written = this.jsonbText.write(input, s + 1, end[f]!, this.scratchBytes, used);
      if (written >= 0) {
        this.from[f] = used;
        this.to[f] = written;
        used = written;
      } else {
        const text = this.canonical(buf.toString('utf8', s + 1, end[f]));
        this.from[f] = -1;
        this.jsonb[f] = text;
        bytes += text.length * 3; // at most three UTF-8 bytes per UTF-16 unit
      }
    }
    return bytes;
  }

  /** Writes the line of the tuple `bound` last measured; returns the position after its newline. */
  write(input: Bytes, start: Int32Array, end: Int32Array, out: Buffer, p: number): number {
    const buf = input.bytes as Buffer;
    if (out !== this.out.bytes) this.out = bytesOf(out);
    const output = this.out;
    for (let f = 0; f < FIELDS.length; f++) {
      const s = start[f]!;
      if (s === -1) {
        // This NULL and those that follow it, at once.
        let last = f;
        while (last + 1 < FIELDS.length && start[last + 1] === -1) last++;
        p = copyWords(NULLS.bytes, NULLS.start[f]!, NULLS.end[last]!, output, p);
        f = last;
        continue;
      }
      p = copyWords(KEYS.bytes, KEYS.start[f]!, KEYS.end[f]!, output, p);
      switch (ENCODINGS[f]) {
        case 0:
          p = this.text(input, s, end[f]!, out, p);
          break;
        case 1:
          if (this.from[f]! >= 0) p = copyWords(this.scratchBytes, this.from[f]!, this.to[f]!, output, p);
          else p += out.write(this.jsonb[f]!, p);
          break;
        case 2:
          p = uuid(buf, s, out, p);
          break;
        case 3:
          p = this.timestamp(input.view, s, out, p);
          break;
        case 4:
          p = digits(int8(input.view, s), out, p);
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

  /**
   * A JSON string of UTF-8 text, after its opening quote (the key's): copied as it is, or as
   * JSON.stringify writes it where it needs an escape.
   */
  private text(input: Bytes, s: number, e: number, out: Buffer, p: number): number {
    const after = copyPlainText(input, s, e, this.out, p);
    if (after >= 0) {
      out[after] = QUOTE;
      return after + 1;
    }
    // Rare: written as JSON.stringify writes it (what toJsonLine's canonical writer does), over the quote.
    const text = (input.bytes as Buffer).toString('utf8', s, e);
    return p - 1 + out.write(JSON.stringify(text), p - 1);
  }

  /**
   * `YYYY-MM-DDTHH:MM:SS.mmmZ"` (the key wrote the opening quote), as Date.toISOString writes the
   * stored millisecond.
   */
  private timestamp(view: DataView, s: number, out: Buffer, p: number): number {
    const micros = int8(view, s);
    if (!(micros >= this.secondStart && micros < this.secondStart + 1_000_000)) {
      const second = Math.floor((Math.floor(micros / 1000) + PG_EPOCH_MS) / 1000);
      const iso = new Date(second * 1000).toISOString(); // throws for ±infinity, as toJsonLine would
      this.secondText = ascii(iso.slice(0, -4)); // through the '.'
      this.secondStart = (second * 1000 - PG_EPOCH_MS) * 1000;
    }
    p = put(out, p, this.secondText);
    // A second's start is a whole millisecond: the millisecond within it, as floor(micros / 1000) has it.
    const milli = Math.floor((micros - this.secondStart) / 1000);
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

/** A binary int8 at `s` of `view` as a number; refused beyond 2^53, where a number would round it. */
export function int8(view: DataView, s: number): number {
  const high = view.getInt32(s);
  if (high > 0x1fffff || high < -0x200000) throw new Error('a 64-bit integer beyond 2^53 in the export');
  return high * 2 ** 32 + view.getUint32(s + 4);
}

/** An integer (|n| < 2^53) in decimal, as String(n) writes it. */
function digits(n: number, out: Uint8Array, p: number): number {
  if (n < 0) {
    out[p++] = 0x2d; // -
    n = -n;
  }
  if (n <= 0x7fffffff) {
    // In 32-bit integer arithmetic: every seq below 2^31.
    let x = n | 0;
    let end = p + 1;
    for (let rest = (x / 10) | 0; rest > 0; rest = (rest / 10) | 0) end++;
    for (let q = end - 1; q >= p; q--) {
      const rest = (x / 10) | 0;
      out[q] = 0x30 + x - rest * 10;
      x = rest;
    }
    return end;
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

/** A binary uuid (16 bytes) as its text after the opening quote: 8-4-4-4-12 lowercase hex, then a quote. */
function uuid(buf: Buffer, s: number, out: Buffer, p: number): number {
  for (let i = 0; i < 16; i++) {
    if (i === 4 || i === 6 || i === 8 || i === 10) out[p++] = 0x2d; // -
    const b = buf[s + i]! * 2;
    out[p++] = HEX[b]!;
    out[p++] = HEX[b + 1]!;
  }
  out[p++] = QUOTE;
  return p;
}
