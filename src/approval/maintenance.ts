import type { Logger } from '../log.ts';
import { AGENT_NAME_OF_R, expireRows, type ApprovalDeps } from './deps.ts';
import { finishExecution } from './execute.ts';
import { namedRequestFromDb } from './view.ts';

/** Expires pending requests and approved-but-unused approvals past their time, each with its audit row. */
export async function expireDue(deps: ApprovalDeps): Promise<number> {
  return deps.knex.transaction(async (trx) => {
    const due = (await trx('approval_requests as r')
      .select('r.*', trx.raw(AGENT_NAME_OF_R))
      .whereIn('r.status', ['pending', 'approved'])
      .where('r.expires_at', '<=', new Date().toISOString())
      .forUpdate()
      .skipLocked()
      .limit(500)) as Record<string, unknown>[];
    if (due.length === 0) return 0;
    const rows = due.map(namedRequestFromDb);
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
  return deps.knex('idempotency_keys').where('created_at', '<', before).delete();
}

/**
 * Asks the connector an execution went to (its `source`) whether the write keyed by an approval_id
 * happened: found, definitely not, or undefined when it cannot tell (or the source is gone).
 */
export type WriteLookup = (
  source: string | null,
  key: string,
) => Promise<{ found: true; ref: string } | { found: false } | undefined>;

/**
 * Executions left `executing` past twice the call deadline (a crash, a lost connection) are settled by
 * asking the connector: written → succeeded; definitely not written → failed; cannot tell → unknown,
 * which is shown to people and never retried blindly.
 */
export async function reconcileStale(deps: ApprovalDeps, lookup: WriteLookup, log: Logger): Promise<number> {
  const cutoff = new Date(Date.now() - 2 * deps.config.limits.call_timeout_ms).toISOString();
  const stale = (
    (await deps
      .knex('approval_requests as r')
      .select('r.*', deps.knex.raw(AGENT_NAME_OF_R))
      .where('r.status', 'executing')
      .where('r.execution_started_at', '<=', cutoff)
      .limit(100)) as Record<string, unknown>[]
  ).map(namedRequestFromDb);
  let settled = 0;
  for (const row of stale) {
    let answer: Awaited<ReturnType<WriteLookup>>;
    try {
      answer = await lookup(row.execution_source, row.approval_id!);
    } catch (err) {
      log.warn({ err, approval_request_id: row.id }, 'reconciliation lookup failed; will retry');
      continue;
    }
    const outcome = answer?.found
      ? { status: 'succeeded' as const, result: { ref: answer.ref } }
      : answer
        ? {
            status: 'failed' as const,
            error_code: 'NOT_WRITTEN',
            details: { reason: 'connector has no such write' },
          }
        : {
            status: 'unknown' as const,
            error_code: 'OUTCOME_UNKNOWN',
            details: { reason: 'connector cannot tell' },
          };
    if (
      await finishExecution(deps, row, outcome, {
        reconciled: true,
        ...(row.execution_source ? { source: row.execution_source } : {}),
      })
    )
      settled++;
    log.warn({ approval_request_id: row.id, status: outcome.status }, 'reconciled an interrupted execution');
  }
  return settled;
}
