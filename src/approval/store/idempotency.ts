import type { Queryable, Transaction } from '../../db/knex.ts';

/** The table of idempotency keys: the write an agent's key named, kept for a retention period. */

/** What an agent's key was first used for; `forUpdate` locks it (the execution's first lock). */
export async function keyOf(
  q: Queryable,
  agent_id: string,
  key: string,
  opts: { forUpdate?: boolean } = {},
): Promise<{ tool: string; content_sha256: string; approval_request_id: string } | undefined> {
  const query = q('idempotency_keys')
    .select('tool', 'content_sha256', 'approval_request_id')
    .where({ agent_id, key })
    .first();
  if (opts.forUpdate) query.forUpdate();
  return (await query) as { tool: string; content_sha256: string; approval_request_id: string } | undefined;
}

/** Takes the key for this write; a key taken meanwhile fails on its primary key (23505). */
export async function takeKey(
  trx: Transaction,
  row: { agent_id: string; key: string; tool: string; content_sha256: string; approval_request_id: string },
): Promise<void> {
  await trx('idempotency_keys').insert(row);
}

/** Forgets the keys taken before `before`; returns how many. */
export function purgeKeys(q: Queryable, before: string): Promise<number> {
  return q('idempotency_keys').where('created_at', '<', before).delete();
}
