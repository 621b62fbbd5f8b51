import type { Knex } from 'knex';

/** An agent's idempotency keys for real writes: same key + same content answers the stored result. */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('idempotency_keys', (t) => {
    t.uuid('agent_id').notNullable().references('agents.id');
    t.text('key').notNullable();
    t.text('tool').notNullable();
    t.text('content_sha256').notNullable();
    t.uuid('approval_request_id').notNullable().references('approval_requests.id');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.primary(['agent_id', 'key']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('idempotency_keys');
}
