import { stringify } from 'csv-stringify/sync';
import { z } from 'zod';
import { AuditRow, canonicalRow } from './chain.ts';

/** Column order of both export formats: the stored row's. */
export const EXPORT_COLUMNS: readonly (keyof AuditRow)[] = AuditRow.keyof().options;

/**
 * A row read back from an export file, before it is trusted: the verifier needs its seq and links, and
 * hashes whatever its other fields hold, so that a changed field shows as a hash mismatch at its row.
 */
export const ExportedRow = z.compile(
  z.looseObject({ seq: z.number(), prev_hash: z.string(), hash: z.string() }),
);
export type ExportedRow = z.infer<typeof ExportedRow>;

/**
 * One JSONL line: the row's canonical JSON — the very text its hash covers — with `prev_hash` and
 * `hash` appended as its last two fields. A verifier can then check a row by hashing its line's bytes
 * (see JSONL_TAIL_BYTES) instead of parsing and re-serialising it.
 */
export function toJsonLine(row: AuditRow): string {
  const tail = `,"prev_hash":${JSON.stringify(row.prev_hash)},"hash":${JSON.stringify(row.hash)}}`;
  return `${canonicalRow(row).slice(0, -1)}${tail}\n`;
}

/** Length of `,"prev_hash":"<64 hex>","hash":"<64 hex>"}`, the end of every line toJsonLine writes. */
export const JSONL_TAIL_BYTES = 14 + 64 + 10 + 64 + 2;

export function fromJsonLine(line: string): ExportedRow {
  return ExportedRow.parse(JSON.parse(line));
}

/**
 * A string cell a spreadsheet would run as a formula (= + - @ tab CR) gets a leading apostrophe; a cell
 * that already starts with an apostrophe gets one more, so the rule reverses exactly: strip one.
 */
export const neutralise = (s: string) => (/^[=+\-@\t\r']/.test(s) ? `'${s}` : s);
export const restore = (s: string) => (s.startsWith("'") ? s.slice(1) : s);

/** CSV cells of a row: strings (quoted when written), numbers, booleans, JSON for arrays and objects, null as an empty unquoted cell. */
export function toCsvRecord(row: AuditRow): (string | number | boolean | null)[] {
  return EXPORT_COLUMNS.map((c) => {
    const v = row[c];
    if (v === null) return null;
    if (typeof v === 'number' || typeof v === 'boolean') return v;
    if (typeof v === 'object') return neutralise(JSON.stringify(v));
    return neutralise(String(v));
  });
}

/** One CSV line of a row, exactly as an export writes it (the verifier compares lines with it). */
export const toCsvLine = (row: AuditRow): string =>
  stringify([toCsvRecord(row)], { quoted_string: true, cast: { boolean: (v) => String(v) } });

/** Rebuilds a row from CSV cells; `quoted[i]` tells an empty string ("") from null (empty, unquoted). */
export function fromCsvRecord(cells: string[], quoted: boolean[]): ExportedRow {
  const row: Record<string, unknown> = {};
  EXPORT_COLUMNS.forEach((c, i) => {
    const raw = cells[i] ?? '';
    if (raw === '' && !quoted[i]) return void (row[c] = null);
    if (c === 'seq') return void (row[c] = Number(raw));
    if (c === 'dry_run') return void (row[c] = raw === 'true');
    const text = restore(raw);
    row[c] = c === 'approvers' || c === 'details' ? JSON.parse(text) : text;
  });
  return ExportedRow.parse(row);
}
