import type { Knex } from 'knex';

/** The idempotency key a write arrived with (the approval_id): one approval, at most one message. */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => {
    t.text('write_key').nullable().unique();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => {
    t.dropColumn('write_key');
  });
}
