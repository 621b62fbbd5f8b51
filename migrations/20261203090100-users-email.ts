import type { Knex } from 'knex';

/** A user's e-mail address, where notices of requests reach chairs (`countersign user set NAME --email`). */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('users', (t) => {
    t.text('email').nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('users', (t) => {
    t.dropColumn('email');
  });
}
