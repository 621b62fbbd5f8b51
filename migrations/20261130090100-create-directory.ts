import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('contacts', (t) => {
    t.text('id').primary();
    t.text('display_name').notNullable();
    t.text('account').nullable();
    t.text('department').nullable();
    t.text('title').nullable();
    t.boolean('active').notNullable().defaultTo(true);
    // Search keys are normalised in the application (NFKC, lower case) so matching is the same on
    // every database collation, including ones that only fold ASCII.
    t.text('name_key').notNullable();
    t.text('search_key').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
  await knex.schema.createTable('groups', (t) => {
    t.text('id').primary();
    t.text('display_name').notNullable();
    t.text('owner_contact_id').nullable().references('contacts.id');
    t.boolean('archived').notNullable().defaultTo(false);
    t.text('name_key').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
  await knex.schema.createTable('group_members', (t) => {
    t.text('group_id').notNullable().references('groups.id').onDelete('CASCADE');
    t.text('contact_id').notNullable().references('contacts.id').onDelete('CASCADE');
    t.primary(['group_id', 'contact_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('group_members');
  await knex.schema.dropTable('groups');
  await knex.schema.dropTable('contacts');
}
