import type { Knex } from 'knex';

/**
 * Each user's and agent's seal also binds `sealed_seq`: the seq of the audit row of the change that
 * sealed it (src/accounts/authority.ts; docs/identity.md, "Sealed records are fresh"). A record put back
 * by SQL as it was before a later change, seal and all, then meets that later change's row in the log
 * and is refused (TAMPERED). Records sealed before are sealed again once, by the first start after this
 * migration (the host roots file then says `records_fresh`).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('users', (t) => {
    t.bigInteger('sealed_seq').nullable();
  });
  await knex.schema.alterTable('agents', (t) => {
    t.bigInteger('sealed_seq').nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('users', (t) => {
    t.dropColumn('sealed_seq');
  });
  await knex.schema.alterTable('agents', (t) => {
    t.dropColumn('sealed_seq');
  });
}
