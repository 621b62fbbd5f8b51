import { createHmac, randomUUID } from 'node:crypto';
import { isConnectionError, keptConnection, type Connection, type Transaction } from '../db/knex.ts';
import { retryingTransaction } from '../db/retry.ts';
import {
  auditInput,
  type AuditInput,
  chainHash,
  GENESIS_HASH,
  type AuditRow,
  type ChainHead,
} from './chain.ts';
import { headSeq } from './query.ts';
import { auditUnavailable } from '../db/outage.ts';
import type { HostRoots } from '../core/host-roots.ts';
import { chain, type GuardedChange, type RowSigner } from './store/index.ts';

export { AUDIT_LOCK_KEY, type GuardedChange } from './store/index.ts';

/** A connection failure becomes the audit_unavailable refusal; anything else is a bug, as is. */
const explained = (err: unknown) => (isConnectionError(err) ? auditUnavailable(err) : err);

interface Pending {
  input: AuditInput;
  onChained?: (row: AuditRow) => void;
  resolve(row: AuditRow): void;
  reject(err: unknown): void;
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
  appendIn(trx: Transaction, ...inputs: AuditInput[]): Promise<AuditRow[]>;
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
    const { headHeld, changed } = await chain.changeAfter(statements, head, rows, job.change, await signer());
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

/** Chains and inserts `inputs` in `trx`, after taking the advisory lock that serialises every append. */
async function appendRows(
  trx: Transaction,
  inputs: AuditInput[],
  sawHead: (head: ChainHead | undefined) => void,
  sign: RowSigner,
): Promise<AuditRow[]> {
  const head = await chain.lockedHead(trx);
  sawHead(head);
  const rows = chainRows(head, inputs);
  await chain.insertRows(trx, rows, sign);
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
  if (!roots) return () => Promise.resolve(chain.unsigned);
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
export function createAuditLog(knex: Connection, opts: AuditLogOptions = {}): AuditLog {
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
      const appended = chain.appendAfter(statements, head, rows, sign);
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
