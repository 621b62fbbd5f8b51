import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import knexFactory, { type Knex } from 'knex';
import { AuditInput, auditInput } from '../../src/audit/chain.ts';
import { AuditKind } from '../../src/core/audit-kinds.ts';
import { createAuditLog } from '../../src/audit/log.ts';
import { outageOf } from '../../src/db/outage.ts';
import { AppError } from '../../src/core/errors.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { isConnectionError, keptConnection, named, type Database } from '../../src/db/knex.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/server.ts';

/** One prepared statement on its own: the appends' kind of connection, handed back after it. */
async function runPrepared(knex: Knex, name: string, sql: string, values: unknown[]) {
  const statements = keptConnection(knex);
  try {
    return await statements.run(name, sql, values);
  } finally {
    await statements.release();
  }
}

for (const kind of databaseKinds()) {
  describe(`audit appends on ${kind}, with more than one writer`, () => {
    let testDb: TestDatabase;
    let db: Database;
    const row = (tool: string, i: number) => ({
      kind: 'tool.call' as const,
      tool,
      result: 'ok' as const,
      details: { i },
    });

    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
    });
    after(async () => {
      await db?.close();
      await testDb?.drop();
    });

    it("two logs taking turns (each one's head goes stale) still leave one chain", async () => {
      const a = createAuditLog(db.knex);
      const b = createAuditLog(db.knex);
      const seqs: number[] = [];
      for (let i = 0; i < 20; i++) {
        const log = i % 3 === 0 ? b : a;
        const rows = await Promise.all([log.append(row('x', i)), log.append(row('y', i))]);
        seqs.push(...rows.map((r) => r.seq));
      }
      const both = await Promise.all(
        Array.from({ length: 40 }, (_, i) => (i % 2 ? a : b).append(row('z', i))),
      );
      seqs.push(...both.map((r) => r.seq));
      assert.deepEqual(
        [...seqs].sort((x, y) => x - y),
        Array.from({ length: 80 }, (_, i) => i + 1),
      );
      const report = await verifyDatabaseChain(db.knex);
      assert.equal(report.first_bad, undefined);
      assert.equal(report.valid, 80);
    });

    it('rows appended in a transaction that rolls back leave no gap for the next append', async () => {
      const log = createAuditLog(db.knex);
      const before = await log.append(row('before', 0));
      await assert.rejects(
        db.knex.transaction(async (trx) => {
          await log.appendIn(trx, row('rolled-back', 1), row('rolled-back', 2));
          throw new Error('roll back');
        }),
        /roll back/,
      );
      const next = await log.append(row('after', 3));
      assert.equal(next.seq, before.seq + 1);
      assert.equal(next.prev_hash, before.hash);
      assert.equal((await verifyDatabaseChain(db.knex)).first_bad, undefined);
    });

    it('a row appended in a committed transaction is linked by the next batch', async () => {
      const log = createAuditLog(db.knex);
      await log.append(row('first', 0));
      const [inTrx] = await db.knex.transaction((trx) => log.appendIn(trx, row('in-trx', 1)));
      const next = await log.append(row('next', 2));
      assert.equal(next.prev_hash, inTrx!.hash);
      assert.equal((await verifyDatabaseChain(db.knex)).first_bad, undefined);
    });

    it('runs a prepared statement on the pool or in a transaction, and announces each one to knex', async () => {
      const sql = 'select ?::int + ?::int as sum, ?::text as word';
      const seen: { sql: string }[] = [];
      const listen = (q: { sql: string }) => seen.push(q);
      db.knex.on('query', listen);
      try {
        for (const [a, b] of [
          [1, 2],
          [40, 2],
        ])
          assert.deepEqual((await runPrepared(db.knex, 'test_sum', sql, [a, b, 'w'])).rows, [
            { sum: a! + b!, word: 'w' },
          ]);
        // In a transaction it runs on the transaction's connection: it sees what the transaction wrote.
        await db.knex.schema.createTable('prepared_probe', (t) => t.integer('n'));
        const inside = await db.knex.transaction(async (trx) => {
          await trx('prepared_probe').insert({ n: 7 });
          return runPrepared(
            trx,
            'test_probe',
            'select count(*)::int as n from prepared_probe where n = ?',
            [7],
          );
        });
        assert.deepEqual(inside.rows, [{ n: 1 }]);
        assert.equal(seen.filter((q) => q.sql.includes('as word')).length, 2);
        const failed = await runPrepared(db.knex, 'test_bad', 'select ?::int', ['x']).catch(
          (e: unknown) => e,
        );
        assert.equal((failed as { code?: string }).code, '22P02');
        assert.equal(isConnectionError(failed), false);
      } finally {
        db.knex.off('query', listen);
        await db.knex.schema.dropTableIfExists('prepared_probe');
      }
    });

    it('names a hot read on PostgreSQL, which then parses and plans it once per connection', async () => {
      await db.knex.schema.createTable('named_probe', (t) => t.integer('n'));
      try {
        const found = await db.knex.transaction(async (trx) => {
          await trx('named_probe').insert([{ n: 7 }, { n: 8 }]);
          const read = (n: number) =>
            named(trx, 'countersign_test_named_probe', trx('named_probe').where({ n }).first());
          const rows = [await read(7), await read(8), await read(9)];
          const { rows: prepared } = (await trx.raw(
            `select statement from pg_prepared_statements where name = 'countersign_test_named_probe'`,
          )) as { rows: { statement: string }[] };
          return { rows, prepared };
        });
        assert.deepEqual(found.rows, [{ n: 7 }, { n: 8 }, undefined]);
        if (kind === 'postgres') {
          assert.equal(found.prepared.length, 1, 'one prepared statement, used three times');
          assert.match(found.prepared[0]!.statement, /from "named_probe" where "n" = \$1 limit \$2/);
        } else assert.deepEqual(found.prepared, [], 'PGlite runs it as it is');
      } finally {
        await db.knex.schema.dropTableIfExists('named_probe');
      }
    });

    it('keeps one connection across statements that follow each other, and hands it back', async () => {
      const statements = keptConnection(db.knex, 200);
      const used = () => (db.knex.client as { pool: { numUsed(): number } }).pool.numUsed();
      const backend = async () => {
        const { rows } = await statements.run(
          'test_backend',
          'select pg_backend_pid() as pid, ?::int as n',
          [1],
        );
        return (rows[0] as { pid: number }).pid;
      };
      // The logs of the tests above hand their connections back once idle.
      if (kind === 'postgres') await waitFor('an idle pool', async () => (used() === 0 ? true : undefined));
      const first = await backend();
      if (kind === 'pglite') {
        assert.equal(await backend(), first, 'PGlite has one connection');
        return;
      }
      assert.equal(await backend(), first);
      assert.equal(used(), 1, 'kept between statements');
      // A statement that fails in the database leaves the connection as good as it was.
      const bad = await statements.run('test_bad_kept', 'select ?::int', ['x']).catch((e: unknown) => e);
      assert.equal((bad as { code?: string }).code, '22P02');
      assert.equal(await backend(), first);
      // Idle for longer than its limit, the connection goes back to the pool.
      await waitFor('the idle connection handed back', async () => (used() === 0 ? true : undefined));
      // A connection the database ended is handed back at once; the next statement takes another.
      const kept = await backend();
      await db.knex.raw('select pg_terminate_backend(?)', [kept]);
      // The statement that finds it ended fails as an outage would; the next ones run on another.
      const again = await waitFor('a statement on another connection', () =>
        backend().catch(() => undefined),
      );
      assert.notEqual(again, kept);
      await statements.release();
      assert.equal(used(), 0, 'handed back on release');
    });
  });
}

