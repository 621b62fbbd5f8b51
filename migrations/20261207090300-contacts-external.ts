import type { Knex } from 'knex';

/**
 * Whether a contact of the built-in directory is outside the organisation (a partner, a board member
 * from elsewhere): approval rules read it as target.external (docs/policy.md). Null, as for every
 * contact imported before, means not known, which the rules count as external.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('contacts', (t) => {
    t.boolean('external').nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('contacts', (t) => {
    t.dropColumn('external');
  });
}
