import type { Knex } from 'knex';

/**
 * Anchors of signed checkpoints off the box: the checkpoint as signed and an RFC 3161 time-stamp token
 * (DER, base64) over it. Kept apart from audit_checkpoints because a token arrives after the checkpoint is
 * committed (the authority is not asked while the chain's lock is held). Append-only like the log.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('audit_anchors', (t) => {
    t.bigIncrements('id').primary();
    t.text('type').notNullable();
    t.text('origin').notNullable();
    t.bigInteger('seq').notNullable();
    t.text('head_hash').notNullable();
    t.text('ts').notNullable();
    t.text('key_id').notNullable();
    t.text('public_key').notNullable();
    t.text('signature').notNullable();
    t.text('token').notNullable();
    t.index(['seq']);
  });
  await knex.raw(`
    create trigger audit_anchors_no_update_delete before update or delete on audit_anchors
      for each row execute function audit_events_refuse_change();
  `);
  await knex.raw(`
    create trigger audit_anchors_no_truncate before truncate on audit_anchors
      for each statement execute function audit_events_refuse_change();
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('audit_anchors');
}
