import assert from 'node:assert/strict';
import { after, before, it } from 'node:test';
import knexFactory, { type Knex } from 'knex';
import { ProtocolError, type Client } from '@modelcontextprotocol/client';
import { AUDIT_LOCK_KEY, createAuditLog } from '../../src/audit/log.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { createAnswerHold } from '../../src/server/call-context.ts';
import { DATABASE_UNAVAILABLE } from '../../src/server/call.ts';
import { describeOnPostgres } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

/**
 * A 2025-era call over HTTP prepares its answer while its audit row commits (src/server/call-context.ts),
 * and sends it only once the row is committed. Here another session holds the chain's advisory lock, so
 * the call's append waits in the database for as long as the test wants.
 */
describeOnPostgres('an answer held until its audit row commits', () => {
  let server: TestServer;
  let agent: Client;
  /** A second connection to the same database: the other writer. */
  let other: Knex;

  before(async () => {
    server = await startTestServer('postgres');
    agent = await connectHttp(server.url, server.demoToken);
    other = knexFactory({ client: 'pg', connection: server.db.url, pool: { min: 0, max: 2 } });
    // This server's audit log now knows the chain's head: its next append is the one-statement one.
    await call(agent, 'isphere_search_contacts', { query: 'david' });
  });
  after(async () => {
    await agent?.close();
    await other?.destroy();
    await server?.stop();
  });

  const search = () => call(agent, 'isphere_search_contacts', { query: 'david' });

  /** The backend of a statement waiting for the chain's lock, once there is one. */
  const waiter = () =>
    waitFor('an append waiting for the chain lock', async () => {
      const { rows } = (await other.raw(
        // Advisory locks are per database: another database's waiter (another suite) is not this one.
        `select pid from pg_locks
         where locktype = 'advisory' and objid = ? and not granted
           and database = (select oid from pg_database where datname = current_database())`,
        [AUDIT_LOCK_KEY],
      )) as { rows: { pid: number }[] };
      return rows[0]?.pid;
    });

  /** Runs `during` in a transaction of the other connection that holds the chain's lock. */
  const holdingTheLock = <T>(during: (trx: Knex.Transaction) => Promise<T>) =>
    other.transaction(async (trx) => {
      await trx.raw('select pg_advisory_xact_lock(?)', [AUDIT_LOCK_KEY]);
      return during(trx);
    });

  /** Whether `p` settles within 300 ms: time enough for an answer that did not wait for its row. */
  const settlesSoon = async (p: Promise<unknown>) => {
    let settled = false;
    p.then(
      () => (settled = true),
      () => (settled = true),
    );
    await new Promise((r) => setTimeout(r, 300));
    return settled;
  };

  it('is not sent while the row waits, and names the row it was committed as', async () => {
    const before = (await verifyDatabaseChain(server.sql)).rows;
    const answer = await holdingTheLock(async () => {
      const answer = search();
      await waiter();
      assert.equal(await settlesSoon(answer), false, 'answered before its audit row was committed');
      return { answer };
    });
    const envelope = await answer.answer;
    assert.equal(envelope.ok, true);
    const row = await server.sql('audit_events').where({ seq: envelope.audit.audit_seq }).first();
    assert.equal(row.request_id, envelope.audit.request_id);
    const report = await verifyDatabaseChain(server.sql);
    assert.equal(report.first_bad, undefined);
    assert.equal(report.rows, before + 1);
  });

  it('has the call return its result while the row waits, the commit in the hold', async () => {
    const { agent: caller } = await server.services.authenticate(server.demoToken);
    assert.ok(caller);
    const hold = createAnswerHold();
    const committed = await holdingTheLock(async () => {
      // Without the hold the call would wait for the lock this transaction holds until it returns.
      const result = await Promise.race([
        server.services.pipeline.call(
          caller,
          'isphere_search_contacts',
          { query: 'david' },
          new AbortController().signal,
          hold,
        ),
        new Promise<never>((_, reject) =>
          setTimeout(() => reject(new Error('the call waited for its row to commit')), 10_000).unref(),
        ),
      ]);
      await waiter();
      const settled = hold.settled();
      assert.equal(await settlesSoon(settled), false, 'the hold settled before the row was committed');
      return { result, settled };
    });
    assert.equal(await committed.settled, undefined, 'the result stands');
    const audit = (committed.result.structuredContent as { audit: { audit_seq: number; request_id: string } })
      .audit;
    const row = await server.sql('audit_events').where({ seq: audit.audit_seq }).first();
    assert.equal(row.request_id, audit.request_id);
  });

  it('names the row as committed when another writer took the seq it was chained with', async () => {
    const { answer, taken } = await holdingTheLock(async (trx) => {
      const answer = search();
      await waiter();
      // The other writer appends the row the waiting statement was chained to be.
      const [row] = await createAuditLog(other).appendIn(trx, { kind: 'checkpoint', actor: 'other-writer' });
      return { answer, taken: row!.seq };
    });
    const envelope = await answer;
    const row = await server.sql('audit_events').where({ request_id: envelope.audit.request_id }).first();
    assert.equal(Number(row.seq), envelope.audit.audit_seq);
    assert.equal(envelope.audit.audit_seq, taken + 1, 'chained anew after the other writer');
    assert.equal((await verifyDatabaseChain(server.sql)).first_bad, undefined);
  });

  it('is -32003 with SOURCE_UNAVAILABLE, never the result, when the row cannot be committed', async () => {
    const answer = await holdingTheLock(async () => {
      const answer = search().then(
        (envelope) => assert.fail(`answered with a result: ${JSON.stringify(envelope).slice(0, 200)}`),
        (err: unknown) => err,
      );
      // The waiting statement's connection goes away: its row is never committed.
      await other.raw('select pg_terminate_backend(?)', [await waiter()]);
      return { answer };
    });
    const err = await answer.answer;
    assert.ok(err instanceof ProtocolError, String(err));
    assert.equal(err.code, DATABASE_UNAVAILABLE);
    assert.equal((err.data as { code: string }).code, 'SOURCE_UNAVAILABLE');
    // The server goes on: the next call is answered and audited, and the chain is whole.
    const next = await waitFor('a call answered again', async () => {
      const envelope = await search().catch(() => undefined);
      return envelope?.ok ? envelope : undefined;
    });
    assert.equal(typeof next.audit.audit_seq, 'number');
    assert.equal((await verifyDatabaseChain(server.sql)).first_bad, undefined);
  });
});
