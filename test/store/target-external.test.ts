import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createBlobStore, demoData, importData } from '../../src/connectors/index.ts';
import { resolveLocalTarget } from '../../src/connectors/local/send.ts';
import type { Database } from '../../src/db/knex.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';

/** What the built-in directory says of a target's being outside the organisation (target.external). */
for (const kind of databaseKinds()) {
  describe(`target.external from the built-in directory on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;
    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
      const blobs = createBlobStore(path.join(testDb.dataDir, 'blobs'));
      await importData(db.knex, blobs, demoData());
      await importData(db.knex, blobs, {
        contacts: [{ id: 'ct_unknown', display_name: 'Nobody Knows' }],
        groups: [
          { id: 'gr_inside', display_name: 'Inside only', members: ['ct_alice', 'ct_marco'] },
          { id: 'gr_with_david', display_name: 'With David', members: ['ct_alice', 'ct_david'] },
          { id: 'gr_with_unknown', display_name: 'With unknown', members: ['ct_alice', 'ct_unknown'] },
          { id: 'gr_empty', display_name: 'Nobody yet' },
        ],
      });
    });
    after(async () => {
      await db?.close();
      await testDb?.drop();
    });

    const externalOf = async (type: 'contact' | 'group', id: string) =>
      (await resolveLocalTarget(db.knex, type, id)).external;

    it('says what the import said of a contact, and nothing of one it did not', async () => {
      assert.equal(await externalOf('contact', 'ct_alice'), false);
      assert.equal(await externalOf('contact', 'ct_david'), true);
      assert.equal(await externalOf('contact', 'ct_unknown'), undefined);
    });

    it('calls a group inside only when every member is known to be inside', async () => {
      assert.equal(await externalOf('group', 'gr_inside'), false);
      assert.equal(await externalOf('group', 'gr_with_david'), true);
      assert.equal(await externalOf('group', 'gr_with_unknown'), true);
      assert.equal(await externalOf('group', 'gr_empty'), undefined);
    });
  });
}
