import type { Knex } from 'knex';

/**
 * The Slack message that tells of each approval request (docs/notifications.md): where it was posted
 * (channel and ts, Slack's id of a message) and the blocks it was posted with, so that a decision or an
 * expiry can update that message with the outcome and take its buttons away. One per request.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('slack_messages', (t) => {
    t.uuid('approval_request_id').primary().references('id').inTable('approval_requests');
    t.text('channel').notNullable();
    t.text('ts').notNullable();
    t.jsonb('blocks').notNullable();
    t.timestamp('posted_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('slack_messages');
}
