import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { AuditInput, chainHash, GENESIS_HASH, type AuditBody, type AuditRow } from './chain.ts';

/** The advisory lock key that serialises appends across every process on one database. */
export const AUDIT_LOCK_KEY = 0x636f756e; // "coun"

interface Pending {
  input: AuditInput;
  resolve(row: AuditRow): void;
  reject(err: unknown): void;
}

export interface AuditLog {
  /** Appends one row and resolves once it is committed. */
  append(input: AuditInput): Promise<AuditRow>;
  /**
   * Appends rows inside the caller's transaction, so they commit (or roll back) with its other changes.
   * Holds the chain's advisory lock until that transaction ends: keep such transactions short.
   */
  appendIn(trx: Knex.Transaction, ...inputs: AuditInput[]): Promise<AuditRow[]>;
  /** Resolves when every queued row has been committed (or failed). */
  drain(): Promise<void>;
}

/** Chains and inserts `inputs` in `trx`, after taking the advisory lock that serialises every append. */
async function appendRows(trx: Knex.Transaction, inputs: AuditInput[]): Promise<AuditRow[]> {
  await trx.raw('select pg_advisory_xact_lock(?)', [AUDIT_LOCK_KEY]);
  const head = (await trx('audit_events').select('seq', 'hash').orderBy('seq', 'desc').first()) as
    { seq: number | string; hash: string } | undefined;
  let seq = head ? Number(head.seq) : 0;
  let prev = head?.hash ?? GENESIS_HASH;
  const ts = new Date().toISOString();
  const rows: AuditRow[] = inputs.map((input) => {
    const parsed = AuditInput.parse(input);
    const body: AuditBody = {
      seq: ++seq,
      event_id: randomUUID(),
      ts,
      kind: parsed.kind,
      request_id: parsed.request_id ?? null,
      trace_id: parsed.trace_id ?? null,
      agent_id: parsed.agent_id ?? null,
      actor: parsed.actor ?? null,
      tool: parsed.tool ?? null,
      source: parsed.source ?? null,
      target_type: parsed.target_type ?? null,
      target_ref: parsed.target_ref ?? null,
      approval_request_id: parsed.approval_request_id ?? null,
      approval_id: parsed.approval_id ?? null,
      approvers: parsed.approvers ?? null,
      dry_run: parsed.dry_run ?? null,
      content_sha256: parsed.content_sha256 ?? null,
      file_sha256: parsed.file_sha256 ?? null,
      result: parsed.result ?? null,
      error_code: parsed.error_code ?? null,
      details: parsed.details ?? {},
    };
    const hash = chainHash(prev, body);
    const row = { ...body, prev_hash: prev, hash };
    prev = hash;
    return row;
  });
  await trx('audit_events').insert(
    rows.map((r) => ({
      ...r,
      approvers: r.approvers === null ? null : JSON.stringify(r.approvers),
      details: JSON.stringify(r.details),
    })),
  );
  return rows;
}

/**
 * Appends rows to `audit_events`, chaining each to the previous one.
 *
 * Rows queued while a batch is being written go out together in the next transaction, under one
 * `pg_advisory_xact_lock`: appends stay strictly serialised across processes, while many concurrent
 * calls in one process share a lock acquisition and a round trip.
 */
export function createAuditLog(knex: Knex, opts: { maxBatch?: number } = {}): AuditLog {
  const maxBatch = opts.maxBatch ?? 256;
  let queue: Pending[] = [];
  let flushing: Promise<void> | null = null;

  async function writeBatch(batch: Pending[]): Promise<AuditRow[]> {
    return knex.transaction((trx) =>
      appendRows(
        trx,
        batch.map((p) => p.input),
      ),
    );
  }

  async function flush(): Promise<void> {
    while (queue.length > 0) {
      const batch = queue.slice(0, maxBatch);
      queue = queue.slice(batch.length);
      try {
        const rows = await writeBatch(batch);
        batch.forEach((p, i) => p.resolve(rows[i]!));
      } catch (err) {
        batch.forEach((p) => p.reject(err));
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
    append(input) {
      return new Promise<AuditRow>((resolve, reject) => {
        queue.push({ input, resolve, reject });
        kick();
      });
    },
    appendIn: (trx, ...inputs) => appendRows(trx, inputs),
    async drain() {
      while (flushing) await flushing;
    },
  };
}
