import type { Knex } from 'knex';
import { canonicalParsed } from './canonical.ts';
import { AUDIT_FIELDS, rowFromDb, type AuditRow } from './chain.ts';
import type { ExportFilter } from './export-filter.ts';

export const EXPORT_PAGE = 500;
/** Pages read ahead while the rows are dense. */
const PREFETCH = 2;

/**
 * The filter as SQL conditions with `?` placeholders, one list for both ways of reading rows: bound
 * as parameters by the pages below, written as literals by the COPY of export-copy.ts.
 */
export function filterConditions(filter: ExportFilter): { sql: string; values: string[] }[] {
  const out: { sql: string; values: string[] }[] = [];
  const equal = (column: string, value: string | undefined) => {
    if (value !== undefined) out.push({ sql: `${column} = ?`, values: [value] });
  };
  if (filter.since) out.push({ sql: 'ts >= ?', values: [filter.since] });
  if (filter.until) out.push({ sql: 'ts < ?', values: [filter.until] });
  equal('agent_id', filter.agent_id);
  equal('tool', filter.tool);
  equal('kind', filter.kind);
  equal('result', filter.result);
  equal('target_ref', filter.target_ref);
  const approval = filter.approval;
  if (approval)
    out.push({ sql: '(approval_id = ? or approval_request_id = ?)', values: [approval, approval] });
  return out;
}

/**
 * Rows of the filter up to `maxSeq`, in seq order, a page at a time: memory stays flat at any size.
 * Each query reads a window of seq values (widened while a filter leaves pages sparse), so that the
 * primary key bounds every query whatever the planner believes about the table. `select` names the
 * columns, `map` turns a database row into what the caller wants.
 */
async function* pages<T extends { seq: number }>(
  knex: Knex,
  filter: ExportFilter,
  maxSeq: number,
  select: (q: Knex.QueryBuilder) => Knex.QueryBuilder,
  map: (raw: Record<string, unknown>) => T,
): AsyncGenerator<T[]> {
  const conditions = filterConditions(filter);
  const fetch = (after: number, upto: number) => {
    const q = select(knex('audit_events'))
      .where('seq', '>', after)
      .where('seq', '<=', upto)
      .orderBy('seq')
      .limit(EXPORT_PAGE);
    for (const c of conditions) q.whereRaw(c.sql, c.values);
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
    } else if (page.rows.length < EXPORT_PAGE / 2) window = Math.min(window * 2, 1 << 24);
    fill();
    if (page.rows.length > 0) yield page.rows;
  }
}

/** Audit rows of the filter up to `maxSeq`, page by page (see pages). */
export function exportPages(knex: Knex, filter: ExportFilter, maxSeq: number): AsyncGenerator<AuditRow[]> {
  return pages(knex, filter, maxSeq, (q) => q.select('*'), rowFromDb);
}

/**
 * The line's fields in JCS key order, then the chain links, as the export writes them: the scalar ones
 * in parts, each a composite type of migration 20261204110000 whose `row_to_json` the database writes
 * in one call; between the parts, the jsonb fields (approvers, details), whose text is not canonical
 * (nested keys, numbers): those are written here.
 */
const PARTS = [
  { type: 'audit_export_head', fields: ['actor', 'agent_id', 'approval_id', 'approval_request_id'] },
  { type: 'audit_export_middle', fields: ['content_sha256'] },
  {
    type: 'audit_export_tail',
    fields: [
      ...['dry_run', 'error_code', 'event_id', 'file_sha256', 'kind', 'request_id', 'result', 'seq'],
      ...['source', 'target_ref', 'target_type', 'tool', 'trace_id', 'ts', 'prev_hash', 'hash'],
    ],
  },
] as const;
const RENDERED_HERE = ['approvers', 'details'] as const;

/** A part's value expression: the column, but ts as toJsonLine writes it (milliseconds, Z). */
const valueOf = (field: string) =>
  field === 'ts' ? `to_char(ts at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')` : field;

/**
 * toJsonLine in SQL: the database writes each part as `{"field":value,…}` and each jsonb field as its
 * text; the line is `{`, the parts without their braces, each jsonb field canonical under its key, `}`
 * (joinLine). Columns: seq, hash, part0, json0, part1, json1, part2.
 */
export const LINE_COLUMNS = (() => {
  // The parts and the fields between them must be the row's fields, sorted, then the links.
  const order = PARTS.flatMap((part, i) => [...part.fields, ...(RENDERED_HERE[i] ? [RENDERED_HERE[i]] : [])]);
  const expected = [...[...AUDIT_FIELDS].sort(), 'prev_hash', 'hash'];
  if (order.join() !== expected.join())
    throw new Error(`the export's parts (${order.join()}) are not the audit row's fields (${expected.join()})`);
  const columns = ['seq', 'hash'];
  for (const [i, part] of PARTS.entries()) {
    columns.push(`row_to_json(row(${part.fields.map(valueOf).join(', ')})::${part.type})::text as part${i}`);
    if (RENDERED_HERE[i]) columns.push(`${RENDERED_HERE[i]}::text as json${i}`);
  }
  return { sql: columns.join(', '), pieces: RENDERED_HERE.length };
})();

/** What comes before the jsonb field `i` of a line: its key. */
export const JSON_KEYS = RENDERED_HERE.map((field) => `,${JSON.stringify(field)}:`);

/** One line from its parts (each `{…}` as the database wrote it) and its canonical jsonb fields. */
function joinLine(parts: string[], json: string[]): string {
  let line = '{';
  for (let i = 0; i < parts.length; i++) {
    line += `${i > 0 ? ',' : ''}${parts[i]!.slice(1, -1)}`;
    if (i < json.length) line += `${JSON_KEYS[i]}${json[i]}`;
  }
  return `${line}}\n`;
}

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
  knex: Knex,
  filter: ExportFilter,
  maxSeq: number,
): AsyncGenerator<{ seq: number; hash: string; line: string }[]> {
  const canonical = canonicalText();
  return pages(
    knex,
    filter,
    maxSeq,
    (q) => q.select(knex.raw(LINE_COLUMNS.sql)),
    (raw) => {
      const parts: string[] = [];
      const json: string[] = [];
      for (let i = 0; i <= LINE_COLUMNS.pieces; i++) {
        parts.push(String(raw[`part${i}`]));
        if (i < LINE_COLUMNS.pieces) json.push(canonical(raw[`json${i}`]));
      }
      return { seq: Number(raw.seq), hash: String(raw.hash), line: joinLine(parts, json) };
    },
  );
}
