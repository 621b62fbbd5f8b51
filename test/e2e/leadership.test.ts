import assert from 'node:assert/strict';
import { after, before, it } from 'node:test';
import pg from 'pg';
import { createLeadership, type Leadership } from '../../src/cluster/leadership.ts';
import { createLogger } from '../../src/log.ts';
import { createTestDatabase, describeOnPostgres, type TestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/server.ts';

/** Tries for the lock often, so that the tests do not wait the production 2 s. */
const RETRY_MS = 50;

describeOnPostgres('leadership by advisory lock on PostgreSQL', () => {
  let testDb: TestDatabase;
  const log = createLogger('silent');
  const opened: Leadership[] = [];
  const lead = async () => {
    const l = await createLeadership(testDb.url!, log, RETRY_MS);
    opened.push(l);
    return l;
  };
  /** Ends the backend holding the leader lock, as a database restart or a cut connection would. */
  const cutLockConnection = async () => {
    const admin = new pg.Client({ connectionString: testDb.url });
    await admin.connect();
    try {
      const { rowCount } = await admin.query(
        `select pg_terminate_backend(pid) from pg_locks
          where locktype = 'advisory' and granted and database = (select oid from pg_database where datname = current_database())`,
      );
      assert.equal(rowCount, 1, 'one backend holds the leader lock');
    } finally {
      await admin.end();
    }
  };

  before(async () => {
    testDb = await createTestDatabase('postgres');
  });
  after(async () => {
    for (const l of opened) await l.close();
    await testDb.drop();
  });

  it('a replica whose lock connection is cut stops leading, and leads again once it has the lock back', async () => {
    const replica = await lead();
    let leads = 0;
    replica.onLead(() => leads++);
    assert.equal(replica.isLeader(), true);
    await cutLockConnection();
    // onLead is heard only on taking a lead not held: a second time means it was lost and taken back.
    await waitFor('the lead taken again', async () => (leads === 2 ? true : undefined));
    assert.equal(replica.isLeader(), true);
    await replica.close();
  });

  it('when the leader stops, the other replica takes the lead', async () => {
    const first = await lead();
    const second = await lead();
    assert.deepEqual([first.isLeader(), second.isLeader()], [true, false]);
    await first.close();
    await waitFor('the second replica leading', async () => (second.isLeader() ? true : undefined));
    assert.equal(first.isLeader(), false);
    await second.close();
  });
});
