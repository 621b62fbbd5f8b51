import type { Knex } from 'knex';
import { waitFor } from './server.ts';

/** An audit row's details as either driver returns them (jsonb parsed, or its text). */
export const detailsOf = (row: { details: unknown }) =>
  (typeof row.details === 'string' ? JSON.parse(row.details) : row.details) as Record<string, unknown>;

/**
 * The notification attempts recorded for a request, once one of them is `notification.delivered`: the
 * receiver answers before the outbox records the delivery, so a test that saw the notice waits for it.
 */
export function deliveryAttempts(knex: Knex, approvalRequestId: string) {
  return waitFor('the notification.delivered row', async () => {
    const rows = (await knex('audit_events')
      .where({ approval_request_id: approvalRequestId })
      .whereIn('kind', ['notification.failed', 'notification.delivered'])
      .orderBy('seq')) as { kind: string; details: unknown }[];
    return rows.some((r) => r.kind === 'notification.delivered') ? rows : undefined;
  });
}
