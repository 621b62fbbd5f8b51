import { createHash } from 'node:crypto';
import fs from 'node:fs';
import { parse } from 'csv-parse';
import { z } from 'zod';
import { chainHash } from './chain.ts';
import type { AuditRow } from './chain.ts';
import {
  EXPORT_COLUMNS,
  fromCsvRecord,
  fromJsonLine,
  JSONL_TAIL_BYTES,
  toCsvLine,
  toJsonLine,
  type ExportedRow,
} from './format.ts';

/** What the verifier needs of one row: where it is, its seq and links, and whether its hash holds. */
export interface RowFacts {
  line: number;
  seq: number;
  prev_hash: string;
  hash: string;
  hashValid: boolean;
  /**
   * Set when the row's content holds but its line is not byte for byte what the exporter writes for it
   * (a field added, removed, renamed or re-ordered, a number or white space reformatted): tampering too.
   */
  notCanonical?: true;
  /** For a `checkpoint` row whose hash holds: its details, what it records of the checkpoint. */
  checkpoint?: { details: unknown };
}

/** One line of an export: a row's facts, or why it is not a row. */
export type Item = { line: number; facts: RowFacts } | { line: number; error: string };

/** Why a line is not a row, in one line: the fields that do not fit, or the parser's message. */
function problemOf(err: unknown): string {
  if (err instanceof z.ZodError)
    return err.issues.map((i) => `${i.path.join('.') || 'row'}: ${i.message}`).join('; ');
  return err instanceof Error ? err.message : String(err);
}

/**
 * The facts of a row read by parsing. `canonical` says whether the line was exactly the exporter's
 * text for this row; a line that is not is refused even when its hash holds, since the hash covers the
 * row's canonical form, not the bytes a reader was handed.
 */
function factsOf(line: number, row: ExportedRow, canonical: (row: AuditRow) => boolean): Item {
  let hashValid: boolean;
  try {
    hashValid = chainHash(row.prev_hash, row) === row.hash;
  } catch (err) {
    return { line, error: `not a valid row (${problemOf(err)})` };
  }
  const facts: RowFacts = { line, seq: row.seq, prev_hash: row.prev_hash, hash: row.hash, hashValid };
  // With a valid hash every hashed field is present and as stored, so the row can be written again.
  if (hashValid && !canonical(row as unknown as AuditRow)) facts.notCanonical = true;
  if (hashValid && row.kind === 'checkpoint') facts.checkpoint = { details: row.details };
  return { line, facts };
}

const TAIL_OPEN = Buffer.from(',"prev_hash":"');
const TAIL_MID = Buffer.from('","hash":"');
const TAIL_CLOSE = Buffer.from('"}');
const CLOSE_BRACE = Buffer.from('}');
const SEQ_KEY = Buffer.from('"seq":');
const CHECKPOINT_KIND = Buffer.from('"kind":"checkpoint"');

function isLowerHex(buf: Buffer, from: number, to: number): boolean {
  for (let i = from; i < to; i++) {
    const c = buf[i]!;
    if (!((c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66))) return false;
  }
  return true;
}

/**
 * A line as toJsonLine writes it (`buf[from, to)`), checked over its own bytes: its hash must be
 * SHA-256(prev_hash ‖ the line up to its tail, closed with "}"). When it is, those bytes are the
 * canonical row that was hashed, so its seq can be read off them: the last "seq" key, since every
 * field that sorts after it (source, target_ref, target_type, tool, trace_id) holds a string or null.
 * Any other line — another layout, or a changed row — is left to the parsing path (undefined).
 */
