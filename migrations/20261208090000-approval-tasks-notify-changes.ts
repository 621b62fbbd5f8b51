import type { Knex } from 'knex';

/**
 * Every change of a task's state is announced on the channel countersign_tasks with the task's id, so
 * that the replica holding an agent's listen stream pushes the change (notifications/tasks) however
 * and wherever it was made: a decision on another replica or in the CLI, an execution's start and
 * outcome, an expiry, a withdrawal, the task's own outcome. A trigger rather than each writer: none can
 * forget it, and it fires only when the change commits. A request without a task costs one index probe.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    create function approval_tasks_notify_change() returns trigger language plpgsql as $$
    begin
      if tg_table_name = 'approval_tasks' then
        perform pg_notify('countersign_tasks', new.id::text);
      else
        perform pg_notify('countersign_tasks', t.id::text)
          from approval_tasks t where t.approval_request_id = new.id;
      end if;
      return null;
    end $$;
  `);
  await knex.raw(`
    create trigger approval_requests_notify_task after update of status on approval_requests
      for each row when (old.status is distinct from new.status)
      execute function approval_tasks_notify_change();
  `);
  await knex.raw(`
    create trigger approval_tasks_notify_change after update of status on approval_tasks
      for each row when (old.status is distinct from new.status)
      execute function approval_tasks_notify_change();
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop trigger if exists approval_tasks_notify_change on approval_tasks');
  await knex.raw('drop trigger if exists approval_requests_notify_task on approval_requests');
  await knex.raw('drop function if exists approval_tasks_notify_change()');
}
