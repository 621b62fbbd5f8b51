import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('conversations', (t) => {
    t.text('id').primary();
    t.text('conversation_type').notNullable().checkIn(['direct', 'group', 'system']);
    t.text('display_name').notNullable();
    t.text('name_key').notNullable();
    t.text('contact_id').nullable().references('contacts.id');
    t.text('group_id').nullable().references('groups.id');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
  await knex.schema.createTable('messages', (t) => {
    t.text('id').primary();
    t.text('conversation_id').notNullable().references('conversations.id');
    t.text('direction').notNullable().checkIn(['incoming', 'outgoing']);
    t.text('sender_id').nullable();
    t.text('sender_name').nullable();
    t.text('content_type').notNullable().checkIn(['text', 'image', 'file', 'rich', 'notify', 'unknown']);
    t.text('content_text').notNullable().defaultTo('');
    t.text('text_key').notNullable().defaultTo('');
    t.timestamp('created_at', { useTz: true }).notNullable();
    t.timestamp('received_at', { useTz: true }).nullable();
    t.index(['conversation_id', 'created_at', 'id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('messages');
  await knex.schema.dropTable('conversations');
}
