import type { Knex } from 'knex';

/**
 * Slack callbacks already taken (POST /slack/interactions), by the SHA-256 of their signature, so that
 * a replayed one is refused on every replica. A signature older than five minutes is refused anyway, so
 * rows older than ten are purged as new callbacks arrive.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('slack_callbacks_seen', (t) => {
    t.text('signature_sha256').primary();
    t.timestamp('seen_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['seen_at'], 'slack_callbacks_seen_at');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('slack_callbacks_seen');
}
