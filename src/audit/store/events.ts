import type { Knex } from 'knex';
import type pg from 'pg';
import type { Queryable } from '../../db/knex.ts';
import type { ExportFilter } from '../export-filter.ts';

/** What the audit views filter rows by (audit/query.ts's AuditQuery). */
export interface RowFilter {
  since?: string;
  until?: string;
  agent?: string;
  tool?: string;
  kind?: string;
  result?: string;
  target?: string;
  approval?: string;
}

/*
 * The chain's rows as their readers read them (audit_events): the audit views' pages, one row, the
 * head, the export's pages and its COPY, the last checkpoint row of an export and the verifier's
 * walk. Nothing here writes: the chain's append is log.ts's.
 */

/**
 * Rows matching `q`, newest first, `limit` at a time, before `beforeSeq` (paging by seq), each with
 * its agent's name: the one the row recorded, else the agent's current name.
 */
export async function listRows(
  knex: Queryable,
  q: RowFilter,
  page: { beforeSeq?: number; limit: number },
): Promise<unknown> {
  const query = knex('audit_events as e')
    .joinRaw('left join agents as a on a.id::text = e.agent_id')
    .select('e.*', knex.raw("coalesce(e.details->>'agent_name', a.name) as agent_name"))
    .orderBy('e.seq', 'desc')
    .limit(page.limit);
  if (page.beforeSeq) query.where('e.seq', '<', page.beforeSeq);
  if (q.since) query.where('e.ts', '>=', q.since);
  if (q.until) query.where('e.ts', '<', q.until);
  if (q.agent) query.where((w) => w.where('a.name', q.agent!).orWhere('e.agent_id', q.agent!));
  if (q.tool) query.where('e.tool', q.tool);
  if (q.kind) query.where('e.kind', q.kind);
  if (q.result) query.where('e.result', q.result);
  if (q.target) query.where('e.target_ref', q.target);
  if (q.approval)
    query.where((w) => w.where('e.approval_id', q.approval!).orWhere('e.approval_request_id', q.approval!));
  return (await query) as unknown;
}

/** The stored row `seq`, undefined when there is none. */
export async function rowAt(knex: Queryable, seq: number): Promise<unknown> {
  return (await knex('audit_events').where('seq', seq).first()) as unknown;
}

/** The seq of the newest committed row (0 for an empty log). */
export async function headSeq(knex: Queryable): Promise<number> {
  const row = (await knex('audit_events').max({ m: 'seq' }).first()) as { m: unknown } | undefined;
  return Number(row?.m ?? 0);
}

/** The last checkpoint row at or before `seq`, as stored. */
export async function lastCheckpointRow(
  knex: Queryable,
  seq: number,
): Promise<{ seq: number; prev_hash: string; details: unknown } | undefined> {
  return (await knex('audit_events')
    .where('kind', 'checkpoint')
    .andWhere('seq', '<=', seq)
    .orderBy('seq', 'desc')
    .first('seq', 'prev_hash', 'details')) as
    { seq: number; prev_hash: string; details: unknown } | undefined;
}

/** The next `limit` rows after `after`, in seq order: a page of the verifier's walk. */
export async function rowsAfter(
  knex: Queryable,
  after: number,
  limit: number,
): Promise<{ seq: number; hash: string; kind: unknown }[]> {
  return knex('audit_events').where('seq', '>', after).orderBy('seq').limit(limit);
}

/**
 * The filter as SQL conditions with `?` placeholders, one list for both ways of reading rows: bound
 * as parameters by the export's pages, written as literals by its COPY (copySql below).
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
 * One window of an export's pages: the rows of the filter's `conditions` with seq in (after, upto], in
 * seq order, at most `limit`; every column, or the `columns` given as SQL (the export's lines).
 */
