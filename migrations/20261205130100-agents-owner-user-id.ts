import type { Knex } from 'knex';

/**
 * An agent's owner is a user, referenced by id: the owner rule compares people, not spellings. Owner names
 * are resolved ignoring case (user names are unique so). A name that matches no user is kept, as
 * `owner_unresolved`, and the agent's requests can be decided by nobody until an operator names its owner
 * (`countersign agent set NAME --owner USER`): an owner that cannot be told apart from the chair must not
 * let the chair through.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('agents', (t) => {
    t.uuid('owner_id').nullable().references('id').inTable('users');
    t.index(['owner_id'], 'agents_owner_id');
  });
  await knex.raw('update agents a set owner_id = u.id from users u where lower(u.name) = lower(a.owner)');
  await knex.raw('update agents set owner = null where owner_id is not null');
  await knex.schema.alterTable('agents', (t) => {
    t.renameColumn('owner', 'owner_unresolved');
  });
  await knex.raw(
    'alter table agents add constraint agents_one_owner check (owner_id is null or owner_unresolved is null)',
  );
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('alter table agents drop constraint agents_one_owner');
  await knex.schema.alterTable('agents', (t) => {
    t.renameColumn('owner_unresolved', 'owner');
  });
  await knex.raw('update agents a set owner = u.name from users u where u.id = a.owner_id');
  await knex.schema.alterTable('agents', (t) => {
    t.dropIndex(['owner_id'], 'agents_owner_id');
    t.dropColumn('owner_id');
  });
}
