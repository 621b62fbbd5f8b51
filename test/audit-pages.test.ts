import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { EXPORT_PAGE, exportPages } from '../src/audit/export.ts';
import { createAuditLog } from '../src/audit/log.ts';
import { openDatabase, type Database } from '../src/db/knex.ts';
import { migrateLatest } from '../src/db/migrations.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from './helpers/db.ts';

for (const kind of databaseKinds()) {
  describe(`export paging on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;
    const total = EXPORT_PAGE * 9 + 7;
    // Sparse stretches (one row in 300) and a dense one (every row), for the windows to widen and narrow.
    const isError = (i: number) => (i > EXPORT_PAGE * 4 && i <= EXPORT_PAGE * 6) || i % 300 === 0;

    before(async () => {
      testDb = await createTestDatabase(kind);
      db = await openDatabase({
        url: testDb.url,
        pgliteDir: path.join(testDb.dataDir, 'pglite'),
        command: 'test',
      });
      await migrateLatest(db.knex);
      const log = createAuditLog(db.knex);
      await Promise.all(
        Array.from({ length: total }, (_, i) =>
          log.append({ kind: 'tool.call', tool: 't', result: isError(i + 1) ? 'error' : 'ok', details: {} }),
        ),
      );
    });
    after(async () => {
      await db?.close();
      await testDb?.drop();
    });

    const seqs = async (filter: Record<string, string>, maxSeq: number) => {
      const out: number[] = [];
      for await (const page of exportPages(db.knex, filter, maxSeq)) out.push(...page.map((r) => r.seq));
      return out;
    };
    const range = (n: number) => Array.from({ length: n }, (_, i) => i + 1);

    it('returns every row up to the head once, in order', async () => {
      assert.deepEqual(await seqs({}, total), range(total));
      assert.deepEqual(await seqs({}, total - 3), range(total - 3));
    });

    it('returns every matching row of a filter once, in order, through sparse and dense stretches', async () => {
      assert.deepEqual(await seqs({ result: 'error' }, total), range(total).filter(isError));
      assert.deepEqual(
        await seqs({ result: 'ok' }, total),
        range(total).filter((i) => !isError(i)),
      );
    });
  });
}