export function exportWindow(
  knex: Queryable,
  w: { after: number; upto: number; limit: number; conditions: { sql: string; values: string[] }[] },
  columns?: string,
): Knex.QueryBuilder {
  const from: Knex.QueryBuilder = knex('audit_events');
  const q: Knex.QueryBuilder = (columns === undefined ? from.select('*') : from.select(knex.raw(columns)))
    .where('seq', '>', w.after)
    .where('seq', '<=', w.upto)
    .orderBy('seq')
    .limit(w.limit);
  for (const c of w.conditions) q.whereRaw(c.sql, c.values);
  return q;
}

/**
 * The COPY statement of the filter's rows up to `maxSeq`, their `columns` given as SQL (the binary
 * columns export-render.ts reads). COPY takes no parameters, so the filter's
 * values are written as literals with pg's escapeLiteral (quotes doubled, backslashes in an E'' string:
 * safe whatever standard_conforming_strings says).
 */
export function copySql(client: pg.Client, filter: ExportFilter, maxSeq: number, columns: string): string {
  const where = [`seq <= ${Math.trunc(maxSeq)}`];
  for (const c of filterConditions(filter)) {
    let i = 0;
    where.push(c.sql.replace(/\?/g, () => client.escapeLiteral(c.values[i++]!)));
  }
  // No parallel workers on this connection (it is the export's own): rows would come back through a
  // Gather Merge in seq order, and the workers compete with the exporter for the CPUs; the COPY alone
  // ran about a third faster without them, on 300,000 rows. Sent with the COPY, in one round trip.
  return `set max_parallel_workers_per_gather = 0;
    copy (select ${columns} from audit_events where ${where.join(' and ')} order by seq)
    to stdout (format binary)`;
}

// ---- The chain's head and its rows, as checkpoints, the signed head and anchors check them ------

/** The last row's seq and hash, as stored; undefined for an empty log. */
export async function headRow(knex: Queryable): Promise<unknown> {
  return (await knex('audit_events').select('seq', 'hash').orderBy('seq', 'desc').first()) as unknown;
}

/** The last row's seq and kind; undefined for an empty log. */
export async function headKind(knex: Queryable): Promise<{ seq: number | string; kind: string } | undefined> {
  return knex('audit_events').select('seq', 'kind').orderBy('seq', 'desc').first() as Promise<
    { seq: number | string; kind: string } | undefined
  >;
}

/** Row `seq`'s seq and hash, as stored; undefined when there is none. */
export async function hashAt(knex: Queryable, seq: number): Promise<unknown> {
  return (await knex('audit_events').where('seq', seq).select('seq', 'hash').first()) as unknown;
}

/** The seq and hash of each of `seqs` that the log holds. */
export async function hashesOf(
  knex: Queryable,
  seqs: number[],
): Promise<{ seq: number | string; hash: string }[]> {
  return (await knex('audit_events').whereIn('seq', seqs).select('seq', 'hash')) as {
    seq: number | string;
    hash: string;
  }[];
}

/** When the first row at or after `seq` was written; undefined when there is none. */
export async function firstTsFrom(knex: Queryable, seq: number): Promise<{ ts: Date } | undefined> {
  return (await knex('audit_events').where('seq', '>=', seq).orderBy('seq').first('ts')) as
    { ts: Date } | undefined;
}

/** The next `limit` rows after `after` up to `upto`, in seq order, every column. */
export async function rowsUpTo(
  knex: Queryable,
  after: number,
  upto: number,
  limit: number,
): Promise<unknown[]> {
  return knex('audit_events')
    .where('seq', '>', after)
    .andWhere('seq', '<=', upto)
    .orderBy('seq')
    .limit(limit);
}

/** The next `limit` rows after `after` up to `upto`, in seq order: their seq, hash and row MAC. */
export async function macsUpTo(
  knex: Queryable,
  after: number,
  upto: number,
  limit: number,
): Promise<{ seq: unknown; hash: string; row_mac: unknown }[]> {
  return knex('audit_events')
    .where('seq', '>', after)
    .andWhere('seq', '<=', upto)
    .orderBy('seq')
    .limit(limit)
    .select('seq', 'hash', 'row_mac');
}
