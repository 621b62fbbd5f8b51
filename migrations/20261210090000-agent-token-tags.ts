import type { Knex } from 'knex';

/**
 * Agent tokens made from now on carry a tag (src/accounts/token-tag.ts): a token that lacks its tag is
 * refused without a query. `token_tagged` says which agents hold such a token; those from before hold
 * an untagged one (false) until it is rotated, and while any active agent does, untagged tokens are
 * still looked up.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('agents', (t) => {
    t.boolean('token_tagged').notNullable().defaultTo(false);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('agents', (t) => {
    t.dropColumn('token_tagged');
  });
}
