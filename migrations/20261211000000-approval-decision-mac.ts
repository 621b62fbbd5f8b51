import type { Knex } from 'knex';

/**
 * A decision carries the server's MAC under a key derived from the host roots (src/approval/seal.ts):
 * over the binding (request, tool, source, target, content, agent, policy) and the decision (approval_id,
 * approvers, expiry). Execution refuses an approved row without it, or with a wrong one: a row set to
 * approved by SQL alone executes nothing. Rows approved before it lapse (null).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('approval_requests', (t) => {
    t.text('decision_mac').nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('approval_requests', (t) => {
    t.dropColumn('decision_mac');
  });
}
