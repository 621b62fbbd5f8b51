import { hash } from 'node:crypto';
import type { Knex } from 'knex';
import { dialectOf, type keptConnection, type Transaction } from '../../db/knex.ts';
import { isRetryable } from '../../db/retry.ts';
import { ChainHeadFromDb, type AuditRow, type ChainHead } from '../chain.ts';
import { EXPORT_COLUMNS } from '../format.ts';

/*
 * The chain's appends (audit_events): the advisory lock that serialises them, the one-statement
 * appends after a known head, the guarded changes and the transaction path's insert. Which rows are
 * chained, and when each path is taken, is log.ts's.
 */

/** The advisory lock key that serialises appends across every process on one database. */
export const AUDIT_LOCK_KEY = 0x636f756e; // "coun"

/**
 * A data change that commits together with its audit rows in one statement (AuditLog.appendWith).
 * `sql` is a list of CTEs, without the leading `with`, the last one named `change` and returning the
 * changed rows; every data-modifying CTE in it must only act `where exists (select 1 from guard)`
 * (or read `from guard`), so that nothing changes unless the rows are appended in the same statement.
 */
export interface GuardedChange {
  sql: string;
  bindings: readonly Knex.RawBinding[];
  /**
   * Row locks to take before the chain's advisory lock: the body of one CTE named `locked` (e.g.
   * `select … for update`). Every path takes a row's lock first and the chain's lock last
   * (docs/design.md, "Lock order"), so a change to a row that a transaction path also locks names
   * that row here.
   */
  lockFirst?: { sql: string; bindings: readonly Knex.RawBinding[] };
}

/**
 * Columns in table order, then the row MAC (not hashed: docs/audit.md, "Row MACs"); the rows travel as
 * one JSON array, turned into records by the database.
 */
const COLUMNS = [...EXPORT_COLUMNS, 'row_mac'].join(', ');

/** A row's MAC under the host's row key, over its hash (which covers the row and its link). */
export type RowSigner = (hash: string) => string | null;
export const unsigned: RowSigner = () => null;

/** The rows as they are inserted: each with its row MAC. */
const storedJson = (rows: AuditRow[], sign: RowSigner) =>
  JSON.stringify(rows.map((row) => ({ ...row, row_mac: sign(row.hash) })));
const INSERT_ROWS = `insert into audit_events (${COLUMNS})
  select ${COLUMNS} from json_populate_recordset(null::audit_events, ?::json)`;

/** The chain's guard after the lock: the head row exists as known and nothing follows it yet. */
const AFTER_HEAD = `where exists (select 1 from audit_events where seq = ? and hash = ?)
    and not exists (select 1 from audit_events where seq = ?)`;

const APPEND_AFTER = `with lock as materialized (select pg_advisory_xact_lock(?))
  ${INSERT_ROWS.replace('from json_populate_recordset', 'from lock, json_populate_recordset')}
  ${AFTER_HEAD}`;

/** Each column's type, for the one-row append's bound values (text unless named here). */
const COLUMN_TYPES: Partial<Record<keyof AuditRow, string>> = {
  seq: 'bigint',
  event_id: 'uuid',
  ts: 'timestamptz',
  approvers: 'jsonb',
  dry_run: 'boolean',
  details: 'jsonb',
};

/**
 * APPEND_AFTER for one row, its fields bound one by one instead of as a JSON array the database parses
 * into records: the database spends about a sixth less on the statement (76 µs of 538 on a slow VM,
 * statements alternated), and a call audited alone — every call when they come one at a time — waits
 * for exactly this statement.
 */
const APPEND_ONE_AFTER = `with lock as materialized (select pg_advisory_xact_lock(?))
  insert into audit_events (${COLUMNS})
  select ${EXPORT_COLUMNS.map((c) => `?::${COLUMN_TYPES[c] ?? 'text'}`).join(', ')}, ?::text from lock
  ${AFTER_HEAD}`;

/** A row's fields in table order as bound values: jsonb columns as their JSON text. */
const boundFields = (row: AuditRow) =>
  EXPORT_COLUMNS.map((c) => {
    const v = row[c];
    return v !== null && typeof v === 'object' ? JSON.stringify(v) : v;
  });

/**
 * The one-round-trip append, when this process knows the head (the last row it committed itself):
 * one autocommit statement takes the advisory lock and inserts the rows, on condition that the head
 * row exists as known and nothing follows it yet. If another writer got there first, the statement
 * inserts nothing (its row was committed before the statement began) or fails on the primary key (it
 * was committed while the statement waited for the lock); `false` then means "read the head, retry".
 * Gaps are impossible (a row is only inserted after the row it links to) and so are forks (seq is
 * unique), and the row is committed when the statement returns.
 */
