import type { Knex } from 'knex';

/**
 * The class of each upstream tool as first seen (docs/upstreams.md), one row per upstream and tool, so
 * that every replica applies the same pin. A later listing that would make a tool less gated is kept
 * aside in the pending_* columns until an operator accepts it; `revision` lets replicas that see the
 * same change at once settle which of them records it (a conditional update).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('upstream_tool_pins', (t) => {
    t.text('upstream').notNullable();
    t.text('tool').notNullable();
    t.text('class').notNullable();
    t.jsonb('annotations').notNullable();
    t.text('input_schema_sha256').notNullable();
    t.timestamp('pinned_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.text('accepted_by').nullable();
    t.integer('revision').notNullable().defaultTo(1);
    t.text('pending_class').nullable();
    t.jsonb('pending_annotations').nullable();
    t.text('pending_input_schema_sha256').nullable();
    t.timestamp('pending_since', { useTz: true }).nullable();
    t.primary(['upstream', 'tool']);
  });
  await knex.raw(
    `alter table upstream_tool_pins
       add constraint upstream_tool_pins_class check (class in ('read', 'write')),
       add constraint upstream_tool_pins_pending_class check (pending_class in ('read', 'write'))`,
  );
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('upstream_tool_pins');
}
