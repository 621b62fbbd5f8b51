import type { Knex } from 'knex';

/**
 * Refusals past a minute's own rows are counted on the replica that refused them and added to their
 * counter in bulk, about once a second (src/audit/refusals.ts): `pushed` holds those, apart from
 * `count`, which counts the refusals that asked the database one by one for a row of their own.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('refusal_counts', (t) => {
    t.integer('pushed').notNullable().defaultTo(0);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('refusal_counts', (t) => {
    t.dropColumn('pushed');
  });
}
