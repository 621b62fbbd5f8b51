import type { Knex } from 'knex';

/** Secrets shared by every instance on one database (e.g. the cursor-signing key). */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('server_secrets', (t) => {
    t.text('name').primary();
    t.text('value').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('server_secrets');
}
