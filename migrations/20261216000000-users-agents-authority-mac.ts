import type { Knex } from 'knex';

/**
 * Each user's and agent's record carries a MAC under the host roots' authority key over the fields that
 * grant authority, with the row's id (src/accounts/authority.ts; docs/identity.md, "Sealed records"):
 * a record whose roles, password hash, identity, owner, profile or token was changed by SQL no longer
 * matches it and is refused (TAMPERED). Records from before are sealed once, by the first start after
 * this migration (the host roots file then says `records_sealed`).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('users', (t) => {
    t.text('authority_mac').nullable();
  });
  await knex.schema.alterTable('agents', (t) => {
    t.text('authority_mac').nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('users', (t) => {
    t.dropColumn('authority_mac');
  });
  await knex.schema.alterTable('agents', (t) => {
    t.dropColumn('authority_mac');
  });
}
