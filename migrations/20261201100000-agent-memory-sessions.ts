import type { Knex } from 'knex';

/**
 * Memory per session (docs/tools.md, the memory tools): notes are keyed by agent, session_id and key,
 * and a value is a string. Notes stored before sessions existed are kept under session_id "default",
 * their JSON values as JSON text (a string value as the string itself); they expire as before.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('agent_memory', (t) => {
    t.text('session_id').notNullable().defaultTo('default');
    t.text('value_text');
  });
  await knex.raw(`
    UPDATE agent_memory
       SET value_text = CASE WHEN jsonb_typeof(value->'v') = 'string' THEN value->>'v' ELSE (value->'v')::text END`);
  await knex.schema.alterTable('agent_memory', (t) => {
    t.dropPrimary();
    t.dropColumn('value');
  });
  await knex.schema.alterTable('agent_memory', (t) => {
    t.renameColumn('value_text', 'value');
  });
  await knex.raw(
    'ALTER TABLE agent_memory ALTER COLUMN value SET NOT NULL, ALTER COLUMN session_id DROP DEFAULT',
  );
  await knex.schema.alterTable('agent_memory', (t) => {
    t.primary(['agent_id', 'session_id', 'key']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('agent_memory', (t) => {
    t.dropPrimary();
    t.jsonb('value_json');
  });
  await knex.raw(`UPDATE agent_memory SET value_json = jsonb_build_object('v', to_jsonb(value))`);
  await knex.raw(`DELETE FROM agent_memory a USING agent_memory b
                   WHERE a.agent_id = b.agent_id AND a.key = b.key AND a.updated_at < b.updated_at`);
  await knex.schema.alterTable('agent_memory', (t) => {
    t.dropColumn('value');
    t.dropColumn('session_id');
  });
  await knex.schema.alterTable('agent_memory', (t) => {
    t.renameColumn('value_json', 'value');
    t.primary(['agent_id', 'key']);
  });
  await knex.raw('ALTER TABLE agent_memory ALTER COLUMN value SET NOT NULL');
}
