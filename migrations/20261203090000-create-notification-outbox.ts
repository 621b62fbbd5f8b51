import type { Knex } from 'knex';

/**
 * Notices waiting to go out (docs/notifications.md): one row per event, channel and recipient, written
 * in the same statement or transaction as the state change it tells of, so that no committed change
 * goes untold and no rolled-back one is told. `payload` holds what the notice shows, never a secret.
 * The deliverer claims due pending rows with `for update skip locked`: each is sent by one replica.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('notification_outbox', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.text('event').notNullable().checkIn(['requested', 'decided', 'expired']);
    t.uuid('approval_request_id').notNullable().references('id').inTable('approval_requests');
    t.text('channel').notNullable().checkIn(['webhook', 'email', 'slack']);
    t.text('recipient').notNullable();
    t.jsonb('payload').notNullable();
    t.integer('attempts').notNullable().defaultTo(0);
    t.timestamp('next_attempt_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.text('state').notNullable().defaultTo('pending').checkIn(['pending', 'delivered', 'failed']);
    t.text('last_error').nullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('delivered_at', { useTz: true }).nullable();
  });
  // The deliverer's question, "which pending rows are due?", reads only pending rows.
  await knex.raw(
    "create index notification_outbox_due on notification_outbox (next_attempt_at) where state = 'pending'",
  );
  await knex.raw('create index notification_outbox_request on notification_outbox (approval_request_id)');
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('notification_outbox');
}
