import assert from 'node:assert/strict';
import { after, before, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client } from '@modelcontextprotocol/client';
import pg from 'pg';
import { createUser } from '../src/accounts/users.ts';
import { approveAsChair } from './helpers/approvals.ts';
import { describeOnPostgres } from './helpers/db.ts';
import { call, connectHttp, startTestServer, waitFor, type TestServer } from './helpers/server.ts';

// A second session holding a table lock needs a database with sessions: PostgreSQL.
describeOnPostgres('a local write stalled past reconciliation', () => {
  let server: TestServer;
  let agent: Client;
  let locker: pg.Client;

  before(async () => {
    // A short deadline and a frequent maintenance round: reconciliation looks at an execution left
    // `executing` after two deadlines, so the whole story takes a few seconds.
    server = await startTestServer('postgres', {
      COUNTERSIGN_CALL_TIMEOUT_MS: '800',
      COUNTERSIGN_MAINTENANCE_INTERVAL_S: '1',
    });
    agent = await connectHttp(server.url, server.demoToken);
    locker = new pg.Client({ connectionString: server.db.url! });
    await locker.connect();
  });
  after(async () => {
    await locker?.end();
    await agent?.close();
    await server?.stop();
  });

  it('is never delivered after reconciliation recorded it as not written, and its late answer is recorded', async () => {
    const knex = server.services.knex;
    const chair = await createUser(knex, { name: 'ada', roles: ['chair'], password: 'ada password' });
    const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'Stalled, then released.' };
    const draft = await call(agent, 'isphere_send_message', args);
    const approvalId = await approveAsChair({ approvals: server.services.approvals, user: chair }, draft);
    const requestId = draft.approval.approval_request_id as string;

    // A stalled database, as far as the messages table goes.
    await locker.query('begin');
    await locker.query('lock table messages in exclusive mode');
    await assert.rejects(
      agent.callTool({
        name: 'isphere_send_message',
        arguments: { ...args, dry_run: false, approval_id: approvalId },
      }),
      (err: unknown) => {
        assert.ok(err instanceof ProtocolError);
        assert.equal(err.code, -32001);
        assert.equal((err.data as { code: string }).code, 'CALL_TIMEOUT');
        return true;
      },
    );
    const settled = await waitFor('reconciliation to settle the execution', async () => {
      const row = (await knex('approval_requests').where({ id: requestId }).first()) as { status: string };
      return row.status === 'executing' ? undefined : row.status;
    });
    await locker.query('commit');

    // The stalled write goes on once the lock is gone: it either lands (and the record must then say
    // succeeded) or is refused (and its answer is recorded as late). Wait for whichever happens.
    await waitFor('the stalled write to finish', async () => {
      const message = await knex('messages').where({ write_key: approvalId }).first();
      const late = await knex('audit_events')
        .where({ approval_request_id: requestId })
        .whereRaw("details->>'late' = 'true'")
        .first();
      return message || late ? true : undefined;
    });
    const messages = await knex('messages').where({ write_key: approvalId });
    const status = await call(agent, 'isphere_get_approval', { approval_request_id: requestId });
    assert.equal(status.ok, true, JSON.stringify(status.error));
    if (messages.length > 0) {
      assert.equal(status.approval.status, 'succeeded', 'a message was delivered: the record must say so');
    } else {
      assert.equal(settled, 'failed');
      assert.equal(status.approval.status, 'failed');
    }
    assert.equal(messages.length, 0, 'reconciliation said "not written": nothing may land afterwards');

    const rows = (await knex('audit_events')
      .where({ approval_request_id: requestId })
      .whereLike('kind', 'write.%')
      .orderBy('seq')) as { kind: string; error_code: string | null; details: Record<string, unknown> }[];
    assert.deepEqual(
      rows.map((r) => [r.kind, r.details.reconciled ?? null, r.details.late ?? null]),
      [
        ['write.started', null, null],
        ['write.failed', true, null],
        ['write.failed', null, true],
      ],
    );
    assert.equal(rows[2]!.details.reason, 'write_fenced');
    assert.equal(rows[2]!.details.status_before, 'failed');
  });
});
