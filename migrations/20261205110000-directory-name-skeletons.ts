import type { Knex } from 'knex';

/**
 * The Unicode TR39 skeleton of each contact's and group's display name, computed in the application
 * (like the search keys) and indexed, so resolving a write's target finds the directory's look-alikes
 * of its name in the same statement. Rows from before are filled in by the application when it starts.
 */
export async function up(knex: Knex): Promise<void> {
  for (const table of ['contacts', 'groups']) {
    await knex.schema.alterTable(table, (t) => {
      t.text('name_skeleton').nullable();
      t.index(['name_skeleton'], `${table}_name_skeleton_idx`);
    });
  }
}

export async function down(knex: Knex): Promise<void> {
  for (const table of ['contacts', 'groups']) {
    await knex.schema.alterTable(table, (t) => {
      t.dropIndex(['name_skeleton'], `${table}_name_skeleton_idx`);
      t.dropColumn('name_skeleton');
    });
  }
}
