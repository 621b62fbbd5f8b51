import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { after, before, it } from 'node:test';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { openDatabase, type Database } from '../../src/db/knex.ts';
import { migrateLatest } from '../../src/db/migrations.ts';
import { createTestDatabase, describeOnPostgres, type TestDatabase } from '../helpers/db.ts';
import { ROOT } from '../helpers/server.ts';

// Only PostgreSQL can be shared by several processes.
describeOnPostgres('concurrent appends from 3 processes on PostgreSQL', () => {
  let testDb: TestDatabase;
  let db: Database;
  before(async () => {
    testDb = await createTestDatabase('postgres');
    db = await openDatabase({ url: testDb.url, pgliteDir: '', command: 'test' });
    await migrateLatest(db.knex);
  });
  after(async () => {
    await db?.close();
    await testDb?.drop();
  });

  it('leave one unbroken chain: no forks, no gaps', async () => {
    const perWorker = 300;
    const runs = ['a', 'b', 'c'].map(
      (worker) =>
        new Promise<number | null>((resolve, reject) => {
          const child = spawn(
            process.execPath,
            ['--import', 'tsx', path.join(ROOT, 'test/helpers/append-worker.ts')],
            {
              cwd: ROOT,
              env: {
                PATH: process.env.PATH ?? '',
                DATABASE_URL: testDb.url!,
                WORKER: worker,
                COUNT: String(perWorker),
              },
              stdio: ['ignore', 'ignore', 'inherit'],
            },
          );
          child.on('error', reject);
          child.on('exit', resolve);
        }),
    );
    assert.deepEqual(await Promise.all(runs), [0, 0, 0]);
    const report = await verifyDatabaseChain(db.knex);
    assert.equal(report.first_bad, undefined);
    assert.equal(report.rows, 3 * perWorker);
    assert.equal(report.head_seq, 3 * perWorker);
    const forks = await db
      .knex('audit_events')
      .select('prev_hash')
      .count({ n: '*' })
      .groupBy('prev_hash')
      .havingRaw('count(*) > 1');
    assert.deepEqual(forks, [], 'no two rows claim the same predecessor');
    const byWorker = (await db
      .knex('audit_events')
      .select('tool')
      .count({ n: '*' })
      .groupBy('tool')
      .orderBy('tool')) as {
      tool: string;
      n: unknown;
    }[];
    assert.deepEqual(
      byWorker.map((r) => [r.tool, Number(r.n)]),
      [
        ['worker-a', perWorker],
        ['worker-b', perWorker],
        ['worker-c', perWorker],
      ],
    );
  });
});
