import type { Knex } from 'knex';
import type { Queryable, Transaction } from '../../db/knex.ts';
import { queuedAfterChange, type Delivery } from './guarded.ts';

/*
 * The notification outbox: notices queued in the statement of the change they tell of, then claimed
 * and settled by the deliverer (src/notify/). Which notices a change queues is decided in ../outbox.ts.
 */

/**
 * For the transaction paths: runs `query` (an insert or update of approval_requests) and queues the
 * deliveries of the rows it changed in the same statement, so queueing adds no round trip.
 */
export async function changeAndQueue(
  trx: Transaction,
  query: Knex.QueryBuilder,
  deliveries: readonly Delivery[],
): Promise<void> {
  if (deliveries.length === 0) {
    await query;
    return;
  }
  const { sql, bindings } = query.returning('id').toSQL();
  const queued = queuedAfterChange(deliveries);
  await trx.raw(`with change as (${sql}), ${queued.sql} select 1`, [...bindings, ...queued.bindings]);
}

// ---- The outbox as its deliverer (notify/) reads and settles it ----------------------------------

/**
 * Claims up to `limit` due pending notices, in one autocommit statement: `for update skip locked`
 * lets replicas claim side by side without ever taking the same row, and the claim pushes each row's
 * next attempt to `lease`, so a replica that dies mid-send leaves it to be tried again after that.
 * Each row comes with the name of the agent its payload names.
 */
export async function claimDueNotices(
  knex: Queryable,
  opts: { now: Date; lease: Date; limit: number },
): Promise<Record<string, unknown>[]> {
  const result = (await knex.raw(
    `update notification_outbox set attempts = attempts + 1, next_attempt_at = ?
     where id in (select id from notification_outbox
                  where state = 'pending' and next_attempt_at <= ?
                  order by next_attempt_at limit ? for update skip locked)
     returning id, event, approval_request_id, channel, recipient, payload, attempts, created_at,
       (select a.name from agents a where a.id::text = payload->>'agent_id') as agent_name`,
    [opts.lease.toISOString(), opts.now.toISOString(), opts.limit],
  )) as { rows: Record<string, unknown>[] };
  return result.rows;
}

/**
 * Records a delivery attempt's outcome on its notice, inside the caller's transaction (with the
 * attempt's audit row). Changes the row only while it is still the claim's (same attempt count): a
 * claim whose lease ran out and was taken over elsewhere leaves the row to the newer claim.
 */
export async function settleNotice(
  trx: Transaction,
  claim: { id: string | number; attempts: number },
  outcome: {
    state: 'delivered' | 'pending' | 'failed';
    last_error: string | null;
    delivered_at?: string;
    next_attempt_at?: string;
  },
): Promise<void> {
  await trx('notification_outbox')
    .where({ id: claim.id, state: 'pending', attempts: claim.attempts })
    .update(outcome);
}

/** Whether a request's `requested` notice on `channel` is still waiting to be delivered. */
export async function requestedNoticeWaiting(knex: Queryable, requestId: string, channel: string) {
  return Boolean(
    await knex('notification_outbox')
      .where({ approval_request_id: requestId, channel, event: 'requested', state: 'pending' })
      .first('id'),
  );
}
