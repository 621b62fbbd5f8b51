import type { Knex } from 'knex';

/**
 * Facts about this installation that every instance on one database reads and changes, e.g. whether
 * the first run's credentials have been shown. Not secrets (those live in server_secrets).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('settings', (t) => {
    t.text('name').primary();
    t.jsonb('value').notNullable();
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('settings');
}
