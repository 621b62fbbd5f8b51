import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { databaseKinds } from '../helpers/db.ts';
import { connectHttp, startTestServer, waitFor, type Envelope, type TestServer } from '../helpers/server.ts';
import { rawRequest, sentCount } from '../helpers/tasks-client.ts';

const VERSION = '2025-11-25';
const TOOL = 'isphere_send_message';
const message = (text: string) => ({ target_type: 'contact', target_id: 'ct_david', content_text: text });

/** A hand-written 2025-11-25 client: plain JSON-RPC POSTs, core tasks (`task` on tools/call). */
for (const kind of databaseKinds()) {
  describe(`writes asked as core tasks (2025-11-25) on ${kind}`, () => {
    let server: TestServer;
    let chair: User;
    let otherToken: string;

    const rpc = (method: string, params: Record<string, unknown>, token = server.demoToken) =>
      rawRequest(server.url, token, { method, params }, VERSION) as Promise<Envelope>;
    const knex = () => server.sql;
    const sent = (text: string) => sentCount(knex(), text);
    const requestOf = async (taskId: string) =>
      (
        (await knex()('approval_tasks').where({ id: taskId }).first('approval_request_id')) as {
          approval_request_id: string;
        }
      ).approval_request_id;
    const createTask = async (text: string) => {
      const answer = await rpc('tools/call', {
        name: TOOL,
        arguments: { ...message(text), dry_run: false },
        task: { ttl: 60_000 },
      });
      assert.equal(answer.kind, 'result', JSON.stringify(answer));
      const task = (answer as { result: { task: Record<string, unknown> } }).result.task;
      assert.equal(task.status, 'working');
      assert.equal(typeof task.ttl, 'number');
      assert.equal(typeof task.pollInterval, 'number');
      return String(task.taskId);
    };

    before(async () => {
      server = await startTestServer(kind);
      chair = await createUser(knex(), { name: 'chair-ada', roles: ['chair'], password: 'correct horse 1' });
      otherToken = (await createAgent(knex(), { name: 'agent-b' })).token;
    });
    after(async () => {
      await server?.stop();
    });

    it('advertises core tasks in initialize, and task support on each write tool', async () => {
      const init = await rpc('initialize', {
        protocolVersion: VERSION,
        capabilities: {},
        clientInfo: { name: 'hand-written', version: '1' },
      });
      const capabilities = (init as { result: { capabilities: Envelope } }).result.capabilities;
      assert.deepEqual(capabilities.tasks?.requests, { tools: { call: {} } });
      assert.ok(capabilities.tasks?.cancel && capabilities.tasks?.list);
      const list = await rpc('tools/list', {});
      const tools = (list as { result: { tools: Envelope[] } }).result.tools;
      for (const tool of tools) {
        const write = tool.annotations?.readOnlyHint === false && /send_/.test(tool.name);
        if (write) assert.equal(tool.execution?.taskSupport, 'optional', tool.name);
      }
    });

    it('approve → completed with sent, read with tasks/get, tasks/result and tasks/list', async () => {
      const text = 'a core task, approved';
      const taskId = await createTask(text);
      assert.equal(await sent(text), 0);
      await server.services.approvals.decide({
        id: await requestOf(taskId),
        user: chair,
        decision: 'approve',
      });
      await waitFor('the task to complete', async () => {
        const got = (await rpc('tasks/get', { taskId })) as { result: { status: string } };
        return got.result.status === 'completed' ? true : undefined;
      });
      const result = (await rpc('tasks/result', { taskId })) as { result: { structuredContent: Envelope } };
      assert.equal(result.result.structuredContent.send_status, 'sent');
      assert.equal(await sent(text), 1);
      const listed = (await rpc('tasks/list', {})) as { result: { tasks: { taskId: string }[] } };
      assert.ok(listed.result.tasks.some((t) => t.taskId === taskId));
      const theirs = (await rpc('tasks/list', {}, otherToken)) as { result: { tasks: unknown[] } };
      assert.equal(theirs.result.tasks.length, 0);
    });

    it('runs a write through the official requester on a 2025-11-25 client: approved → completed with sent', async () => {
      const text = 'a core task through the requester';
      const client = await connectHttp(server.url, server.demoToken, 'legacy');
      const session = createTaskSessionFromClient(client, { endpointId: `countersign-2025-${server.url}` });
      try {
        // The tool's taskSupport is optional: the requester calls it as a task when asked to prefer one.
        const execution = await session.callTool(
          TOOL,
          { ...message(text), dry_run: false },
          { task: { preference: 'prefer' } },
        );
        assert.equal(execution.kind, 'task');
        const taskId = String(execution.handle?.taskId);
        await server.services.approvals.decide({
          id: await requestOf(taskId),
          user: chair,
          decision: 'approve',
        });
        const { outcome } = await execution.settle();
        assert.equal(outcome.status, 'completed', JSON.stringify(outcome));
        const result = (outcome as { result: { structuredContent: Envelope } }).result;
        assert.equal(result.structuredContent.send_status, 'sent');
        assert.equal(await sent(text), 1);
      } finally {
        await session.close();
        await client.close();
      }
    });

    it("reject → failed, and tasks/result answers the chair's note as the error", async () => {
      const text = 'a core task, rejected';
      const taskId = await createTask(text);
      await server.services.approvals.decide({
        id: await requestOf(taskId),
        user: chair,
        decision: 'reject',
        note: 'wrong person',
      });
      const got = (await rpc('tasks/get', { taskId })) as {
        result: { status: string; statusMessage: string };
      };
      assert.equal(got.result.status, 'failed');
      assert.match(got.result.statusMessage, /wrong person/);
      const result = await rpc('tasks/result', { taskId });
      assert.equal(result.kind, 'error');
      assert.equal((result as { error: Envelope }).error.data.reason, 'rejected');
      assert.equal(await sent(text), 0);
    });

    it('cancel → cancelled and withdrawn, nothing sent; another agent cannot see or cancel it', async () => {
      const text = 'a core task, cancelled';
      const taskId = await createTask(text);
      const foreign = await rpc('tasks/cancel', { taskId }, otherToken);
      assert.equal(foreign.kind, 'error');
      assert.equal((foreign as { error: Envelope }).error.data.code, 'TARGET_NOT_FOUND');
      const cancelled = (await rpc('tasks/cancel', { taskId })) as { result: { status: string } };
      assert.equal(cancelled.result.status, 'cancelled');
      const row = (await knex()('approval_requests')
        .where({ id: await requestOf(taskId) })
        .first()) as {
        status: string;
      };
      assert.equal(row.status, 'expired');
      assert.equal(await sent(text), 0);
    });

    it('pages tasks/list with a cursor bound to the agent, and refuses an altered one', async () => {
      // 120 tasks, each on a request of its own: copies of one drafted request's row, set here directly.
      const first = await createTask('a core task to page past');
      const source = (await knex()('approval_requests')
        .where({ id: await requestOf(first) })
        .first()) as Record<string, unknown>;
      const task = (await knex()('approval_tasks').where({ id: first }).first()) as Record<string, unknown>;
      for (let i = 0; i < 120; i++) {
        const id = randomUUID();
        const at = new Date(Date.now() - (i + 1) * 1000).toISOString();
        await knex()('approval_requests').insert({
          ...source,
          id,
          content_sha256: `${i}`.padStart(64, '0'),
          created_at: at,
        });
        await knex()('approval_tasks').insert({
          ...task,
          id: randomUUID(),
          approval_request_id: id,
          arguments: JSON.stringify(task.arguments),
          created_at: at,
          updated_at: at,
        });
      }
      const seen = new Set<string>();
      let cursor: string | undefined;
      let pages = 0;
      do {
        const page = (await rpc('tasks/list', cursor ? { cursor } : {})) as {
          result: { tasks: { taskId: string }[]; nextCursor?: string };
        };
        for (const t of page.result.tasks) seen.add(t.taskId);
        cursor = page.result.nextCursor;
        pages++;
      } while (cursor && pages < 10);
      assert.ok(pages >= 2, 'more than one page');
      assert.ok(seen.has(first));
      const all = Number(
        (await knex()('approval_tasks').where({ agent_id: task.agent_id }).count({ n: '*' }).first())?.n,
      );
      assert.equal(seen.size, all);
      const firstPage = (await rpc('tasks/list', {})) as { result: { nextCursor: string } };
      const theirs = await rpc('tasks/list', { cursor: firstPage.result.nextCursor }, otherToken);
      assert.equal(theirs.kind, 'error', "a cursor of another agent's list");
      const altered = await rpc('tasks/list', { cursor: `${firstPage.result.nextCursor}x` });
      assert.equal(altered.kind, 'error');
    });

    it('without the task parameter a real run is refused as before', async () => {
      const answer = (await rpc('tools/call', {
        name: TOOL,
        arguments: { ...message('no task parameter'), dry_run: false },
      })) as { result: { structuredContent: Envelope; task?: unknown } };
      assert.equal(answer.result.task, undefined);
      assert.equal(answer.result.structuredContent.error.reason, 'missing');
    });
  });
}
