import type { Knex } from 'knex';

/** The hash-chained audit log (docs/audit.md). `seq` is assigned under an advisory lock: strictly increasing, no gaps. */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('audit_events', (t) => {
    t.bigInteger('seq').primary();
    t.uuid('event_id').notNullable().unique();
    t.timestamp('ts', { useTz: true, precision: 3 }).notNullable();
    t.text('kind').notNullable();
    t.text('request_id').nullable();
    t.text('trace_id').nullable();
    t.text('agent_id').nullable();
    t.text('actor').nullable();
    t.text('tool').nullable();
    t.text('source').nullable();
    t.text('target_type').nullable();
    t.text('target_ref').nullable();
    t.text('approval_request_id').nullable();
    t.text('approval_id').nullable();
    t.jsonb('approvers').nullable();
    t.boolean('dry_run').nullable();
    t.text('content_sha256').nullable();
    t.text('file_sha256').nullable();
    t.text('result').nullable();
    t.text('error_code').nullable();
    t.jsonb('details').notNullable().defaultTo('{}');
    t.text('prev_hash').notNullable();
    t.text('hash').notNullable();
    t.index(['ts']);
    t.index(['agent_id', 'seq']);
    t.index(['kind', 'seq']);
    t.index(['approval_request_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('audit_events');
}
