import type { Knex } from 'knex';

/**
 * The approval rule that matched a request at its dry run and what it asked (docs/policy.md): the
 * binding holds it beside the policy's version, so that an execution under a changed policy can tell
 * whether the new one asks more. Both null when no rule matched (the per-tool default applied) and on
 * requests drafted before rules existed.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('approval_requests', (t) => {
    t.text('policy_rule').nullable();
    t.jsonb('policy_requirement').nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('approval_requests', (t) => {
    t.dropColumn('policy_requirement');
    t.dropColumn('policy_rule');
  });
}