function canonicalLine(line: number, buf: Buffer, from: number, to: number): Item | undefined {
  const n = to - JSONL_TAIL_BYTES;
  if (n - from < 2) return undefined;
  // A checkpoint row (or any line that may be one) is parsed: its details are checked too. The search
  // is bounded to this line: over the rest of the chunk it would read up to a megabyte a line.
  if (buf.subarray(from, n).includes(CHECKPOINT_KIND)) return undefined;
  if (
    TAIL_OPEN.compare(buf, n, n + 14) !== 0 ||
    TAIL_MID.compare(buf, n + 78, n + 88) !== 0 ||
    TAIL_CLOSE.compare(buf, n + 152, to) !== 0 ||
    !isLowerHex(buf, n + 14, n + 78)
  )
    return undefined;
  const hash = buf.toString('latin1', n + 88, n + 152);
  const computed = createHash('sha256')
    .update(buf.subarray(n + 14, n + 78))
    .update(buf.subarray(from, n))
    .update(CLOSE_BRACE)
    .digest('hex');
  if (computed !== hash) return undefined;
  let at = buf.lastIndexOf(SEQ_KEY, n) + SEQ_KEY.length;
  let seq = 0;
  for (let c = buf[at]!; c >= 0x30 && c <= 0x39; c = buf[++at]!) seq = seq * 10 + (c - 0x30);
  const prev_hash = buf.toString('latin1', n + 14, n + 78);
  return { line, facts: { line, seq, prev_hash, hash, hashValid: true } };
}

function jsonlItem(line: number, buf: Buffer, from: number, to: number): Item {
  const fast = canonicalLine(line, buf, from, to);
  if (fast) return fast;
  const text = buf.toString('utf8', from, to);
  let row: ExportedRow;
  try {
    row = fromJsonLine(text);
  } catch (err) {
    const what = err instanceof z.ZodError ? 'not a valid row' : 'not a JSON row';
    return { line, error: `${what} (${problemOf(err)})` };
  }
  // Not canonical by the fast path's test; parsed, the row says whether its content or only its form changed.
  return factsOf(line, row, (r) => toJsonLine(r) === `${text}\n`);
}

/** JSONL rows, a chunk of the file at a time; lines split on LF (a CR before it dropped), blank ones skipped. */
async function* jsonlItems(file: string): AsyncGenerator<Item[]> {
  let line = 0;
  let rest: Buffer = Buffer.alloc(0);
  // A CR before the LF is kept in the line: the exporter writes none, so such a line is not canonical.
  const push = (items: Item[], buf: Buffer, from: number, to: number) => {
    line++;
    if (to > from) items.push(jsonlItem(line, buf, from, to));
  };
  for await (const chunk of fs.createReadStream(file, { highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>) {
    const buf = rest.length > 0 ? Buffer.concat([rest, chunk]) : chunk;
    const items: Item[] = [];
    let from = 0;
    for (let nl = buf.indexOf(10); nl !== -1; nl = buf.indexOf(10, from)) {
      push(items, buf, from, nl);
      from = nl + 1;
    }
    rest = buf.subarray(from);
    yield items;
  }
  if (rest.length > 0) {
    const items: Item[] = [];
    push(items, rest, 0, rest.length);
    yield items;
  }
}

async function* csvItems(file: string): AsyncGenerator<Item[]> {
  const parser = fs.createReadStream(file).pipe(
    parse({
      cast: (value, context) => ({ value, quoted: context.quoting }),
      relax_column_count: true,
      raw: true,
    }),
  );
  let line = 0;
  for await (const { record: cells, raw } of parser as AsyncIterable<{
    record: { value: string; quoted: boolean }[];
    raw: string;
  }>) {
    line++;
    if (line === 1) {
      if (cells.map((c) => c.value).join(',') !== EXPORT_COLUMNS.join(','))
        yield [{ line, error: 'unexpected CSV header' }];
      continue;
    }
    let row: ExportedRow;
    try {
      row = fromCsvRecord(
        cells.map((c) => c.value),
        cells.map((c) => c.quoted),
      );
    } catch (err) {
      yield [{ line, error: `not a valid row (${problemOf(err)})` }];
      continue;
    }
    yield [factsOf(line, row, (r) => toCsvLine(r) === raw)];
  }
}

/** The rows of an export file with their line numbers (1-based, header counted for CSV), in batches. */
export function readExport(file: string, format: 'jsonl' | 'csv'): AsyncGenerator<Item[]> {
  return format === 'jsonl' ? jsonlItems(file) : csvItems(file);
}
