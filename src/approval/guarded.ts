import type { Knex } from 'knex';
import type { GuardedChange } from '../audit/log.ts';

/**
 * Building blocks of the one-statement paths (AuditLog.appendWith): each is a CTE that acts only
 * `from guard`, so it changes nothing unless its audit rows are appended in the same statement.
 * Values travel as one JSON object per row, typed by the table itself (json_populate_record), never
 * spliced into the SQL text.
 */

/** `name as (insert into table … from guard … on conflict …)`: one row, typed by the table. */
export function insertFromGuard(
  name: string,
  table: string,
  row: Record<string, unknown>,
  opts: { onConflict?: string; returning?: string } = {},
): GuardedChange {
  const columns = Object.keys(row).join(', ');
  return {
    sql: `${name} as (insert into ${table} (${columns})
      select ${columns} from guard, json_populate_record(null::${table}, ?::json)
      ${opts.onConflict ? `on conflict ${opts.onConflict}` : ''}
      returning ${opts.returning ?? 'id'})`,
    bindings: [JSON.stringify(row)],
  };
}

/**
 * `name as (update table set … where id = ? and <where> and exists (guard))`: the set values as one
 * typed JSON row; `where` is SQL over the table's columns with its own bindings.
 */
export function updateFromGuard(
  name: string,
  table: string,
  id: string,
  set: Record<string, unknown>,
  where: { sql: string; bindings: readonly Knex.RawBinding[] },
): GuardedChange {
  const columns = Object.keys(set);
  return {
    sql: `${name} as (update ${table} t set (${columns.join(', ')}) =
        (select ${columns.map((c) => `v.${c}`).join(', ')} from json_populate_record(null::${table}, ?::json) v)
      where t.id = ? and ${where.sql} and exists (select 1 from guard)
      returning t.id)`,
    bindings: [JSON.stringify(set), id, ...where.bindings],
  };
}

/** CTEs in order, as one change; the last must be named `change`. */
export function chain(...parts: GuardedChange[]): GuardedChange {
  return { sql: parts.map((p) => p.sql).join(',\n'), bindings: parts.flatMap((p) => p.bindings) };
}
