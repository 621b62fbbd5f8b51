import type { Knex } from 'knex';

/** Per-agent key-value notes with a time to live (remember / recall). */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('agent_memory', (t) => {
    t.uuid('agent_id').notNullable().references('agents.id');
    t.text('key').notNullable();
    t.jsonb('value').notNullable();
    t.timestamp('expires_at', { useTz: true, precision: 3 }).notNullable();
    t.timestamp('updated_at', { useTz: true, precision: 3 }).notNullable();
    t.primary(['agent_id', 'key']);
    t.index(['expires_at']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('agent_memory');
}
