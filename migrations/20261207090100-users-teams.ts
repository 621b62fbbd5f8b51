import type { Knex } from 'knex';

/**
 * Teams an organisation names (finance, legal …) that a user belongs to beside the built-in roles: an
 * approval rule may ask for approvers from one of them (docs/policy.md). A JSON array of names.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('users', (t) => {
    t.jsonb('teams').notNullable().defaultTo('[]');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('users', (t) => {
    t.dropColumn('teams');
  });
}
