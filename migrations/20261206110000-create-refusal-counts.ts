import type { Knex } from 'knex';

/**
 * Refusals of unauthenticated requests per source address, kind, reason and minute, counted in the
 * database so that the replicas of a cluster share one count: the first few of a minute get their own
 * audit rows, the rest one summary row once the minute has closed (the counter is then deleted).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('refusal_counts', (t) => {
    t.text('kind').notNullable();
    t.text('source').notNullable();
    t.text('reason').notNullable();
    // Minutes since the Unix epoch.
    t.bigInteger('minute').notNullable();
    t.integer('count').notNullable();
    // When the first refusal past the minute's own rows came, and the last one.
    t.timestamp('first_over_at', { useTz: true }).nullable();
    t.timestamp('last_at', { useTz: true }).notNullable();
    t.text('error_code').nullable();
    t.primary(['kind', 'source', 'reason', 'minute']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('refusal_counts');
}
