import type { Knex } from 'knex';

/**
 * One row per write an agent drafted: bound to tool, target, content hash and agent. `approval_id` is
 * issued when enough chairs approve; `status` moves pending → approved → executing → succeeded | failed
 * | unknown, or pending → rejected, or pending | approved → expired.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('approval_requests', (t) => {
    t.uuid('id').primary();
    t.uuid('agent_id').notNullable().references('agents.id');
    t.text('tool').notNullable();
    t.text('target_type').notNullable();
    t.text('target_id').notNullable();
    t.text('target_display').nullable();
    t.text('content_sha256').notNullable();
    t.text('file_sha256').nullable();
    /** What the chair reviews: the exact content (text, file metadata). */
    t.jsonb('review').notNullable();
    t.text('status')
      .notNullable()
      .checkIn(['pending', 'approved', 'executing', 'succeeded', 'failed', 'unknown', 'rejected', 'expired']);
    t.uuid('approval_id').nullable().unique();
    t.integer('required_approvers').notNullable();
    t.text('policy_version').notNullable();
    t.text('note').nullable();
    t.timestamp('created_at', { useTz: true, precision: 3 }).notNullable();
    t.timestamp('expires_at', { useTz: true, precision: 3 }).notNullable();
    t.timestamp('decided_at', { useTz: true, precision: 3 }).nullable();
    t.timestamp('execution_started_at', { useTz: true, precision: 3 }).nullable();
    t.timestamp('execution_finished_at', { useTz: true, precision: 3 }).nullable();
    t.jsonb('execution_result').nullable();
    t.text('execution_error').nullable();
    t.index(['agent_id', 'created_at']);
    t.index(['status', 'expires_at']);
  });
  // The same agent drafting the same content again gets the same open request: a race becomes a conflict.
  await knex.raw(`
    create unique index approval_requests_open_content on approval_requests (agent_id, content_sha256)
      where status in ('pending', 'approved')
  `);
  await knex.schema.createTable('approval_decisions', (t) => {
    t.uuid('id').primary();
    t.uuid('approval_request_id').notNullable().references('approval_requests.id');
    t.text('user_name').notNullable();
    t.text('decision').notNullable().checkIn(['approve', 'reject']);
    t.text('note').nullable();
    t.timestamp('created_at', { useTz: true, precision: 3 }).notNullable();
    t.unique(['approval_request_id', 'user_name']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('approval_decisions');
  await knex.schema.dropTable('approval_requests');
}
