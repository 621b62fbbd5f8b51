import assert from 'node:assert/strict';
import { after, before, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client } from '@modelcontextprotocol/client';
import { startProxy, type CuttableProxy } from '../../bench/drill/proxy.ts';
import { createUser } from '../../src/accounts/users.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { loadConfig } from '../../src/config.ts';
import type { FaultPoint, Faults } from '../../src/core/faults.ts';
import { createLogger } from '../../src/log.ts';
import { DATABASE_UNAVAILABLE } from '../../src/server/call.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { createTestDatabase, describeOnPostgres, type TestDatabase } from '../helpers/db.ts';
import { call, connectHttp, type SqlServer, startSqlServer, testEnv, waitFor } from '../helpers/server.ts';

/** The data of the protocol error an execution was answered with. */
interface OutcomeData {
  code: string;
  reason: string;
  approval_id: string;
  approval_request_id: string;
  next_step: { tool: string; arguments: Record<string, unknown> };
  trace_id: string;
}

// The connection is cut with a TCP proxy in front of PostgreSQL; the embedded database has no connection.
describeOnPostgres('an execution the database goes away from, on PostgreSQL', () => {
  let db: TestDatabase;
  let proxy: CuttableProxy;
  let server: SqlServer;
  let agent: Client;
  // Armed by the test: the connection is cut when a call reaches this point (then disarmed).
  let cutAt: FaultPoint | undefined;
  const faults: Faults = {
    at(point) {
      if (point === cutAt) {
        cutAt = undefined;
        proxy.cut();
      }
    },
  };

  before(async () => {
    db = await createTestDatabase('postgres');
    const real = new URL(db.url!);
    proxy = await startProxy({ host: real.hostname, port: Number(real.port || 5432) });
    const viaProxy = new URL(db.url!);
    viaProxy.port = String(proxy.port);
    // A short call deadline, so that reconciliation may settle the execution soon after.
    const env = testEnv(db, { DATABASE_URL: viaProxy.href, COUNTERSIGN_CALL_TIMEOUT_MS: '2000' });
    server = await startSqlServer(loadConfig(env, db.dataDir), createLogger('silent'), { faults });
    agent = await connectHttp(server.url, server.services.firstRun!.token);
  });
  after(async () => {
    await agent?.close();
    await server?.close();
    await proxy?.close();
    await db?.drop();
  });

  it('answers OUTCOME_UNKNOWN with get_approval as the next step for a delivered write whose outcome it could not record, never "retry"', async () => {
    const knex = server.sql;
    const chair = await createUser(knex, {
      name: 'chair-unknown',
      roles: ['chair'],
      password: 'unknown-pass',
    });
    const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'Delivered, then cut.' };
    const draft = await call(agent, 'isphere_send_message', args);
    const approval_id = await approveAsChair({ approvals: server.services.approvals, user: chair }, draft);

    cutAt = 'after_connector_write';
    let data: OutcomeData | undefined;
    await assert.rejects(
      call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id }),
      (err) => {
        assert.ok(err instanceof ProtocolError, String(err));
        assert.equal(err.code, DATABASE_UNAVAILABLE);
        data = err.data as OutcomeData;
        return true;
      },
    );
    assert.equal(data!.code, 'OUTCOME_UNKNOWN', JSON.stringify(data));
    assert.equal(data!.reason, 'database_unavailable');
    assert.equal(data!.approval_id, approval_id);
    assert.equal(data!.approval_request_id, draft.approval.approval_request_id);
    assert.deepEqual(data!.next_step, { tool: 'isphere_get_approval', arguments: { approval_id } });
    assert.ok(data!.trace_id);

    proxy.restore();
    await waitFor('the database to be reachable again', async () => {
      const env = await call(agent, 'isphere_search_contacts', { query: 'david' }).catch(() => undefined);
      return env?.ok ? true : undefined;
    });
    // The message went out once, and the execution started once.
    assert.equal((await knex('messages').where({ write_key: approval_id })).length, 1);
    assert.equal((await knex('audit_events').where({ approval_id, kind: 'write.started' })).length, 1);

    // Repeating it writes nothing: the approval was spent when the write started.
    const again = await call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id });
    assert.equal(again.ok, false);
    assert.deepEqual([again.error.code, again.error.reason], ['APPROVAL_REQUIRED', 'consumed']);
    assert.equal((await knex('messages').where({ write_key: approval_id })).length, 1);

    // The next step, as given, shows the outcome once reconciliation has settled it.
    const settled = await waitFor('reconciliation to settle the execution', async () => {
      await server.services.maintain();
      const env = await call(agent, data!.next_step.tool, data!.next_step.arguments);
      assert.equal(env.ok, true, JSON.stringify(env.error));
      return env.approval.status === 'executing' ? undefined : env;
    });
    assert.equal(settled.approval.status, 'succeeded');
    assert.equal((await verifyDatabaseChain(knex)).first_bad, undefined);
  });

  it('answers the recorded outcome, never "not completed", when the database goes after write.succeeded and before the call\'s own row', async () => {
    const knex = server.sql;
    const chair = await createUser(knex, {
      name: 'chair-recorded',
      roles: ['chair'],
      password: 'recorded-pass',
    });
    const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'Recorded, then cut.' };
    const draft = await call(agent, 'isphere_send_message', args);
    const approval_id = await approveAsChair({ approvals: server.services.approvals, user: chair }, draft);

    // The call's own tool.call row is held back, and the connection cut, once write.succeeded committed.
    cutAt = 'before_call_row';
    let data: OutcomeData & { status?: string } = {} as OutcomeData;
    await assert.rejects(
      call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id }),
      (err) => {
        assert.ok(err instanceof ProtocolError, String(err));
        assert.equal(err.code, DATABASE_UNAVAILABLE);
        data = err.data as typeof data;
        return true;
      },
    );
    assert.notEqual(data.code, 'SOURCE_UNAVAILABLE', JSON.stringify(data));
    assert.equal(data.code, 'OUTCOME_RECORDED', JSON.stringify(data));
    assert.equal(data.status, 'succeeded');
    assert.equal(data.approval_id, approval_id);
    assert.deepEqual(data.next_step, { tool: 'isphere_get_approval', arguments: { approval_id } });
    assert.ok(!('retry_after_s' in data), 'no retry is offered');

    proxy.restore();
    await waitFor('the database to be reachable again', async () => {
      const env = await call(agent, 'isphere_search_contacts', { query: 'david' }).catch(() => undefined);
      return env?.ok ? true : undefined;
    });
    // What the answer said is what is committed: the message went once, and get_approval says succeeded.
    assert.equal((await knex('messages').where({ write_key: approval_id })).length, 1);
    const shown = await call(agent, data.next_step.tool, data.next_step.arguments);
    assert.equal(shown.approval.status, 'succeeded');
    assert.equal((await verifyDatabaseChain(knex)).first_bad, undefined);
  });
});
