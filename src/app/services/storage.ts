import path from 'node:path';
import { sealUnsealedPolicy } from '../../approval/index.ts';
import { headSeq } from '../../audit/index.ts';
import { sealUnsealedRecords, storedTokenHashes } from '../../accounts/index.ts';
import { describePgError } from '../../admin/pg-errors.ts';
import type { Config } from '../../config.ts';
import { createBlobStore } from '../../connectors/index.ts';
import type { Database, Queryable } from '../../db/knex.ts';
import { openHostRoots } from '../../db/host-roots.ts';
import { migrateLatest, upToDate } from '../../db/migrations.ts';
import { openWhenReady } from '../../db/ready.ts';
import type { Logger } from '../../log.ts';
import { assertWritableDataDir } from '../data-dir.ts';
import { defineService } from './parts.ts';

/** The database, closed last of all; a test may stop the process just before it opens. */
export const storage = defineService({
  name: 'storage',
  needs: ['config', 'log', 'command', 'faults', 'onDatabase'],
  provides: ['db', 'opened', 'roots'],
  async open({ config, log, command, faults, onDatabase }, closers) {
    await faults?.at('before_database');
    const { db, opened } = await openStorage(config, log, command);
    onDatabase?.(db.knex);
    closers.push(() => db.close());
    return { db, opened, roots: () => Promise.resolve(opened.roots) };
  },
});

/** The files' bytes, content-addressed under `<data dir>/blobs/`. */
export const blobs = defineService({
  name: 'blobs',
  needs: ['config'],
  provides: ['blobs'],
  open: ({ config }) => ({ blobs: createBlobStore(path.join(config.data_dir, 'blobs')) }),
});

/** The database, migrated, and the host roots (made by the first start: docs/audit.md, "Host roots"). */
async function openStorage(config: Config, log: Logger, command: string) {
  const db = await openMigrated(config, log, command);
  try {
    const tokenHashes = () => storedTokenHashes(db.knex);
    const head = (q?: Queryable) => headSeq(q ?? db.knex);
    return {
      db,
      opened: await openHostRoots(
        db.knex,
        config.secrets.host_roots_path,
        log,
        tokenHashes,
        head,
        sealUnsealedRecords,
        sealUnsealedPolicy,
      ),
    };
  } catch (err) {
    await db.close();
    throw err;
  }
}

/**
 * The database, opened and migrated; a PostgreSQL that is not ready yet is tried again for up to
 * database.startup_timeout_s (openWhenReady). A data directory that cannot be written is refused first.
 */
function openMigrated(config: Config, log: Logger, command: string): Promise<Database> {
  assertWritableDataDir(config.data_dir);
  return openWhenReady({
    ...{ url: config.database_url, pgliteDir: config.pglite_dir, command, log },
    timeoutMs: config.database.startup_timeout_s * 1000,
    explain: (err) => describePgError(err, config.database_url),
    check: (opened) => upToDate(opened.knex),
    async prepare(opened) {
      const applied = await migrateLatest(opened.knex);
      if (applied.length === 0) return;
      // A new database takes every migration: the count and the newest, not a line listing forty names.
      log.info({ count: applied.length, latest: applied.at(-1) }, 'migrations applied');
      log.debug({ applied }, 'migrations applied, by name');
    },
  });
}
