import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { MigrationSource } from '../../src/db/migrations.ts';
import { databaseKinds, openMigratedDatabase } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

const DAY_S = 24 * 3600;

/** isphere_remember / isphere_recall as the memory contract states them (docs/tools.md). */
for (const kind of databaseKinds()) {
  describe(`memory tools on ${kind}`, () => {
    let server: TestServer;
    const clients: Client[] = [];
    const agent = async (name: string) => {
      const client = await connectHttp(server.url, (await createAgent(server.sql, { name })).token);
      clients.push(client);
      return client;
    };
    let a: Client;
    let b: Client;

    before(async () => {
      server = await startTestServer(kind);
      a = await agent('memo-a');
      b = await agent('memo-b');
    });
    after(async () => {
      for (const c of clients) await c.close();
      await server?.stop();
    });

    it('stores a string per session and key for a day by default, and reads it back', async () => {
      const before = Date.now();
      const stored = await call(a, 'isphere_remember', {
        session_id: 's1',
        key: 'draft',
        value: 'שלום, world',
      });
      assert.deepEqual([stored.ok, stored.session_id, stored.key], [true, 's1', 'draft']);
      const lives = Date.parse(stored.expires_at) - before;
      assert.ok(lives >= DAY_S * 1000 - 5_000 && lives <= DAY_S * 1000 + 5_000, `lives ${lives} ms`);

      const got = await call(a, 'isphere_recall', { session_id: 's1', key: 'draft' });
      assert.deepEqual(
        [got.status, got.found, got.value, got.expires_at],
        ['ok', true, 'שלום, world', stored.expires_at],
      );
    });

    it('replaces a note stored again under the same session and key, with its new TTL', async () => {
      await call(a, 'isphere_remember', { session_id: 's2', key: 'k', value: 'first', ttl_seconds: 60 });
      const again = await call(a, 'isphere_remember', {
        session_id: 's2',
        key: 'k',
        value: 'second',
        ttl_seconds: 3600,
      });
      const got = await call(a, 'isphere_recall', { session_id: 's2', key: 'k' });
      assert.deepEqual([got.value, got.expires_at], ['second', again.expires_at]);
      const rows = await server.sql('agent_memory').where({ session_id: 's2', key: 'k' });
      assert.equal(rows.length, 1);
    });

    it('keeps sessions and agents apart: found false and value null elsewhere', async () => {
      await call(a, 'isphere_remember', { session_id: 's3', key: 'k', value: 'mine' });
      for (const [client, session_id] of [
        [a, 's4'],
        [b, 's3'],
      ] as const) {
        const got = await call(client, 'isphere_recall', { session_id, key: 'k' });
        assert.deepEqual(
          [got.ok, got.status, got.found, got.value, got.expires_at],
          [true, 'empty', false, null, null],
        );
      }
    });

    it('answers found false and value null once a note has expired', async () => {
      await call(a, 'isphere_remember', { session_id: 's5', key: 'k', value: 'soon gone' });
      await server
        .sql('agent_memory')
        .where({ session_id: 's5' })
        .update({ expires_at: new Date(Date.now() - 1000) });
      const got = await call(a, 'isphere_recall', { session_id: 's5', key: 'k' });
      assert.deepEqual([got.found, got.value], [false, null]);
    });

    it('refuses bad input with INVALID_ARGUMENT and stores nothing', async () => {
      const refused: [string, Record<string, unknown>, string?][] = [
        ['isphere_remember', { key: 'k', value: 'no session' }],
        ['isphere_remember', { session_id: '', key: 'k', value: 'v' }],
        ['isphere_remember', { session_id: 's6', key: 'k', value: { not: 'a string' } }],
        ['isphere_remember', { session_id: 's6', key: 'k', value: 'v', ttl_seconds: 59 }],
        ['isphere_remember', { session_id: 's6', key: 'k', value: 'v', ttl_seconds: 30 * DAY_S + 1 }],
        ['isphere_remember', { session_id: 's6', key: 'k', value: 'v', ttl_seconds: 60.5 }],
        ['isphere_remember', { session_id: 's6', key: 'k', value: 'v', ttl_s: 60 }],
        [
          'isphere_remember',
          { session_id: 's6', key: 'k', value: 'x'.repeat(64 * 1024 + 1) },
          'value_too_large',
        ],
        ['isphere_remember', { session_id: 's6', key: 'k\u0000', value: 'v' }, 'nul_byte'],
        ['isphere_recall', { key: 'k' }],
        ['isphere_recall', { session_id: 's6' }],
      ];
      for (const [tool, args, reason] of refused) {
        const res = await call(a, tool, args);
        assert.equal(res.error?.code, 'INVALID_ARGUMENT', `${tool} ${JSON.stringify(args).slice(0, 80)}`);
        if (reason) assert.equal(res.error.reason, reason);
      }
      assert.equal((await server.sql('agent_memory').where({ session_id: 's6' })).length, 0);
    });

    it('takes the contract limits at their edges', async () => {
      for (const ttl_seconds of [60, 30 * DAY_S]) {
        const res = await call(a, 'isphere_remember', {
          session_id: 's7',
          key: `t${ttl_seconds}`,
          value: '',
          ttl_seconds,
        });
        assert.equal(res.ok, true);
      }
      const big = await call(a, 'isphere_remember', {
        session_id: 's7',
        key: 'big',
        value: 'é'.repeat(32 * 1024),
      });
      assert.equal(big.ok, true, '64 KiB of UTF-8 exactly');
      assert.equal(
        (await call(a, 'isphere_recall', { session_id: 's7', key: 'big' })).value,
        'é'.repeat(32 * 1024),
      );
    });
  });

  describe(`the memory migration on ${kind}`, () => {
    it('keeps notes stored before sessions under session "default", their values as text', async () => {
      const { testDb, db } = await openMigratedDatabase(kind);
      try {
        const source = { migrationSource: new MigrationSource() };
        await db.knex.migrate.down({ ...source, name: '20261201100000-agent-memory-sessions' });
        const { agent } = await createAgent(db.knex, { name: 'old' });
        const later = new Date(Date.now() + 3600_000).toISOString();
        const note = (key: string, v: unknown) => ({
          agent_id: agent.id,
          key,
          value: JSON.stringify({ v }),
          expires_at: later,
          updated_at: new Date().toISOString(),
        });
        await db.knex('agent_memory').insert([note('text', 'plain words'), note('json', { n: 1, s: 'x' })]);
        await db.knex.migrate.latest(source);
        const rows = await db.knex('agent_memory').select('session_id', 'key', 'value').orderBy('key');
        assert.deepEqual(
          rows.map((r: Record<string, unknown>) => [r.session_id, r.key, r.value]),
          [
            ['default', 'json', '{"n": 1, "s": "x"}'],
            ['default', 'text', 'plain words'],
          ],
        );
      } finally {
        await db.close();
        await testDb.drop();
      }
    });
  });
}
