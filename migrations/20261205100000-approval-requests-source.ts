import type { Knex } from 'knex';

/**
 * The connector a drafted write resolves to (`local`, `bridge`, `mcp:<name>`), as the chair saw it: the
 * approval binds it, and an execution through any other source is refused. Null on requests drafted
 * before it was recorded; those never execute (their binding did not cover the source).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('approval_requests', (t) => {
    t.text('source').nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('approval_requests', (t) => {
    t.dropColumn('source');
  });
}
