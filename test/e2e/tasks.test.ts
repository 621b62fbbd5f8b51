import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import type { User } from '../../src/core/identity.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { databaseKinds } from '../helpers/db.ts';
import {
  call,
  connectHttp,
  startTestServer,
  waitFor,
  type Envelope,
  type TestServer,
} from '../helpers/server.ts';
import { askAsTask, framed, rawRequest, sentCount, taskSession } from '../helpers/tasks-client.ts';

const TOOL = 'isphere_send_message';
const message = (text: string) => ({ target_type: 'contact', target_id: 'ct_david', content_text: text });

for (const kind of databaseKinds()) {
  describe(`writes asked as tasks (2026-07-28) on ${kind}`, () => {
    let server: TestServer;
    let client: Client;
    let other: { token: string; id: string };
    let chair: User;

    const knex = () => server.sql;
    const sent = (text: string) => sentCount(knex(), text);
    /** The agent's open request for exactly this text, once the task's draft made it. */
    const requestFor = (text: string) =>
      waitFor(`the request for "${text}"`, async () => {
        const rows = (await knex()('approval_requests').orderBy('created_at', 'desc').limit(20)) as {
          id: string;
          review: { content_text?: string };
          status: string;
          content_sha256: string;
        }[];
        return rows.find((r) => r.review.content_text === text || JSON.stringify(r.review).includes(text));
      });
    const decide = (id: string, decision: 'approve' | 'reject', note?: string) =>
      server.services.approvals.decide({ id, user: chair, decision, note });
    const createTask = (text: string, token = server.demoToken) =>
      askAsTask(server.url, token, TOOL, message(text));
    const getTask = (taskId: string, token = server.demoToken) =>
      rawRequest(server.url, token, framed('tasks/get', { taskId }));

    before(async () => {
      server = await startTestServer(kind);
      chair = await createUser(knex(), { name: 'chair-ada', roles: ['chair'], password: 'correct horse 1' });
      const b = await createAgent(knex(), { name: 'agent-b' });
      other = { token: b.token, id: b.agent.id };
      client = await connectHttp(server.url, server.demoToken, 'modern');
    });
    after(async () => {
      await client?.close();
      await server?.stop();
    });

    it('advertises the Tasks extension in server/discover', () => {
      const capabilities = client.getServerCapabilities() as { extensions?: Record<string, unknown> };
      assert.deepEqual(capabilities.extensions?.['io.modelcontextprotocol/tasks'], {});
    });

    it('runs a write through the official requester: task, approval in the web form, completed with sent', async () => {
      const text = 'asked as a task, approved';
      const session = taskSession(client, server.url, server.demoToken);
      try {
        const execution = await session.callTool(TOOL, { ...message(text), dry_run: false });
        assert.equal(execution.kind, 'task');
        const request = await requestFor(text);
        assert.equal(request.status, 'pending');
        // The same request a dry run of the same content finds: same hash, no second request.
        const dry = await call(client, TOOL, message(text));
        assert.equal(dry.approval.approval_request_id, request.id);
        assert.equal(dry.content_sha256, request.content_sha256);
        assert.equal(await sent(text), 0);

        await decide(request.id, 'approve');
        const { outcome } = await execution.settle();
        assert.equal(outcome.status, 'completed', JSON.stringify(outcome));
        const result = (outcome as { result: { structuredContent: Envelope; isError?: boolean } }).result;
        assert.equal(result.isError ?? false, false);
        assert.equal(result.structuredContent.send_status, 'sent');
        assert.equal(result.structuredContent.dry_run, false);
        assert.equal(await sent(text), 1);
      } finally {
        await session.close();
      }
      const request = await requestFor(text);
      const rows = (await knex()('audit_events')
        .where({ approval_request_id: request.id })
        .whereIn('kind', ['write.started', 'write.succeeded'])
        .orderBy('seq')) as { kind: string; details: unknown }[];
      assert.deepEqual(
        rows.map((r) => r.kind),
        ['write.started', 'write.succeeded'],
      );
      for (const row of rows) assert.equal(detailsOf(row).origin, 'task');
      const chain = await verifyDatabaseChain(knex());
      assert.equal(chain.first_bad, undefined);
      assert.equal(chain.valid, chain.rows);
    });

    it('answers a CreateTaskResult naming the review link, and tasks/get the same on every ask', async () => {
      const text = 'the task result itself';
      const created = await createTask(text);
      assert.equal(created.resultType, 'task');
      assert.equal(created.status, 'working');
      assert.match(String(created.statusMessage), /\/approvals\/[0-9a-f-]{36}/);
      assert.equal(typeof created.pollIntervalMs, 'number');
      const request = await requestFor(text);
      const row = (await knex()('approval_requests').where({ id: request.id }).first()) as {
        created_at: Date | string;
        expires_at: Date | string;
      };
      assert.ok(Number(created.ttlMs) > 0);
      assert.ok(
        Date.parse(String(created.createdAt)) + Number(created.ttlMs) >=
          Date.parse(String(row.expires_at)) - 1000,
      );
      const got = await getTask(String(created.taskId));
      assert.equal(got.kind, 'result');
      assert.equal((got as { result: Record<string, unknown> }).result.status, 'working');
    });

    it('refuses the tasks methods to a request that does not declare the extension (-32021)', async () => {
      const created = await createTask('asked, then read without the extension');
      for (const method of ['tasks/get', 'tasks/cancel', 'tasks/update']) {
        const refused = await rawRequest(
          server.url,
          server.demoToken,
          framed(method, { taskId: created.taskId }, false),
        );
        assert.equal(refused.kind, 'error', method);
        const error = (refused as { error: { code: number; data?: unknown } }).error;
        assert.equal(error.code, -32021, method);
        assert.deepEqual(error.data, {
          requiredCapabilities: { extensions: { 'io.modelcontextprotocol/tasks': {} } },
        });
      }
      // Declared, the task is there and still working: the refusals changed nothing.
      const got = await getTask(String(created.taskId));
      assert.equal((got as { result: Record<string, unknown> }).result.status, 'working');
      const update = await rawRequest(
        server.url,
        server.demoToken,
        framed('tasks/update', { taskId: created.taskId }),
      );
      assert.equal(
        (update as { error: { data?: { reason?: string } } }).error.data?.reason,
        'no_input_requested',
      );
    });

    it("refuses another agent's task id as not found, exactly as an unknown id", async () => {
      const created = await createTask('only mine to see');
      const theirs = await getTask(String(created.taskId), other.token);
      const unknown = await getTask('00000000-0000-4000-8000-000000000000', other.token);
      assert.equal(theirs.kind, 'error');
      assert.equal(unknown.kind, 'error');
      const [a, b] = [theirs, unknown].map(
        (x) => (x as { error: { code: number; data?: { code?: string } } }).error,
      );
      assert.equal(a!.code, b!.code);
      assert.equal(a!.data?.code, 'TARGET_NOT_FOUND');
      const cancel = await rawRequest(
        server.url,
        other.token,
        framed('tasks/cancel', { taskId: created.taskId }),
      );
      assert.equal(cancel.kind, 'error');
      assert.equal((await getTask(String(created.taskId))).kind, 'result');
    });

    it("fails the task with the chair's note on rejection, and sends nothing", async () => {
      const text = 'asked as a task, rejected';
      const session = taskSession(client, server.url, server.demoToken);
      try {
        const execution = await session.callTool(TOOL, { ...message(text), dry_run: false });
        const request = await requestFor(text);
        await decide(request.id, 'reject', 'not to David');
        const { outcome } = await execution.settle();
        assert.equal(outcome.status, 'failed');
        const error = (outcome as { error: { message: string; data?: unknown } }).error;
        assert.match(JSON.stringify(error), /not to David/);
      } finally {
        await session.close();
      }
      assert.equal(await sent(text), 0);
    });

    it('fails the task as expired when its request expires', async () => {
      const text = 'asked as a task, left to expire';
      const created = await createTask(text);
      const request = await requestFor(text);
      await knex()('approval_requests')
        .where({ id: request.id })
        .update({ expires_at: new Date(Date.now() - 1000).toISOString() });
      await server.services.approvals.expireDue();
      const got = (await getTask(String(created.taskId))) as unknown as {
        result: { status: string; error: { data: { reason: string } } };
      };
      assert.equal(got.result.status, 'failed');
      assert.equal(got.result.error.data.reason, 'expired');
      assert.equal(await sent(text), 0);
    });

    it('fails a task whose write reconciliation settled as unknown, and never runs it again', async () => {
      const text = 'asked as a task, outcome unknown';
      const created = await createTask(text);
      const request = await requestFor(text);
      // What reconciliation leaves when the connector cannot tell (an upstream): set here directly, as
      // the local store always can tell.
      await knex()('approval_requests').where({ id: request.id }).update({ status: 'unknown' });
      const got = (await getTask(String(created.taskId))) as unknown as {
        result: { status: string; error: { data: { code: string } } };
      };
      assert.equal(got.result.status, 'failed');
      assert.equal(got.result.error.data.code, 'OUTCOME_UNKNOWN');
      assert.equal(await sent(text), 0);
    });

    it('cancels a pending task: the request is withdrawn and audited, nothing is sent, a late approval is refused', async () => {
      const text = 'asked as a task, cancelled';
      const created = await createTask(text);
      const request = await requestFor(text);
      const cancelled = await rawRequest(
        server.url,
        server.demoToken,
        framed('tasks/cancel', { taskId: created.taskId }),
      );
      assert.equal(cancelled.kind, 'result', JSON.stringify(cancelled));
      const got = (await getTask(String(created.taskId))) as unknown as { result: { status: string } };
      assert.equal(got.result.status, 'cancelled');
      const row = (await knex()('approval_requests').where({ id: request.id }).first()) as { status: string };
      assert.equal(row.status, 'expired');
      const withdrawn = (await knex()('audit_events')
        .where({ approval_request_id: request.id, kind: 'approval.withdrawn' })
        .select('details')) as { details: unknown }[];
      assert.equal(withdrawn.length, 1);
      assert.equal(detailsOf(withdrawn[0]!).task_id, created.taskId);
      await assert.rejects(decide(request.id, 'approve'));
      assert.equal(await sent(text), 0);
    });

    it('refuses to cancel a task whose write has run', async () => {
      const text = 'asked as a task, cancelled too late';
      const created = await createTask(text);
      await decide((await requestFor(text)).id, 'approve');
      await waitFor('the task to complete', async () => {
        const got = (await getTask(String(created.taskId))) as unknown as { result: { status: string } };
        return got.result.status === 'completed' ? true : undefined;
      });
      const cancel = await rawRequest(
        server.url,
        server.demoToken,
        framed('tasks/cancel', { taskId: created.taskId }),
      );
      assert.equal(cancel.kind, 'error');
      assert.equal(await sent(text), 1);
    });

    it('fails a task whose approval the agent used itself first, and writes once', async () => {
      const text = 'asked as a task, executed by hand';
      const created = await createTask(text);
      const request = await requestFor(text);
      // A claim a replica that then died left 50 s ago holds the runner off until it goes stale (twice
      // the default call deadline of 30 s: 10 s from now), so that the agent's own execution comes
      // first. Nothing announces it going stale: the runner's timer for the oldest claim takes it.
      await knex()('approval_tasks')
        .where({ id: created.taskId })
        .update({ claimed_at: new Date(Date.now() - 50_000).toISOString() });
      const view = await decide(request.id, 'approve');
      const own = await call(client, TOOL, {
        ...message(text),
        dry_run: false,
        approval_id: view.approval_id,
      });
      assert.equal(own.send_status, 'sent');
      const settled = await waitFor('the task to settle', async () => {
        const got = (await getTask(String(created.taskId))) as unknown as {
          result: { status: string; error?: { data: { code: string; reason: string } } };
        };
        return got.result.status === 'working' ? undefined : got.result;
      });
      assert.equal(settled.status, 'failed');
      assert.deepEqual(
        [settled.error?.data.code, settled.error?.data.reason],
        ['APPROVAL_REQUIRED', 'consumed'],
      );
      assert.equal(await sent(text), 1);
    });

    it('changes nothing for a client without the extension, nor for a dry run with it', async () => {
      const plain = await rawRequest(
        server.url,
        server.demoToken,
        framed(
          'tools/call',
          { name: TOOL, arguments: { ...message('no extension'), dry_run: false } },
          false,
        ),
      );
      const env = (plain as unknown as { result: { structuredContent: Envelope } }).result.structuredContent;
      assert.equal(env.error.code, 'APPROVAL_REQUIRED');
      assert.equal(env.error.reason, 'missing');
      const dry = await rawRequest(
        server.url,
        server.demoToken,
        framed('tools/call', { name: TOOL, arguments: { ...message('a dry run with the extension') } }),
      );
      const result = (dry as { result: Record<string, unknown> }).result;
      assert.notEqual(result.resultType, 'task');
      assert.equal((result.structuredContent as Envelope).send_status, 'planned');
    });
  });
}
