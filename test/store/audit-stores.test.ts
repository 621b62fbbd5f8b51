import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { CheckpointDeps } from '../../src/audit/checkpoints.ts';
import { exportToFile } from '../../src/audit/export-file.ts';
import { createExportRecords, type ExportRecords } from '../../src/audit/export-records.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { createAuditReader, type AuditReader } from '../../src/audit/reader.ts';
import { loadSigner } from '../../src/audit/signing.ts';
import type { Database } from '../../src/db/knex.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';

/**
 * What the compliance pages are given instead of the database: the log's reader and the record of
 * exports. The pages' own tests (test/e2e/web-audit.test.ts) drive them through HTTP; these pin what the
 * two answer on a database of their own.
 */
for (const kind of databaseKinds()) {
  describe(`the audit reader and the export records on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;
    let reader: AuditReader;
    let exports: ExportRecords;
    let checkpoints: CheckpointDeps;

    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
      const audit = createAuditLog(db.knex);
      checkpoints = { knex: db.knex, audit, signer: loadSigner(testDb.dataDir), origin: 'countersign:test' };
      reader = createAuditReader(db.knex);
      exports = createExportRecords(db.knex);
    });
    after(async () => {
      await checkpoints.audit.drain();
      await db.close();
      await testDb.drop();
    });

    it('reads an empty log as head 0, no row, no checkpoint, and a chain that verifies', async () => {
      assert.equal(await reader.headSeq(), 0);
      assert.equal(await reader.row(1), undefined);
      assert.equal(await reader.latestCheckpoint(), undefined);
      assert.deepEqual(await reader.query({}, { limit: 10 }), []);
      assert.equal((await reader.verify()).ok, true);
    });

    it('pages the rows newest first, filtered, and reads one row by seq', async () => {
      for (const actor of ['ana', 'ben', 'ana']) {
        await checkpoints.audit.append({ kind: 'user.login', actor, result: 'ok', details: {} });
      }
      assert.equal(await reader.headSeq(), 3);
      const page = await reader.query({}, { limit: 2 });
      assert.deepEqual(
        page.map((r) => r.seq),
        [3, 2],
      );
      const older = await reader.query({}, { beforeSeq: 2, limit: 2 });
      assert.deepEqual(
        older.map((r) => r.seq),
        [1],
      );
      assert.equal((await reader.query({ kind: 'user.login_failed' }, { limit: 10 })).length, 0);
      assert.deepEqual((await reader.row(2))?.actor, 'ben');
    });

    it('finds a recorded export by id with its manifest as signed, and nothing for any other id', async () => {
      const id = randomUUID();
      const { manifest, path: file } = await exportToFile(checkpoints, {
        format: 'jsonl',
        filter: {},
        path: path.join(testDb.dataDir, `${id}.jsonl`),
        name: `audit-${id}.jsonl`,
        actor: 'cleo',
      });
      await exports.recordExport({ id, actor: 'cleo', format: 'jsonl', file_path: file, manifest });
      assert.deepEqual(await exports.findExport(id), {
        id,
        actor: 'cleo',
        format: 'jsonl',
        file_path: file,
        manifest,
      });
      assert.equal((await reader.latestCheckpoint())?.seq, manifest.checkpoint.seq);
      assert.equal(await exports.findExport(randomUUID()), undefined);
      // Not a UUID: not found, without asking the database (PostgreSQL would refuse the uuid).
      assert.equal(await exports.findExport('../../etc/passwd'), undefined);
    });

    it('records an export once: a second record under the same id is refused', async () => {
      const [first] = (await db.knex('audit_exports').select('*')) as { id: string }[];
      const again = await exports.findExport(first!.id);
      await assert.rejects(exports.recordExport(again!));
    });
  });
}
