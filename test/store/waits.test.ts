import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import client from 'prom-client';
import { keptConnection, type Database } from '../../src/db/knex.ts';
import { createWaitAccount } from '../../src/server/waits.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';

/** The value of `name` (with `kind`, when given) in the registry's metrics. */
async function valueOf(registry: client.Registry, name: string, kind?: string): Promise<number> {
  const metric = (await registry.getMetricsAsJSON()).find((m) => m.name === name);
  const v = metric?.values.find((x) => (kind ? x.labels.kind === kind : true));
  return Number(v?.value ?? 0);
}

for (const kind of databaseKinds()) {
  describe(`where calls wait, on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;
    const registry = new client.Registry();
    const waits = createWaitAccount(registry);

    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
      waits.watch(db.knex);
    });
    after(async () => {
      await db?.close();
      await testDb?.drop();
    });

    it('counts each statement answered, and a transaction’s BEGIN and COMMIT apart', async () => {
      const answered = (k: string) => valueOf(registry, 'countersign_db_answers_total', k);
      const before = { statement: await answered('statement'), commit: await answered('commit') };
      await db.knex.raw('select 1');
      await db.knex.transaction(async (trx) => {
        await trx.raw('select 2');
      });
      const kept = keptConnection(db.knex);
      await kept.run('waits_test', 'select ?::int as n', [3]);
      await kept.release();
      // The COMMIT ends at the connection's return to the pool, or at the next statement on it.
      await db.knex.raw('select 4');
      assert.equal((await answered('statement')) - before.statement, 4);
      assert.equal((await answered('commit')) - before.commit, 1);
      assert.ok((await valueOf(registry, 'countersign_db_wait_seconds_total', 'statement')) > 0);
    });

    it('times an upstream request whether it answers or fails', async () => {
      const ok = waits.upstream(async (n: number) => n + 1);
      const failing = waits.upstream(async () => {
        throw new Error('upstream down');
      });
      assert.equal(await ok(1), 2);
      await assert.rejects(failing(), /upstream down/);
      assert.equal(await valueOf(registry, 'countersign_upstream_calls_total'), 2);
    });

    it("reads the event loop's busy and idle time at each scrape", async () => {
      const loop = async () =>
        (await valueOf(registry, 'countersign_event_loop_idle_seconds')) +
        (await valueOf(registry, 'countersign_event_loop_active_seconds'));
      const before = await loop();
      await new Promise((resolve) => setTimeout(resolve, 20));
      assert.ok((await loop()) > before);
    });
  });
}