export async function appendAfter(
  statements: ReturnType<typeof keptConnection>,
  head: ChainHead,
  rows: AuditRow[],
  sign: RowSigner,
): Promise<boolean> {
  const guard = [head.seq, head.hash, head.seq + 1];
  try {
    // Named statements: each connection parses and plans them once, instead of once per batch
    // (planning took about as long as running). Their texts never change; the values are bound.
    const { rowCount } =
      rows.length === 1
        ? await statements.run('countersign_audit_append_one_after', APPEND_ONE_AFTER, [
            AUDIT_LOCK_KEY,
            ...boundFields(rows[0]!),
            sign(rows[0]!.hash),
            ...guard,
          ])
        : await statements.run('countersign_audit_append_after', APPEND_AFTER, [
            AUDIT_LOCK_KEY,
            storedJson(rows, sign),
            ...guard,
          ]);
    return rowCount === rows.length;
  } catch (err) {
    // 23505: another writer took the seq. 40P01/40001: aborted, nothing inserted. Either way the
    // transaction path (which retries) appends the rows.
    if ((err as { code?: string }).code === '23505' || isRetryable(err)) return false;
    throw err;
  }
}

/**
 * `change` and the rows chained after `head`, in one autocommit statement, or neither. The guard holds
 * the advisory lock and checks that `head` is still the last row; the rows are inserted only when
 * `change` changed something. Another writer that appended meanwhile makes the guard fail (its row was
 * committed before the statement began) or the insert hit the primary key (committed while the
 * statement waited for the lock): the whole statement then changes nothing and the caller takes its
 * transaction path. The statement's snapshot predates the lock, which is sound because every change
 * to the rows a guarded change touches appends an audit row in its own transaction: any such change
 * committed after that snapshot moved the head, and this statement fails.
 */
export async function changeAfter(
  statements: ReturnType<typeof keptConnection>,
  head: ChainHead,
  rows: AuditRow[],
  change: GuardedChange,
  sign: RowSigner,
): Promise<{ headHeld: boolean; changed: Record<string, unknown>[] }> {
  const sql = guardedText(change);
  try {
    // Named after its text, so each connection parses and plans each kind of change once: the texts
    // are few (one per call site, whose columns are fixed), the values are bound.
    const result = (await statements.run(`countersign_guarded_${hash('sha256', sql).slice(0, 16)}`, sql, [
      ...(change.lockFirst?.bindings ?? []),
      AUDIT_LOCK_KEY,
      head.seq,
      head.hash,
      head.seq + 1,
      ...change.bindings,
      storedJson(rows, sign),
    ])) as { rows: { guarded: number; appended: number; changed: unknown }[] };
    const out = result.rows[0]!;
    const changed = (typeof out.changed === 'string' ? JSON.parse(out.changed) : out.changed) as Record<
      string,
      unknown
    >[];
    if (out.guarded !== 1) return { headHeld: false, changed: [] };
    if (out.appended !== rows.length) return { headHeld: true, changed: [] };
    return { headHeld: true, changed };
  } catch (err) {
    // Another writer took the next seq, or a unique key of `change` is taken, or PostgreSQL aborted
    // the statement as a deadlock or serialization failure (a race the caller's transaction path
    // settles, retrying): the statement changed nothing.
    if ((err as { code?: string }).code === '23505' || isRetryable(err)) {
      return { headHeld: false, changed: [] };
    }
    throw err;
  }
}

/**
 * The statement of a guarded change: its row locks, then the chain's lock and the guard, the change,
 * its rows, and what happened. The advisory lock reads `locked`, so it is taken after the row locks.
 */
const guardedText = (change: GuardedChange) =>
  `with ${
    change.lockFirst
      ? `locked as materialized (${change.lockFirst.sql}),
       lock as materialized (select pg_advisory_xact_lock(?) from (select count(*) from locked) l),`
      : 'lock as materialized (select pg_advisory_xact_lock(?)),'
  }
       guard as materialized (
         select 1 from lock
         where exists (select 1 from audit_events where seq = ? and hash = ?)
           and not exists (select 1 from audit_events where seq = ?)),
       ${change.sql},
       appended as (insert into audit_events (${COLUMNS})
         select ${COLUMNS} from json_populate_recordset(null::audit_events, ?::json)
         where exists (select 1 from change) returning seq)
       select (select count(*) from guard)::int as guarded,
              (select count(*) from appended)::int as appended,
              coalesce((select json_agg(change) from change), '[]'::json) as changed`;

/** Takes the chain's advisory lock in `trx` and reads the head after it is held. */
export async function lockedHead(trx: Transaction): Promise<ChainHead | undefined> {
  const lock = `select pg_advisory_xact_lock(${AUDIT_LOCK_KEY})`;
  const head = 'select seq, hash from audit_events order by seq desc limit 1';
  let row: unknown;
  if (dialectOf(trx) === 'postgres') {
    // One round trip: under READ COMMITTED each statement of the string takes its own snapshot, so
    // the head is read after the lock is held.
    const results = (await trx.raw(`${lock}; ${head}`)) as { rows: unknown[] }[];
    row = results[1]!.rows[0];
  } else {
    await trx.raw(lock);
    row = ((await trx.raw(head)) as { rows: unknown[] }).rows[0];
  }
  return ChainHeadFromDb.optional().parse(row);
}

/** Inserts rows chained after the head read under the lock (lockedHead), in the same transaction. */
export async function insertRows(trx: Transaction, rows: AuditRow[], sign: RowSigner): Promise<void> {
  await trx.raw(INSERT_ROWS, [storedJson(rows, sign)]);
}
