import type { Logger } from '../log.ts';
import { findLocalWrite } from '../connectors/index.ts';
import { retryingTransaction } from '../db/retry.ts';
import { expireRows, type ApprovalDeps } from './deps.ts';
import { keys, requests } from './store/index.ts';
import { finishIn, type ExecutionOutcome } from './execute.ts';
import type { NamedRequestRow } from './view.ts';

/** Expires pending requests and approved-but-unused approvals past their time, each with its audit row. */
export async function expireDue(deps: ApprovalDeps): Promise<number> {
  return retryingTransaction(deps.knex, async (trx) => {
    const rows = await requests.dueForExpiry(trx, new Date().toISOString());
    if (rows.length === 0) return 0;
    await expireRows(deps, trx, rows);
    return rows.length;
  });
}

/**
 * Forgets idempotency keys older than approval.idempotency_retention_s: a retry after that is a new
 * write that needs its own approval (the approval_id itself stays single-use for ever).
 */
export async function purgeIdempotencyKeys(deps: ApprovalDeps): Promise<number> {
  const before = new Date(Date.now() - deps.config.approval.idempotency_retention_s * 1000).toISOString();
  return keys.purgeKeys(deps.knex, before);
}

/**
 * Asks a remote connector an execution went to (its `source`: the bridge, an upstream) whether the write
 * keyed by an approval_id happened: found, definitely not, or undefined when it cannot tell (or the
 * source is gone). "Definitely not" must be a promise that the write will not happen later either (the
 * bridge's `not_found`, docs/bridge.md); a connector that cannot promise that answers undefined. The
 * local store is asked inside the reconciling transaction instead.
 */
export type WriteLookup = (
  source: string | null,
  key: string,
) => Promise<{ found: true; ref: string } | { found: false } | undefined>;

/**
 * Executions left `executing` past twice the call deadline (a crash, a lost connection, a stalled
 * database) are settled by asking the connector: written → succeeded; definitely not written → failed;
 * cannot tell → unknown, which is shown to people and never retried blindly.
 *
 * Each is settled in a transaction that holds the request's row lock, taken `skip locked`: a local
 * write holds that lock (shared) from its fence check until it commits (src/connectors/local/send.ts),
 * so a row whose write is still in flight is left for a later round, and once the lock is held no
 * local write for it can land any more — "not written" is then certain. The local store is read in the
 * same transaction; a remote connector is asked first, and its answer holds by its own promise.
 */
export async function reconcileStale(deps: ApprovalDeps, lookup: WriteLookup, log: Logger): Promise<number> {
  const cutoff = new Date(Date.now() - 2 * deps.config.limits.call_timeout_ms).toISOString();
  const stale = await requests.staleExecutions(deps.knex, cutoff);
  let settled = 0;
  for (const row of stale) {
    let remote: Awaited<ReturnType<WriteLookup>>;
    if (!isLocal(row)) {
      try {
        remote = await lookup(row.execution_source, row.approval_id!);
      } catch (err) {
        log.warn({ err, approval_request_id: row.id }, 'reconciliation lookup failed; will retry');
        continue;
      }
    }
    const status = await retryingTransaction(deps.knex, async (trx) => {
      if (!(await requests.holdExecuting(trx, row.id))) return undefined;
      const answer = isLocal(row) ? await findLocalWrite(trx, row.approval_id!) : remote;
      const outcome = outcomeOf(answer);
      const context = { reconciled: true, ...(row.execution_source ? { source: row.execution_source } : {}) };
      return (await finishIn(deps, trx, row, outcome, context)) ? outcome.status : undefined;
    });
    if (!status) continue;
    settled++;
    log.warn({ approval_request_id: row.id, status }, 'reconciled an interrupted execution');
  }
  return settled;
}

/** Rows executed before the source was recorded went to the local store, the only connector then. */
const isLocal = (row: NamedRequestRow) => row.execution_source === null || row.execution_source === 'local';

/** What a connector's answer about a write settles an execution as. */
function outcomeOf(answer: Awaited<ReturnType<WriteLookup>>): ExecutionOutcome {
  if (answer?.found) return { status: 'succeeded', result: { ref: answer.ref } };
  if (answer) {
    return {
      status: 'failed',
      error_code: 'NOT_WRITTEN',
      details: { reason: 'connector has no such write' },
    };
  }
  return { status: 'unknown', error_code: 'OUTCOME_UNKNOWN', details: { reason: 'connector cannot tell' } };
}
