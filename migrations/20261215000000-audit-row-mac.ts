import type { Knex } from 'knex';

/**
 * Each row the server appends carries a MAC under a key derived from the host roots, over the row's hash
 * (which covers the whole row and its link). It is not part of the hashed row: exports and the chain's
 * hash format are unchanged. Rows appended before it have none; the host roots file pins the seq from
 * which one is required (docs/audit.md, "Row MACs").
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('audit_events', (t) => {
    t.text('row_mac').nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('audit_events', (t) => {
    t.dropColumn('row_mac');
  });
}
