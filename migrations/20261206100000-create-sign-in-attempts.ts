import type { Knex } from 'knex';

/**
 * Sign-in attempts, each reserved before its password (or single sign-on answer) is checked, so that the
 * failure limits hold for concurrent attempts on every replica. `bucket` keeps password attempts apart
 * from single sign-on callbacks; `name` is the user name tried (none for a callback); `origin` the client
 * address or the command line's host. Rows older than the window are purged as new attempts arrive.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('sign_in_attempts', (t) => {
    t.bigIncrements('id').primary();
    t.text('bucket').notNullable();
    t.text('name');
    t.text('origin').notNullable();
    t.timestamp('at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['bucket', 'name', 'at'], 'sign_in_attempts_name');
    t.index(['bucket', 'origin', 'at'], 'sign_in_attempts_origin');
    t.index(['at'], 'sign_in_attempts_at');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('sign_in_attempts');
}
