import type { Knex } from 'knex';
import { chainHash, rowFromDb } from '../../src/audit/chain.ts';
import type { AuditLog } from '../../src/audit/log.ts';

/**
 * What an insider with the database's superuser can do: with triggers off (session_replication_role =
 * replica), change a row, re-hash every row after it so the chain verifies again to its head, and delete
 * the signed checkpoints and stored anchors that would betray it.
 */
export async function rewriteRow(knex: Knex, seq: number, details: Record<string, unknown>): Promise<void> {
  await knex.transaction(async (trx) => {
    await trx.raw('set local session_replication_role = replica');
    const rows = (await trx('audit_events').where('seq', '>=', seq).orderBy('seq')).map(rowFromDb);
    let prev = rows[0]!.prev_hash;
    for (const row of rows) {
      const body = row.seq === seq ? { ...row, details } : row;
      const hash = chainHash(prev, body);
      await trx('audit_events')
        .where('seq', row.seq)
        .update({ details: JSON.stringify(body.details), prev_hash: prev, hash });
      prev = hash;
    }
    await trx('audit_checkpoints').del();
    await trx('audit_anchors').del();
  });
}

/** The same insider deletes the newest rows, after `lastKept`, and every checkpoint and anchor. */
export async function deleteNewest(knex: Knex, lastKept: number): Promise<void> {
  await knex.transaction(async (trx) => {
    await trx.raw('set local session_replication_role = replica');
    await trx('audit_events').where('seq', '>', lastKept).del();
    await trx('audit_checkpoints').del();
    await trx('audit_anchors').del();
  });
}

/** Appends `n` plain rows through the log, together (no agent: nothing for the agent-name check to name). */
export async function appendRows(audit: AuditLog, n: number): Promise<void> {
  await Promise.all(
    Array.from({ length: n }, (_, i) =>
      audit.append({ kind: 'tool.call', tool: 'test_tool', result: 'ok', details: { i } }),
    ),
  );
}
