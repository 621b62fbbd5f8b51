import type { Queryable } from '../../db/knex.ts';

/* The record of exports made from the compliance pages (audit_exports): written once, read by id. */

/** An export's row as stored; the manifest is jsonb, parsed by the caller. */
export interface StoredExport {
  id: string;
  actor: string;
  format: string;
  file_path: string;
  manifest: unknown;
}

/** Records an export; `manifest` is its JSON text. */
export async function insert(knex: Queryable, row: Omit<StoredExport, 'manifest'> & { manifest: string }) {
  await knex('audit_exports').insert(row);
}

/** The export `id`, undefined when none was recorded. */
export async function find(knex: Queryable, id: string): Promise<StoredExport | undefined> {
  return (await knex('audit_exports')
    .where({ id })
    .first('id', 'actor', 'format', 'file_path', 'manifest')) as StoredExport | undefined;
}
