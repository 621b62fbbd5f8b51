import type { Knex } from 'knex';

/**
 * Signed checkpoints of the audit chain: {origin, seq, head_hash, ts} signed with Ed25519.
 * Append-only like the log itself; each new checkpoint must extend the previous one.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('audit_checkpoints', (t) => {
    t.bigIncrements('id').primary();
    t.text('origin').notNullable();
    t.bigInteger('seq').notNullable();
    t.text('head_hash').notNullable();
    t.text('ts').notNullable();
    t.text('key_id').notNullable();
    t.text('public_key').notNullable();
    t.text('signature').notNullable();
  });
  await knex.raw(`
    create trigger audit_checkpoints_no_update_delete before update or delete on audit_checkpoints
      for each row execute function audit_events_refuse_change();
  `);
  await knex.raw(`
    create trigger audit_checkpoints_no_truncate before truncate on audit_checkpoints
      for each statement execute function audit_events_refuse_change();
  `);
  await knex.schema.createTable('audit_exports', (t) => {
    t.uuid('id').primary();
    t.text('actor').notNullable();
    t.text('format').notNullable();
    t.text('file_path').notNullable();
    t.jsonb('manifest').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('audit_exports');
  await knex.schema.dropTable('audit_checkpoints');
}
