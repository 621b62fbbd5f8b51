import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client } from '@modelcontextprotocol/client';
import { startProxy, type CuttableProxy } from '../bench/drill/proxy.ts';
import { verifyDatabaseChain } from '../src/audit/verify.ts';
import { loadConfig } from '../src/config.ts';
import { createLogger } from '../src/log.ts';
import { DATABASE_UNAVAILABLE } from '../src/server/pipeline.ts';
import { startHttpServer, type RunningServer } from '../src/app/serve-http.ts';
import { createUser } from '../src/accounts/users.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from './helpers/db.ts';
import { call, connectHttp, waitFor, testEnv } from './helpers/server.ts';
import { slowHandlers } from './helpers/faults.ts';

// The connection is cut with a TCP proxy in front of PostgreSQL; the embedded database has no connection.
for (const _kind of databaseKinds().filter((k) => k === 'postgres')) {
  describe('the database connection cut mid-load, on PostgreSQL', () => {
    let db: TestDatabase;
    let proxy: CuttableProxy;
    let server: RunningServer;
    let agent: Client;

    before(async () => {
      db = await createTestDatabase('postgres');
      const real = new URL(db.url!);
      proxy = await startProxy({ host: real.hostname, port: Number(real.port || 5432) });
      const viaProxy = new URL(db.url!);
      viaProxy.port = String(proxy.port);
      // Handlers wait a little first, so that a cut can land between authentication and the audit row.
      const env = testEnv(db, { DATABASE_URL: viaProxy.href });
      server = await startHttpServer(loadConfig(env, db.dataDir), createLogger('silent'), {
        faults: slowHandlers(300),
      });
      agent = await connectHttp(server.url, server.services.firstRun!.token);
    });
    after(async () => {
      await agent?.close();
      await server?.close();
      await proxy?.close();
      await db?.drop();
    });

    it('answers structured SOURCE_UNAVAILABLE during the cut, writes nothing unaudited, and recovers without a restart', async () => {
      const knex = server.services.knex;
      const chair = await createUser(knex, {
        name: 'chair-outage',
        roles: ['chair'],
        password: 'outage-password',
      });
      const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'Sent after the outage.' };
      const draft = await call(agent, 'isphere_send_message', args);
      const { approval_id } = await server.services.approvals.decide({
        id: draft.approval.approval_request_id,
        user: chair,
        decision: 'approve',
      });
      const headBefore = (await verifyDatabaseChain(knex)).rows;

      // A call already past authentication when the connection goes: a protocol error naming the outage.
      const inFlight = call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id });
      await new Promise((r) => setTimeout(r, 100));
      proxy.cut();
      const refused = await inFlight.then(
        (env) => ({ env }),
        (err: unknown) => ({ err }),
      );
      if ('err' in refused) {
        assert.ok(refused.err instanceof ProtocolError, String(refused.err));
        assert.equal(refused.err.code, DATABASE_UNAVAILABLE);
        assert.equal((refused.err.data as { code: string }).code, 'SOURCE_UNAVAILABLE');
      } else {
        // The database came back in time to audit the failure: then it is an envelope saying so.
        assert.equal(refused.env.error?.code, 'SOURCE_UNAVAILABLE');
      }

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
      assert.equal(((await res.json()) as { code: string }).code, 'database_unavailable');

      proxy.restore();
      const back = await waitFor('the database to be reachable again', async () => {
        const env = await call(agent, 'isphere_search_contacts', { query: 'david' }).catch(() => undefined);
        return env?.ok ? env : undefined;
      });
      assert.equal(back.ok, true);

      // The approval was not spent by the refused attempt (or, if its start was recorded, it is reconciled).
      const row = await knex('approval_requests').where({ approval_id }).first();
      if (row.status === 'approved') {
        const sent = await call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id });
        assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
      }
      const messages = await knex('messages').where({ write_key: approval_id });
      const started = await knex('audit_events').where({ approval_id, kind: 'write.started' });
      assert.ok(messages.length <= 1, 'at most one message');
      assert.ok(started.length <= 1, 'at most one execution');
      assert.equal(started.length, messages.length, 'a message exactly when its write.started is recorded');

      const report = await verifyDatabaseChain(knex);
      assert.equal(report.first_bad, undefined);
      assert.ok(report.rows > headBefore);
    });
  });
}
