import type { Knex } from 'knex';

/**
 * The connector an execution went to (`local`, `bridge`, `mcp:<name>`): reconciliation of an
 * interrupted execution asks that connector, and no other, whether the write happened.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('approval_requests', (t) => {
    t.text('execution_source').nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('approval_requests', (t) => {
    t.dropColumn('execution_source');
  });
}
