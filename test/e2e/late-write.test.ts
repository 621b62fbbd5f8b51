import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client } from '@modelcontextprotocol/client';
import pg from 'pg';
import { createUser } from '../../src/accounts/users.ts';
import type { Agent } from '../../src/core/identity.ts';
import { createLogger } from '../../src/log.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { databaseKinds, describeOnPostgres } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, waitFor, type TestServer } from '../helpers/server.ts';

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
    const knex = server.sql;
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

for (const kind of databaseKinds()) {
  describe(`a remote write's answer arriving after reconciliation (${kind})`, () => {
    let server: TestServer;
    let agent: Client;

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    /**
     * A write drafted and approved as if through an upstream MCP server (the approval binds that
     * source), its execution started and its answer not back, two call deadlines ago as far as
     * reconciliation can see.
     */
    async function staleUpstreamExecution(chairName: string, text: string, ids: string) {
      const { approvals } = server.services;
      const knex = server.sql;
      const chair = await createUser(knex, {
        name: chairName,
        roles: ['chair'],
        password: `${chairName} password`,
      });
      const args = { target_type: 'contact', target_id: 'ct_david', content_text: text };
      const draft = await call(agent, 'isphere_send_message', args);
      const requestId = draft.approval.approval_request_id as string;
      // Before the decision: the chair's approval (and its MAC) binds the upstream source.
      await knex('approval_requests').where({ id: requestId }).update({ source: 'mcp:crm' });
      const approvalId = await approveAsChair({ approvals, user: chair }, draft);
      const request = (await knex('approval_requests').where({ id: requestId }).first()) as {
        content_sha256: string;
        agent_id: string;
        target_display: string | null;
      };
      const agentRow = (await knex('agents').where({ id: request.agent_id }).first()) as Agent;
      const { row } = await approvals.beginExecution({
        agent: agentRow,
        tool: 'send_message',
        approval_id: approvalId,
        target: { target_type: 'contact', target_id: 'ct_david', display_name: request.target_display },
        content_sha256: request.content_sha256,
        file_sha256: null,
        request_id: `rq-${ids}`,
        trace_id: `tr-${ids}`,
        source: 'mcp:crm',
      });
      await knex('approval_requests')
        .where({ id: requestId })
        .update({ execution_started_at: new Date(Date.now() - 3_600_000).toISOString() });
      return { row, requestId };
    }

    it('is recorded unknown by a reconciliation that cannot tell, then settled by the late answer', async () => {
      const { approvals } = server.services;
      const knex = server.sql;
      const { row, requestId } = await staleUpstreamExecution('ada', 'Via an upstream.', 'late');
      const settled = await approvals.reconcile(async () => undefined, createLogger('silent'));
      assert.equal(settled, 1);
      const after = (await knex('approval_requests').where({ id: requestId }).first()) as { status: string };
      assert.equal(after.status, 'unknown', 'an upstream cannot promise "not written"');

      const finished = await approvals.finishExecution(
        row,
        { status: 'succeeded', result: { ref: 'crm-42' } },
        { request_id: 'rq-late', trace_id: 'tr-late', source: 'mcp:crm' },
      );
      assert.equal(finished, false, 'reconciliation had settled it');
      const status = await call(agent, 'isphere_get_approval', { approval_request_id: requestId });
      assert.equal(status.approval.status, 'succeeded');
      const rows = (await knex('audit_events')
        .where({ approval_request_id: requestId })
        .whereLike('kind', 'write.%')
        .orderBy('seq')) as { kind: string; details: Record<string, unknown> }[];
      assert.deepEqual(
        rows.map((r) => [r.kind, r.details.late ?? null, r.details.status_before ?? null]),
        [
          ['write.started', null, null],
          ['write.unknown', null, null],
          ['write.succeeded', true, 'unknown'],
        ],
      );
      assert.equal(rows[2]!.details.ref, 'crm-42');
    });
    it('that landed and was found by reconciliation is recorded once more as a late answer, the status kept', async () => {
      const { approvals } = server.services;
      const knex = server.sql;
      // The upstream made the write; the process that asked for it stopped (SIGSTOP) before recording
      // its answer, and another replica's reconciliation asked the upstream and was told "written".
      const { row, requestId } = await staleUpstreamExecution('grace', 'Landed, then paused.', 'paused');
      const settled = await approvals.reconcile(
        async () => ({ found: true, ref: 'crm-7' }),
        createLogger('silent'),
      );
      assert.equal(settled, 1);

      const finished = await approvals.finishExecution(
        row,
        { status: 'succeeded', result: { ref: 'crm-7' } },
        { request_id: 'rq-paused', trace_id: 'tr-paused', source: 'mcp:crm' },
      );
      assert.equal(finished, false, 'reconciliation had settled it');
      const status = await call(agent, 'isphere_get_approval', { approval_request_id: requestId });
      assert.equal(status.approval.status, 'succeeded');
      const rows = (await knex('audit_events')
        .where({ approval_request_id: requestId })
        .whereLike('kind', 'write.%')
        .orderBy('seq')) as { kind: string; details: Record<string, unknown> }[];
      assert.deepEqual(
        rows.map((r) => [
          r.kind,
          r.details.reconciled ?? null,
          r.details.late ?? null,
          r.details.status_before ?? null,
          r.details.status_after ?? null,
        ]),
        [
          ['write.started', null, null, null, null],
          ['write.succeeded', true, null, null, null],
          ['write.succeeded', null, true, 'succeeded', 'succeeded'],
        ],
      );
    });
  });
}
