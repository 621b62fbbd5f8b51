import type { Knex } from 'knex';

/**
 * User names are unique ignoring case: `Mallory` and `mallory` would be one person to a reader of the audit
 * log, so they may not be two accounts. A database that already holds such names is refused, naming them:
 * which of the accounts is the person is the operator's call, not this migration's.
 */
export async function up(knex: Knex): Promise<void> {
  const clashes = (await knex('users')
    .select(knex.raw('lower(name) as folded'), knex.raw("string_agg(name, ', ' order by name) as names"))
    .groupByRaw('lower(name)')
    .havingRaw('count(*) > 1')
    .orderBy('folded')) as { folded: string; names: string }[];
  if (clashes.length > 0) {
    throw new Error(
      `user names must be unique ignoring case, and these differ only in case: ${clashes
        .map((c) => c.names)
        .join('; ')}. Rename all but one of each (in psql: ` +
        `update users set name = '<new name>' where name = '<old name>'), then migrate again.`,
    );
  }
  await knex.raw('create unique index users_name_lower_unique on users (lower(name))');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index users_name_lower_unique');
}
