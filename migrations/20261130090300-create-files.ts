import type { Knex } from 'knex';

/** File metadata; the bytes live in the blob store under the data dir, addressed by sha256. */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('files', (t) => {
    t.text('id').primary();
    t.text('message_id').nullable().references('messages.id');
    t.text('conversation_id').nullable().references('conversations.id');
    t.text('file_name').notNullable();
    t.text('mime_type').nullable();
    t.bigInteger('size_bytes').notNullable();
    t.text('sha256').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['conversation_id', 'created_at', 'id']);
    t.index(['message_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('files');
}