describe('an audit append the database cannot take', () => {
  it('is refused as audit_unavailable when the database cannot be reached, without SQL in the message', async () => {
    const knex = knexFactory({
      client: 'pg',
      connection: 'postgres://nobody@127.0.0.1:1/none',
      pool: { min: 0, max: 1 },
    });
    try {
      const log = createAuditLog(knex);
      const err = await log.append({ kind: 'tool.call', result: 'ok' }).catch((e: unknown) => e);
      assert.ok(outageOf(err), String(err));
      assert.ok(err instanceof AppError);
      assert.equal(err.reason, 'audit_unavailable');
      assert.equal(err.code, 'SOURCE_UNAVAILABLE');
      assert.doesNotMatch(err.message, /insert|select/i);
    } finally {
      await knex.destroy();
    }
  });

  it('tells an outage from a wrong query', () => {
    for (const outage of [
      Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' }),
      new Error('Connection terminated unexpectedly'),
      Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' }),
      Object.assign(new Error('connection failure'), { code: '08006' }),
      Object.assign(new Error('Knex: Timeout acquiring a connection.'), { name: 'KnexTimeoutError' }),
    ])
      assert.equal(isConnectionError(outage), true, outage.message);
    for (const bug of [
      Object.assign(new Error('duplicate key value violates unique constraint'), { code: '23505' }),
      Object.assign(new Error('syntax error at or near "selec"'), { code: '42601' }),
      new TypeError('x is undefined'),
      undefined,
    ])
      assert.equal(isConnectionError(bug), false, String(bug));
  });
});

