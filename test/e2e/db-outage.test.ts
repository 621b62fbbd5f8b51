import assert from 'node:assert/strict';
import { after, before, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client } from '@modelcontextprotocol/client';
import { startProxy, type CuttableProxy } from '../../bench/drill/proxy.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { loadConfig } from '../../src/config.ts';
import { createLogger } from '../../src/log.ts';
import { DATABASE_UNAVAILABLE } from '../../src/server/call.ts';
import type { Faults } from '../../src/core/faults.ts';
import { createUser } from '../../src/accounts/users.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { createTestDatabase, describeOnPostgres, type TestDatabase } from '../helpers/db.ts';
import { call, connectHttp, type SqlServer, startSqlServer, testEnv, waitFor } from '../helpers/server.ts';
import { slowHandlers } from '../helpers/faults.ts';

// The connection is cut with a TCP proxy in front of PostgreSQL; the embedded database has no connection.
describeOnPostgres('the database connection cut mid-load, on PostgreSQL', () => {
  let db: TestDatabase;
  let proxy: CuttableProxy;
  let server: SqlServer;
  let agent: Client;

  // Handlers wait 300 ms first, so that a cut can land between authentication and the handler's first
  // query; the test is told when a call has begun that wait, and cuts then.
  let handlerReached = () => {};
  const slow = slowHandlers(300);
  const faults: Faults = {
    async at(point) {
      if (point === 'before_handler') handlerReached();
      await slow.at(point);
    },
  };

  before(async () => {
    db = await createTestDatabase('postgres');
    const real = new URL(db.url!);
    proxy = await startProxy({ host: real.hostname, port: Number(real.port || 5432) });
    const viaProxy = new URL(db.url!);
    viaProxy.port = String(proxy.port);
    const env = testEnv(db, { DATABASE_URL: viaProxy.href });
    server = await startSqlServer(loadConfig(env, db.dataDir), createLogger('silent'), { faults });
    agent = await connectHttp(server.url, server.services.firstRun!.token);
  });
  after(async () => {
    await agent?.close();
    await server?.close();
    await proxy?.close();
    await db?.drop();
  });

  it('answers structured SOURCE_UNAVAILABLE during the cut, writes nothing unaudited, and recovers without a restart', async () => {
    const knex = server.sql;
    const chair = await createUser(knex, {
      name: 'chair-outage',
      roles: ['chair'],
      password: 'outage-password',
    });
    const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'Sent after the outage.' };
    const draft = await call(agent, 'isphere_send_message', args);
    const approval_id = await approveAsChair({ approvals: server.services.approvals, user: chair }, draft);
    const headBefore = (await verifyDatabaseChain(knex)).rows;

    // A call already past authentication when the connection goes: its handler's first query fails and
    // its audit row cannot be written, so it is a protocol error naming the outage, not a tool result.
    const inHandler = new Promise<void>((resolve) => (handlerReached = resolve));
    const inFlight = call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id });
    await inHandler;
    proxy.cut();
    await assert.rejects(inFlight, (err: unknown) => {
      assert.ok(err instanceof ProtocolError, String(err));
      assert.equal(err.code, DATABASE_UNAVAILABLE);
      assert.equal((err.data as { code: string }).code, 'SOURCE_UNAVAILABLE');
      return true;
    });

    // A new request during the cut: authentication needs the database, so HTTP 503 problem JSON.
    const res = await fetch(new URL('/mcp', server.url), {
      method: 'POST',
      headers: {
        Authorization: `Bearer ${server.services.firstRun!.token}`,
        'Content-Type': 'application/json',
        Accept: 'application/json, text/event-stream',
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    assert.equal(res.status, 503);
    assert.match(res.headers.get('content-type') ?? '', /application\/problem\+json/);
    const problem = (await res.json()) as { code: string; reason: string };
    assert.deepEqual([problem.code, problem.reason], ['SOURCE_UNAVAILABLE', 'database_unavailable']);

    proxy.restore();
    const back = await waitFor('the database to be reachable again', async () => {
      const env = await call(agent, 'isphere_search_contacts', { query: 'david' }).catch(() => undefined);
      return env?.ok ? env : undefined;
    });
    assert.equal(back.ok, true);

    // The refused attempt never reached the approval: it is still unspent, and nothing was sent or started.
    const row = await knex('approval_requests').where({ approval_id }).first();
    assert.equal(row.status, 'approved');
    assert.equal((await knex('messages').where({ write_key: approval_id })).length, 0);
    assert.equal((await knex('audit_events').where({ approval_id, kind: 'write.started' })).length, 0);

    const sent = await call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id });
    assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
    assert.equal((await knex('messages').where({ write_key: approval_id })).length, 1, 'exactly one message');
    assert.equal(
      (await knex('audit_events').where({ approval_id, kind: 'write.started' })).length,
      1,
      'exactly one execution',
    );

    const report = await verifyDatabaseChain(knex);
    assert.equal(report.first_bad, undefined);
    assert.ok(report.rows > headBefore);
  });
});
