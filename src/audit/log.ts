import { createHmac, hash, randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { dialectOf, isConnectionError, keptConnection } from '../db/knex.ts';
import { isRetryable, retryingTransaction } from '../db/retry.ts';
import {
  auditInput,
  type AuditInput,
  chainHash,
  ChainHeadFromDb,
  GENESIS_HASH,
  type AuditRow,
  type ChainHead,
} from './chain.ts';
import { EXPORT_COLUMNS } from './format.ts';
import { headSeq } from './query.ts';
import { auditUnavailable } from '../db/outage.ts';
import type { HostRoots } from '../core/host-roots.ts';

/** The advisory lock key that serialises appends across every process on one database. */
export const AUDIT_LOCK_KEY = 0x636f756e; // "coun"

/** A connection failure becomes the audit_unavailable refusal; anything else is a bug, as is. */
const explained = (err: unknown) => (isConnectionError(err) ? auditUnavailable(err) : err);

interface Pending {
  input: AuditInput;
  onChained?: (row: AuditRow) => void;
  resolve(row: AuditRow): void;
  reject(err: unknown): void;
}

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

/** What appendWith did: the rows appended and what `change` returned, or nothing at all. */
export type GuardedResult = { rows: AuditRow[]; changed: Record<string, unknown>[] } | undefined;

interface PendingChange {
  change: GuardedChange;
  inputs: AuditInput[];
  resolve(result: GuardedResult): void;
  reject(err: unknown): void;
}

export interface AuditLog {
  /**
   * Appends one row and resolves once it is committed. `onChained`, when given, may be called with the
   * row as chained once its statement is on its way, before the commit: the caller can prepare what
   * depends on the row (its seq) while the database works. The resolved row is the one committed; it
   * differs from an announced one when another writer got there first and the row was chained anew.
   */
  append(input: AuditInput, onChained?: (row: AuditRow) => void): Promise<AuditRow>;
  /**
   * Appends rows inside the caller's transaction, so they commit (or roll back) with its other changes.
   * Holds the chain's advisory lock until that transaction ends: keep such transactions short.
   */
  appendIn(trx: Knex.Transaction, ...inputs: AuditInput[]): Promise<AuditRow[]>;
  /**
   * Commits `change` and `inputs` in one statement when this process knows the chain's head and nobody
   * else appended since; otherwise does nothing and resolves undefined, and the caller takes its
   * transaction path (which decides, with row locks, what is true). Also undefined when `change`
   * changed nothing. Never one without the other.
   */
  appendWith(change: GuardedChange, ...inputs: AuditInput[]): Promise<GuardedResult>;
  /**
   * Resolves when every queued row has been committed (or failed), and the appends' connection is back
   * in the pool (a later append takes one again).
   */
  drain(): Promise<void>;
  /** The seq of the newest committed row (0 for an empty log), as the database has it now. */
  headSeq(): Promise<number>;
  /**
   * What this process remembers having appended: the newest row it committed (the highest audit_seq it
   * answered with), and the first contradiction found when it read the chain's head under the lock —
   * a head before that row (`rows_deleted`) or another row at its seq (`head_mismatch`).
   */
  appended(): { committed?: ChainHead; contradiction?: HeadContradiction };
  /**
   * Calls `listener` each time `appended().committed` moves on, so that work that follows the appends
   * (the leader's checkpoints) waits for them rather than looking each second. Returns the stop.
   */
  onAppended(listener: () => void): () => void;
}

export interface HeadContradiction {
  reason: 'rows_deleted' | 'head_mismatch';
  seq: number;
  detail: string;
}

/** How the head read under the lock contradicts the newest row this process committed, if it does. */
function contradicts(found: ChainHead | undefined, committed: ChainHead): HeadContradiction | undefined {
  if (!found || found.seq < committed.seq) {
    const end = found?.seq ?? 0;
    const detail = `the log ends at seq ${end}, before row ${committed.seq} this replica appended and answered with`;
    return { reason: 'rows_deleted', seq: committed.seq, detail };
  }
  if (found.seq === committed.seq && found.hash !== committed.hash)
    return {
      reason: 'head_mismatch',
      seq: committed.seq,
      detail: `row ${committed.seq} is not the row this replica appended`,
    };
  return undefined;
}

/**
 * The rows that extend the chain after `head` (none: the genesis), stamped now. Each row is one object
 * literal in table order (no spreads): this runs for every append, on the path of every call.
 */
function chainRows(head: ChainHead | undefined, inputs: AuditInput[]): AuditRow[] {
  let seq = head?.seq ?? 0;
  let prev = head?.hash ?? GENESIS_HASH;
  const ts = new Date().toISOString();
  return inputs.map((input) => {
    const p = auditInput(input);
    const row: AuditRow = {
      seq: ++seq,
      event_id: randomUUID(),
      ts,
      kind: p.kind,
      request_id: p.request_id,
      trace_id: p.trace_id,
      agent_id: p.agent_id,
      actor: p.actor,
      tool: p.tool,
      source: p.source,
      target_type: p.target_type,
      target_ref: p.target_ref,
      approval_request_id: p.approval_request_id,
      approval_id: p.approval_id,
      approvers: p.approvers,
      dry_run: p.dry_run,
      content_sha256: p.content_sha256,
      file_sha256: p.file_sha256,
      result: p.result,
      error_code: p.error_code,
      details: p.details,
      prev_hash: prev,
      hash: '',
    };
    row.hash = prev = chainHash(row.prev_hash, row);
    return row;
  });
}

/**
 * Columns in table order, then the row MAC (not hashed: docs/audit.md, "Row MACs"); the rows travel as
 * one JSON array, turned into records by the database.
 */
const COLUMNS = [...EXPORT_COLUMNS, 'row_mac'].join(', ');

/** A row's MAC under the host's row key, over its hash (which covers the row and its link). */
type RowSigner = (hash: string) => string | null;
const unsigned: RowSigner = () => null;

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
async function appendAfter(
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
async function changeAfter(
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

/**
 * A guarded change, alone, after the known head (none known: not tried). Settles the job and returns
 * the head after it, undefined when it is not known any more.
 */
async function writeChange(
  statements: ReturnType<typeof keptConnection>,
  head: ChainHead | undefined,
  job: PendingChange,
  signer: () => Promise<RowSigner>,
): Promise<ChainHead | undefined> {
  if (!head) {
    job.resolve(undefined);
    return undefined;
  }
  const rows = chainRows(head, job.inputs);
  try {
    const { headHeld, changed } = await changeAfter(statements, head, rows, job.change, await signer());
    if (changed.length === 0) {
      job.resolve(undefined);
      // Guard passed and nothing changed: the head is still the last row.
      return headHeld ? head : undefined;
    }
    job.resolve({ rows, changed });
    const last = rows.at(-1)!;
    return { seq: last.seq, hash: last.hash };
  } catch (err) {
    job.reject(explained(err));
    return undefined;
  }
}

/** Takes the chain's advisory lock in `trx` and reads the head after it is held. */
async function lockedHead(trx: Knex.Transaction): Promise<ChainHead | undefined> {
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

/** Chains and inserts `inputs` in `trx`, after taking the advisory lock that serialises every append. */
async function appendRows(
  trx: Knex.Transaction,
  inputs: AuditInput[],
  sawHead: (head: ChainHead | undefined) => void,
  sign: RowSigner,
): Promise<AuditRow[]> {
  const head = await lockedHead(trx);
  sawHead(head);
  const rows = chainRows(head, inputs);
  await trx.raw(INSERT_ROWS, [storedJson(rows, sign)]);
  return rows;
}

/**
 * Tells the callers that asked (append's onChained) their rows as chained. In the next turn of the
 * event loop: by then the statement the rows go in has been written to the database's connection (or
 * waits for one), so the callers' work overlaps the database's instead of delaying it.
 */
function announce(batch: Pending[], rows: AuditRow[]): void {
  if (!batch.some((p) => p.onChained)) return;
  setImmediate(() =>
    batch.forEach((p, i) => {
      try {
        p.onChained?.(rows[i]!);
      } catch {
        // Only a head start: the caller does the same work once the row is committed.
      }
    }),
  );
}

/**
 * What one process remembers of its appends (AuditLog.appended): the newest row it committed, kept
 * through errors (unlike the head the one-statement append extends), and the first contradiction met
 * when the head was read under the lock — read there anyway, so the check costs no statement.
 */
const noop = () => {};

function appendMemory() {
  let committed: ChainHead | undefined;
  let contradiction: HeadContradiction | undefined;
  const listeners = new Set<() => void>();
  return {
    didCommit<H extends ChainHead | undefined>(row: H): H {
      if (row && (!committed || committed.seq < row.seq)) {
        committed = { seq: row.seq, hash: row.hash };
        for (const l of listeners) l();
      }
      return row;
    },
    onAppended(listener: () => void) {
      listeners.add(listener);
      return () => void listeners.delete(listener);
    },
    sawHead(found: ChainHead | undefined) {
      if (committed) contradiction ??= contradicts(found, committed);
    },
    appended: () => ({
      ...(committed ? { committed } : {}),
      ...(contradiction ? { contradiction } : {}),
    }),
  };
}

/**
 * The row MAC of each appended row, under the host roots' row key (read once, when first needed); none
 * without roots. A failure to read the roots fails the append: a row is never written unsigned by a
 * server that has them.
 */
function rowSigner(roots: (() => Promise<HostRoots>) | undefined): () => Promise<RowSigner> {
  if (!roots) return () => Promise.resolve(unsigned);
  let ready: RowSigner | undefined;
  return async () => {
    if (ready) return ready;
    const key = (await roots()).key('row');
    ready = (hash) => createHmac('sha256', key).update(hash).digest('hex');
    return ready;
  };
}

export interface AuditLogOptions {
  maxBatch?: number;
  /** The host roots whose row key MACs each row; without them rows carry none (tests of the chain). */
  roots?: () => Promise<HostRoots>;
}

/**
 * Appends rows to `audit_events`, chaining each to the previous one.
 *
 * Rows queued while a batch is being written go out together in the next batch, under one
 * `pg_advisory_xact_lock`: appends stay strictly serialised across processes, while many concurrent
 * calls in one process share a lock acquisition and a round trip. While this process is the only
 * writer, a batch is one statement (see appendAfter); otherwise a transaction that reads the head.
 */
export function createAuditLog(knex: Knex, opts: AuditLogOptions = {}): AuditLog {
  const [maxBatch, signer] = [opts.maxBatch ?? 256, rowSigner(opts.roots)];
  let queue: (Pending | PendingChange)[] = [];
  let flushing: Promise<void> | null = null;
  /** The last row this process committed through `append`: not known after an error. */
  let head: ChainHead | undefined;
  /** The one-statement appends' connection, kept while they follow each other (keptConnection). */
  const statements = keptConnection(knex);
  // What the log tells of its appends (appended, onAppended) is the memory's own.
  const { sawHead, didCommit, ...told } = appendMemory();

  async function writeBatch(batch: Pending[]): Promise<AuditRow[]> {
    const inputs = batch.map((p) => p.input);
    const sign = await signer();
    if (head) {
      const rows = chainRows(head, inputs);
      const appended = appendAfter(statements, head, rows, sign);
      announce(batch, rows);
      if (await appended) return rows;
    }
    return retryingTransaction(knex, (trx) => appendRows(trx, inputs, sawHead, sign));
  }

  async function flush(): Promise<void> {
    for (let first = true; queue.length > 0; first = false) {
      // Let the callers whose rows just committed run first: what they append next joins this batch.
      if (!first) await new Promise((resolve) => setImmediate(resolve));
      const next = queue[0]!;
      if ('change' in next) {
        queue = queue.slice(1);
        head = didCommit(await writeChange(statements, head, next, signer));
        continue;
      }
      const end = queue.findIndex((p, i) => i >= maxBatch || 'change' in p);
      const batch = queue.slice(0, end === -1 ? maxBatch : end) as Pending[];
      queue = queue.slice(batch.length);
      try {
        const rows = await writeBatch(batch);
        const last = rows.at(-1)!;
        head = didCommit({ seq: last.seq, hash: last.hash });
        batch.forEach((p, i) => p.resolve(rows[i]!));
      } catch (err) {
        head = undefined;
        const reason = explained(err);
        batch.forEach((p) => p.reject(reason));
      }
    }
  }

  function kick(): void {
    if (flushing) return;
    flushing = flush().finally(() => {
      flushing = null;
      if (queue.length > 0) kick();
    });
  }

  return {
    append(input, onChained) {
      return new Promise<AuditRow>((resolve, reject) => {
        queue.push({ input, onChained, resolve, reject });
        kick();
      });
    },
    appendWith(change, ...inputs) {
      return new Promise<GuardedResult>((resolve, reject) => {
        queue.push({ change, inputs, resolve, reject });
        kick();
      });
    },
    async appendIn(trx, ...inputs) {
      const rows = await appendRows(trx, inputs, sawHead, await signer()).catch((err: unknown) => {
        throw explained(err);
      });
      // Once the transaction commits, its last row is the head the next batch can extend in one
      // statement. Only a hint: appendAfter inserts only after a head row that exists, and the primary
      // key refuses a stale one.
      const last = rows.at(-1)!;
      trx.executionPromise.then(() => {
        if (!head || head.seq < last.seq) head = didCommit({ seq: last.seq, hash: last.hash });
      }, noop);
      return rows;
    },
    async drain() {
      while (flushing) await flushing;
      await statements.release();
    },
    headSeq: () => headSeq(knex),
    ...told,
  };
}
