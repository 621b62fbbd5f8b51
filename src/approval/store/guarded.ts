import type { Knex } from 'knex';
import type { GuardedChange } from '../../audit/index.ts';

/**
 * Building blocks of the one-statement paths (AuditLog.appendWith): each is a CTE that acts only
 * `from guard`, so it changes nothing unless its audit rows are appended in the same statement.
 * Values travel as one JSON object per row, typed by the table itself (json_populate_record), never
 * spliced into the SQL text.
 */

/**
 * `name as (insert into table … from guard … on conflict …)`: one row, typed by the table. `from`
 * names another CTE to insert after instead (one that itself acts only from guard, e.g. `change`):
 * the row is inserted only when that CTE returned a row.
 */
export function insertFromGuard(
  name: string,
  table: string,
  row: Record<string, unknown>,
  opts: { onConflict?: string; returning?: string; from?: string } = {},
): GuardedChange {
  const columns = Object.keys(row);
  return {
    sql: `${name} as (insert into ${table} (${columns.join(', ')})
      select ${columns.map((c) => `v.${c}`).join(', ')}
      from ${opts.from ?? 'guard'}, json_populate_record(null::${table}, ?::json) v
      ${opts.onConflict ? `on conflict ${opts.onConflict}` : ''}
      returning ${opts.returning ?? 'id'})`,
    bindings: [JSON.stringify(row)],
  };
}

/**
 * `name as (update table set … where id = ? and <where> and exists (guard))`: the set values as one
 * typed JSON row; `where` is SQL over the table's columns with its own bindings. The row is locked
 * before the chain's lock (lockFirst), the order every path keeps.
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
    lockFirst: lockingRow(table, id),
  };
}

/**
 * The lock of one row (by id), taken before the chain's advisory lock (GuardedChange.lockFirst): the
 * same order as a transaction that locks the row `for update` and then appends (docs/design.md).
 */
export const lockingRow = (table: string, id: string): NonNullable<GuardedChange['lockFirst']> => ({
  sql: `select id from ${table} where id = ? for update`,
  bindings: [id],
});

/**
 * CTEs in order, as one change; one must be named `change`, and only CTEs that read it may follow it
 * (the outbox's `queued`).
 */
export function chain(...parts: GuardedChange[]): GuardedChange {
  const lockFirst = parts.find((p) => p.lockFirst)?.lockFirst;
  return {
    sql: parts.map((p) => p.sql).join(',\n'),
    bindings: parts.flatMap((p) => p.bindings),
    ...(lockFirst ? { lockFirst } : {}),
  };
}

/** One notice to queue: `recipient` null stands for every active chair with an e-mail address. */
export interface Delivery {
  event: 'requested' | 'decided' | 'expired';
  approval_request_id: string;
  channel: 'webhook' | 'email' | 'slack';
  recipient: string | null;
  /** What the notice shows, never a secret; must hold `agent_id` (the agent's name is added here). */
  payload: { agent_id: string };
}

/**
 * `queued as (insert into notification_outbox …)`: the deliveries whose request the `change` CTE before
 * it returned, so a notice is queued exactly when its change is made, in the same statement. A null
 * recipient becomes one row per chair with an address, leaving out the owner of the requesting agent
 * (who may not decide its requests); the payload gains the agent's name.
 */
export function queuedAfterChange(deliveries: readonly Delivery[]): GuardedChange {
  return {
    sql: `queued as (insert into notification_outbox (event, approval_request_id, channel, recipient, payload)
      select d.event, d.approval_request_id, d.channel, r.recipient, d.payload || jsonb_build_object('agent', a.name)
      from json_populate_recordset(null::notification_outbox, ?::json) d
      join agents a on a.id::text = d.payload->>'agent_id'
      cross join lateral (
        select d.recipient where d.recipient is not null
        union all
        select u.email from users u
        where d.recipient is null and u.email is not null and u.disabled_at is null
          and u.roles @> '["chair"]'::jsonb and u.id is distinct from a.owner_id) r (recipient)
      where d.approval_request_id in (select id from change)
      returning id)`,
    bindings: [JSON.stringify(deliveries)],
  };
}

/** `change`, and its deliveries queued in the same statement when there are any. */
export const withQueued = (change: GuardedChange, deliveries: readonly Delivery[]): GuardedChange =>
  deliveries.length === 0 ? change : chain(change, queuedAfterChange(deliveries));
