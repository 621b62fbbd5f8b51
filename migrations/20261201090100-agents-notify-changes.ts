import type { Knex } from 'knex';

/**
 * Every change to an agent (revoked, profile, rate limit, token, name) is announced on the channel
 * countersign_agents with the agent's id, so that a replica caching agents drops its copy. A trigger
 * rather than each command: no writer of the table can forget it, and it fires only when the change
 * commits.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    create function agents_notify_change() returns trigger language plpgsql as $$
    begin
      perform pg_notify('countersign_agents', coalesce(new.id, old.id)::text);
      return null;
    end $$;
  `);
  await knex.raw(`
    create trigger agents_notify_change after update or delete on agents
      for each row execute function agents_notify_change();
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop trigger if exists agents_notify_change on agents');
  await knex.raw('drop function if exists agents_notify_change()');
}
