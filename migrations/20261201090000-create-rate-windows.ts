import type { Knex } from 'knex';

/** Calls per agent per minute, counted in the database so that every replica counts against one limit. */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('rate_windows', (t) => {
    t.uuid('agent_id').notNullable();
    // Minutes since the Unix epoch, by the database's clock: one clock for the whole cluster.
    t.bigInteger('minute').notNullable();
    t.integer('calls').notNullable();
    t.primary(['agent_id', 'minute']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('rate_windows');
}
