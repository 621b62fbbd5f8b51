import type { Queryable } from '../../db/knex.ts';

/*
 * The one read of accounts/' agents that audit/ makes: an export's filter names an agent, by name or
 * by id, and the export refuses a name nobody has (audit/export-file.ts says why). audit/ is below
 * accounts/, so it reads the row itself rather than asking accounts/.
 */

/** The id of the agent named `name`, undefined when there is none. */
export async function idNamed(knex: Queryable, name: string): Promise<{ id: string } | undefined> {
  return (await knex('agents').where({ name }).first('id')) as { id: string } | undefined;
}

/** The agent whose id is `id`, undefined when there is none. */
export async function idOf(knex: Queryable, id: string): Promise<{ id: string } | undefined> {
  return (await knex('agents').where({ id }).first('id')) as { id: string } | undefined;
}
