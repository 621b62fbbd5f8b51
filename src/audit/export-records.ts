import type { Knex } from 'knex';
import { isUuid } from '../core/ids.ts';
import type { Manifest } from './export.ts';

/** An export made from the compliance pages, as audit_exports records it: its file and signed manifest. */
export interface ExportRecord {
  id: string;
  actor: string;
  format: string;
  file_path: string;
  manifest: Manifest;
}

/** The record of exports (table audit_exports): written once per export, then read by id. */
export interface ExportRecords {
  recordExport(row: ExportRecord): Promise<void>;
  /** The export `id`, if one was recorded; undefined for any id that is not a UUID. */
  findExport(id: string): Promise<ExportRecord | undefined>;
}

type StoredExport = Omit<ExportRecord, 'manifest'> & { manifest: unknown };

export function createExportRecords(knex: Knex): ExportRecords {
  return {
    async recordExport(row) {
      await knex('audit_exports').insert({
        id: row.id,
        actor: row.actor,
        format: row.format,
        file_path: row.file_path,
        manifest: JSON.stringify(row.manifest),
      });
    },
    async findExport(id) {
      if (!isUuid(id)) return undefined;
      const row = (await knex('audit_exports')
        .where({ id })
        .first('id', 'actor', 'format', 'file_path', 'manifest')) as StoredExport | undefined;
      if (!row) return undefined;
      // jsonb comes back parsed (pg, PGlite); as text on some paths.
      const manifest = (
        typeof row.manifest === 'string' ? JSON.parse(row.manifest) : row.manifest
      ) as Manifest;
      return { ...row, manifest };
    },
  };
}
