import { isUuid } from '../core/ids.ts';
import type { Queryable } from '../db/knex.ts';
import type { Manifest } from './export.ts';
import { exportsMade } from './store/index.ts';

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

export function createExportRecords(knex: Queryable): ExportRecords {
  return {
    async recordExport(row) {
      await exportsMade.insert(knex, {
        id: row.id,
        actor: row.actor,
        format: row.format,
        file_path: row.file_path,
        manifest: JSON.stringify(row.manifest),
      });
    },
    async findExport(id) {
      if (!isUuid(id)) return undefined;
      const row = await exportsMade.find(knex, id);
      if (!row) return undefined;
      // jsonb comes back parsed (pg, PGlite); as text on some paths.
      const manifest = (
        typeof row.manifest === 'string' ? JSON.parse(row.manifest) : row.manifest
      ) as Manifest;
      return { ...row, manifest };
    },
  };
}