describe('an audit input checked by hand, as the schema checks it', () => {
  /** What the schema makes of `input`: its output, or that it throws. */
  const bySchema = (input: unknown) => {
    const parsed = AuditInput.safeParse(input);
    return parsed.success ? { output: parsed.data } : { refused: true };
  };
  const byHand = (input: unknown) => {
    try {
      return { output: auditInput(input as AuditInput) };
    } catch {
      return { refused: true };
    }
  };
  // Mostly values the schema takes, now and then one it refuses: both branches get exercised.
  const rarely = <T, U>(usual: fc.Arbitrary<T>, odd: fc.Arbitrary<U>) =>
    fc.oneof({ weight: 20, arbitrary: usual }, { weight: 1, arbitrary: odd });
  const unset = fc.constantFrom(undefined, null);
  const text = rarely(fc.oneof(unset, fc.string({ maxLength: 8 })), fc.integer());
  const input = fc.record(
    {
      kind: rarely(fc.constantFrom(...AuditKind.options), fc.string({ maxLength: 6 })),
      request_id: text,
      trace_id: text,
      agent_id: text,
      actor: text,
      tool: text,
      source: text,
      target_type: text,
      target_ref: text,
      approval_request_id: text,
      approval_id: text,
      approvers: rarely(
        fc.oneof(unset, fc.array(fc.string({ maxLength: 4 }))),
        fc.array(fc.integer(), { minLength: 1 }),
      ),
      dry_run: rarely(fc.oneof(unset, fc.boolean()), fc.string({ maxLength: 2 })),
      content_sha256: text,
      file_sha256: text,
      result: rarely(fc.constantFrom(undefined, null, 'ok', 'error'), fc.constant('maybe')),
      error_code: text,
      details: rarely(
        fc.oneof(
          fc.constant(undefined),
          fc.dictionary(fc.string({ maxLength: 4 }), fc.jsonValue({ maxDepth: 1 })),
        ),
        fc.oneof(fc.constant(null), fc.array(fc.integer()), fc.constant(new Date(0))),
      ),
    },
    { requiredKeys: ['kind'] },
  );
  // Now and then a key the schema does not know.
  const withStray = fc
    .tuple(input, rarely(fc.constant(false), fc.constant(true)))
    .map(([i, stray]) => (stray ? { ...i, stray: 1 } : i));

  it('accepts what the schema accepts, with the same output, and refuses what it refuses', () => {
    let accepted = 0;
    fc.assert(
      fc.property(withStray, (i) => {
        const hand = byHand(i);
        assert.deepEqual(hand, bySchema(i));
        if ('output' in hand) accepted++;
      }),
      { numRuns: 5000 },
    );
    // Most inputs are accepted (the hand-checked path), a good share refused (the schema's).
    assert.ok(accepted > 1000 && accepted < 4900, `${accepted} of 5000 accepted`);
  });
});
