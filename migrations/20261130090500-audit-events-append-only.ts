import type { Knex } from 'knex';

/** The audit log is append-only: UPDATE, DELETE and TRUNCATE are refused by the database itself. */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    create function audit_events_refuse_change() returns trigger language plpgsql as $$
    begin
      raise exception 'audit_events is append-only: % refused', tg_op using errcode = 'insufficient_privilege';
    end $$;
  `);
  await knex.raw(`
    create trigger audit_events_no_update_delete before update or delete on audit_events
      for each row execute function audit_events_refuse_change();
  `);
  await knex.raw(`
    create trigger audit_events_no_truncate before truncate on audit_events
      for each statement execute function audit_events_refuse_change();
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop trigger if exists audit_events_no_truncate on audit_events');
  await knex.raw('drop trigger if exists audit_events_no_update_delete on audit_events');
  await knex.raw('drop function if exists audit_events_refuse_change()');
}
