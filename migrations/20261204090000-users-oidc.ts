import type { Knex } from 'knex';

/**
 * People who sign in through an OpenID Connect provider: known by the provider's issuer and their subject
 * there (never by name alone), and holding no password. Every user has one way in or the other; both
 * halves of an OpenID identity are set together.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('users', (t) => {
    t.text('oidc_issuer').nullable();
    t.text('oidc_subject').nullable();
    t.unique(['oidc_issuer', 'oidc_subject'], { indexName: 'users_oidc_identity_unique' });
  });
  await knex.raw('alter table users alter column password_hash drop not null');
  await knex.raw(`
    alter table users add constraint users_one_way_in check (
      (oidc_issuer is null) = (oidc_subject is null)
      and (password_hash is not null or oidc_subject is not null)
    )
  `);
}

/** Refused by the database while a user without a password exists: their rows are not silently dropped. */
export async function down(knex: Knex): Promise<void> {
  await knex.raw('alter table users drop constraint users_one_way_in');
  await knex.raw('alter table users alter column password_hash set not null');
  await knex.schema.alterTable('users', (t) => {
    t.dropUnique(['oidc_issuer', 'oidc_subject'], 'users_oidc_identity_unique');
    t.dropColumn('oidc_subject');
    t.dropColumn('oidc_issuer');
  });
}
