import type { Knex } from 'knex';

/**
 * Writes an agent asked for as MCP tasks: one row per approval request a task follows, holding the
 * validated arguments to execute once the request is approved, and the task's outcome once it has
 * one. Until then the task's state is read from its request (pending and approved → working, rejected
 * and expired → failed), so that every replica answers alike. `claimed_at` is when a replica took the
 * approved write to run it; a claim older than the call deadline is taken again, and the approval's
 * own single use keeps the write to one. Rows go with their request (on delete cascade).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('approval_tasks', (t) => {
    t.uuid('id').primary();
    t.uuid('approval_request_id')
      .notNullable()
      .unique()
      .references('id')
      .inTable('approval_requests')
      .onDelete('CASCADE');
    t.uuid('agent_id').notNullable().references('agents.id');
    /** The tool as the agent called it (an upstream's tool with its prefix). */
    t.text('tool').notNullable();
    /** The call's arguments as validated, with dry_run false and no approval_id. */
    t.jsonb('arguments').notNullable();
    t.text('status')
      .notNullable()
      .defaultTo('working')
      .checkIn(['working', 'completed', 'failed', 'cancelled']);
    /** completed: the tool's CallToolResult; failed: the JSON-RPC error { code, message, data }. */
    t.jsonb('outcome').nullable();
    t.timestamp('claimed_at', { useTz: true, precision: 3 }).nullable();
    t.timestamp('created_at', { useTz: true, precision: 3 }).notNullable();
    t.timestamp('updated_at', { useTz: true, precision: 3 }).notNullable();
    t.index(['agent_id', 'created_at']);
  });
  // The runner's question, "which tasks are still working?", reads only those.
  await knex.raw(
    "create index approval_tasks_working on approval_tasks (created_at) where status = 'working'",
  );
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('approval_tasks');
}
