import type { Knex } from 'knex';

/** A value every instance on one database agrees on, created by whichever instance asks first. */
export async function sharedValue(knex: Knex, name: string, make: () => string): Promise<string> {
  await knex('server_secrets').insert({ name, value: make() }).onConflict('name').ignore();
  const row = (await knex('server_secrets').where({ name }).first()) as { value: string };
  return row.value;
}
