import type { Knex } from 'knex';

/** Web sessions of people (chairs, compliance, admins). Only a hash of the session id is stored. */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('web_sessions', (t) => {
    t.text('id_hash').primary();
    t.uuid('user_id').notNullable().references('users.id');
    t.text('csrf_token').notNullable();
    t.timestamp('created_at', { useTz: true, precision: 3 }).notNullable();
    t.timestamp('last_seen_at', { useTz: true, precision: 3 }).notNullable();
    t.index(['user_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('web_sessions');
}
