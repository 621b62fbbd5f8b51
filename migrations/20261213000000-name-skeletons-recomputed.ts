import type { Knex } from 'knex';

/**
 * Names' skeletons now fold compatibility forms (NFKC) and drop hidden characters and variation
 * selectors before UTS 39's mapping (src/core/visible.ts, skeletonOf): a full-width or mathematical
 * imitation of a name has the skeleton of the name. The stored ones are cleared so that the
 * application computes them again when it starts (fillNameSkeletons), as it did when the column came.
 */
export async function up(knex: Knex): Promise<void> {
  for (const table of ['contacts', 'groups']) await knex(table).update({ name_skeleton: null });
}

export async function down(knex: Knex): Promise<void> {
  for (const table of ['contacts', 'groups']) await knex(table).update({ name_skeleton: null });
}
