import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('agents', (t) => {
    t.uuid('id').primary();
    t.text('name').notNullable().unique();
    t.text('token_hash').notNullable().unique();
    t.text('profile').notNullable().defaultTo('all');
    t.integer('rate_limit_per_min').nullable();
    t.text('owner').nullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('revoked_at', { useTz: true }).nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('agents');
}
