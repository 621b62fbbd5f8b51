import type { Queryable } from '../db/knex.ts';
import { canonicalParsed } from './canonical.ts';
import { AUDIT_FIELDS, rowFromDb, type AuditRow } from './chain.ts';
import type { ExportFilter } from './export-filter.ts';
import { events } from './store/index.ts';

export const EXPORT_PAGE = 500;
/** Pages read ahead while the rows are dense. */
const PREFETCH = 2;

/**
 * Rows of the filter up to `maxSeq`, in seq order, a page at a time: memory stays flat at any size.
 * Each query reads a window of seq values (widened while a filter leaves pages sparse), so that the
 * primary key bounds every query whatever the planner believes about the table. The window doubles
 * without a fixed ceiling, so a gap in seq of any size (a log never has one; a table altered behind
 * its back may) is crossed in a few dozen queries, not walked a bounded window at a time. `columns`
 * names the columns as SQL (all of them when absent), `map` turns a database row into what the caller
 * wants.
 */
async function* pages<T extends { seq: number }>(
  knex: Queryable,
  filter: ExportFilter,
  maxSeq: number,
  columns: string | undefined,
  map: (raw: Record<string, unknown>) => T,
): AsyncGenerator<T[]> {
  const conditions = events.filterConditions(filter);
  const fetch = (after: number, upto: number) => {
    const q = events.exportWindow(knex, { after, upto, limit: EXPORT_PAGE, conditions }, columns);
    const page = q.then((rows: Record<string, unknown>[]) => ({ rows: rows.map(map), upto }));
    page.catch(() => {}); // awaited below; a page nobody waits for any more must not go unhandled
    return page;
  };
  // Windows no wider than a page are read whole, so several can be in flight at once (the database
  // works on the next ones while this process writes one); a wider window may be cut short by the
  // page limit, and is read on from its last row, one query at a time.
  let window = EXPORT_PAGE;
  let after = 0;
  const queue: Promise<{ rows: T[]; upto: number }>[] = [];
  const fill = () => {
    while (queue.length < (window <= EXPORT_PAGE ? PREFETCH : 1) && after < maxSeq) {
      const upto = Math.min(maxSeq, after + window);
      queue.push(fetch(after, upto));
      after = upto;
    }
  };
  fill();
  while (queue.length > 0) {
    const page = await queue.shift()!;
    if (page.rows.length === EXPORT_PAGE && window > EXPORT_PAGE) {
      after = page.rows.at(-1)!.seq;
      window = Math.max(EXPORT_PAGE, window / 2);
    } else if (page.rows.length < EXPORT_PAGE / 2) window = Math.min(window * 2, Number.MAX_SAFE_INTEGER);
    fill();
    if (page.rows.length > 0) yield page.rows;
  }
}

/** Audit rows of the filter up to `maxSeq`, page by page (see pages). */
export function exportPages(
  knex: Queryable,
  filter: ExportFilter,
  maxSeq: number,
): AsyncGenerator<AuditRow[]> {
  return pages(knex, filter, maxSeq, undefined, rowFromDb);
}

/** Fields whose JSON the database cannot write canonically (nested keys, numbers): rendered here. */
const RENDERED_HERE = new Set<string>(['approvers', 'details']);

/** The JSON of one scalar field, as JSON.stringify writes it (PostgreSQL escapes strings alike). */
function jsonOf(field: string): string {
  if (field === 'seq') return 'seq::text';
  if (field === 'ts') return `'"' || to_char(ts at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') || '"'`;
  if (field === 'dry_run')
    return `case when dry_run is null then 'null' when dry_run then 'true' else 'false' end`;
  return `coalesce(to_json(${field})::text, 'null')`;
}

/**
 * toJsonLine in SQL: the canonical row is written by the database field by field in JCS key order,
 * as text pieces around the fields rendered here (approvers, details), then the tail with prev_hash
 * and hash. Columns: seq, hash, text0, json0, text1, json1, text2.
 */
export const LINE_COLUMNS = (() => {
  const columns = ['seq', 'hash'];
  let text: string[] = [];
  let piece = 0;
  for (const [i, field] of [...AUDIT_FIELDS].sort().entries()) {
    text.push(`'${i === 0 ? '{' : ','}${JSON.stringify(field)}:'`);
    if (RENDERED_HERE.has(field)) {
      columns.push(`${text.join(' || ')} as text${piece}`, `${field}::text as json${piece}`);
      text = [];
      piece++;
    } else text.push(jsonOf(field));
  }
  text.push(`',"prev_hash":' || to_json(prev_hash)::text || ',"hash":' || to_json(hash)::text || '}'`);
  columns.push(`${text.join(' || ')} as text${piece}`);
  return { sql: columns.join(', '), pieces: piece };
})();

/** A function that writes the canonical JSON of a jsonb column's text (null: SQL NULL), for one export. */
export function canonicalText(): (json: unknown) => string {
  const canonical = canonicalParsed();
  return (json) => (json === null ? 'null' : canonical(JSON.parse(String(json))));
}

/**
 * The JSONL lines of the filter's rows up to `maxSeq` (exactly what toJsonLine writes), page by page,
 * with each row's seq and hash. The database writes most of each line, so a row costs here one small
 * JSON parse instead of decoding and re-serialising every field.
 */
export function exportLines(
  knex: Queryable,
  filter: ExportFilter,
  maxSeq: number,
): AsyncGenerator<{ seq: number; hash: string; line: string }[]> {
  const canonical = canonicalText();
  return pages(knex, filter, maxSeq, LINE_COLUMNS.sql, (raw) => {
    let line = '';
    for (let i = 0; i < LINE_COLUMNS.pieces; i++) line += `${raw[`text${i}`]}${canonical(raw[`json${i}`])}`;
    return {
      seq: Number(raw.seq),
      hash: String(raw.hash),
      line: `${line}${raw[`text${LINE_COLUMNS.pieces}`]}\n`,
    };
  });
}
