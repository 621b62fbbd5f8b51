import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import { createPgBus } from '../../src/cluster/bus.ts';
import type { User } from '../../src/core/identity.ts';
import { createLogger } from '../../src/log.ts';
import { databaseKinds, describeOnPostgres } from '../helpers/db.ts';
import type { Client } from '@modelcontextprotocol/client';
import { connectHttp, startTestServer, waitFor, type Envelope } from '../helpers/server.ts';
import {
  askAsTask,
  framed,
  openListen,
  rawRequest,
  sentCount,
  taskNote,
  taskSession,
} from '../helpers/tasks-client.ts';

const TOOL = 'isphere_send_message';
const SUBSCRIPTION_ID = 'io.modelcontextprotocol/subscriptionId';
const message = (text: string) => ({ target_type: 'contact', target_id: 'ct_david', content_text: text });

/** Starts a server and gives what the suites below share: a task maker, a decider, the other agent. */
async function taskBench(kind: Parameters<typeof startTestServer>[0]) {
  const server = await startTestServer(kind);
  const knex = server.sql;
  const chair: User = await createUser(knex, {
    name: 'chair-ada',
    roles: ['chair'],
    password: 'correct horse 1',
  });
  const other = await createAgent(knex, { name: 'agent-b' });
  const createTask = async (text: string, token = server.demoToken) => {
    const result = await askAsTask(server.url, token, TOOL, message(text));
    const row = (await knex('approval_tasks')
      .where({ id: String(result.taskId) })
      .first()) as {
      approval_request_id: string;
    };
    return { taskId: String(result.taskId), requestId: row.approval_request_id };
  };
  const decide = (id: string, decision: 'approve' | 'reject', note?: string) =>
    server.services.approvals.decide({ id, user: chair, decision, note });
  return { server, knex, other, createTask, decide };
}

for (const kind of databaseKinds()) {
  describe(`task changes pushed on a listen stream (2026-07-28) on ${kind}`, () => {
    let bench: Awaited<ReturnType<typeof taskBench>>;
    before(async () => {
      bench = await taskBench(kind);
    });
    after(async () => {
      await bench?.server.stop();
    });

    it("acknowledges the agent's own tasks only, pushes each at once, then its approval and its completion", async () => {
      const { server } = bench;
      const text = 'pushed, approved';
      const mine = await bench.createTask(text);
      const theirs = await bench.createTask('their own task', bench.other.token);
      const unknown = '00000000-0000-4000-8000-000000000000';
      const listen = await openListen(server.url, server.demoToken, {
        toolsListChanged: true,
        taskIds: [mine.taskId, theirs.taskId, unknown, 'not-a-uuid'],
      });
      try {
        assert.equal(listen.status, 200);
        assert.match(listen.contentType, /text\/event-stream/);
        const ack = await listen.next(
          'the acknowledgement',
          (m) => m.method === 'notifications/subscriptions/acknowledged',
        );
        // Another agent's task is left out exactly like an unknown id: nothing tells them apart.
        assert.deepEqual(ack.params?.notifications, { toolsListChanged: true, taskIds: [mine.taskId] });
        assert.equal((ack.params?._meta as Record<string, unknown>)[SUBSCRIPTION_ID], 'listen-1');

        const now = await listen.next('the task as it is', taskNote(mine.taskId));
        assert.equal(now.params?.status, 'working');
        assert.match(String(now.params?.statusMessage), /Waiting for approval/);
        assert.equal((now.params?._meta as Record<string, unknown>)[SUBSCRIPTION_ID], 'listen-1');

        await bench.decide(mine.requestId, 'approve');
        const done = await listen.next('the completion', taskNote(mine.taskId, 'completed'));
        const result = done.params?.result as { structuredContent: Envelope; resultType: string };
        assert.equal(result.resultType, 'complete');
        assert.equal(result.structuredContent.send_status, 'sent');
        assert.equal(await sentCount(bench.knex, text), 1);
        // Nothing of the other agent's task came down this stream.
        assert.ok(!listen.messages.some((m) => m.params?.taskId === theirs.taskId));
      } finally {
        await listen.close();
      }
    });

    it("reaches the SDK's own client through client.listen, beside the official requester", async () => {
      const { server } = bench;
      const text = 'pushed to the SDK client';
      const client = await connectHttp(server.url, server.demoToken, 'modern');
      const heard: { method: string; params?: Record<string, unknown> }[] = [];
      client.fallbackNotificationHandler = async (n) => void heard.push(n);
      const session = taskSession(client, server.url, server.demoToken);
      try {
        const execution = await session.callTool(TOOL, { ...message(text), dry_run: false });
        assert.ok(execution.kind === 'task');
        const taskId = String(execution.handle.taskId);
        // The SDK's client sends the extension's taskIds as given (its own filter type does not name them).
        const subscription = await client.listen({ taskIds: [taskId] } as Parameters<Client['listen']>[0]);
        const row = (await bench.knex('approval_tasks').where({ id: taskId }).first()) as {
          approval_request_id: string;
        };
        await bench.decide(row.approval_request_id, 'approve');
        const { outcome } = await execution.settle();
        assert.equal(outcome.status, 'completed');
        await waitFor('the completion pushed to the client', async () =>
          heard.some(
            (n) =>
              n.method === 'notifications/tasks' &&
              n.params?.taskId === taskId &&
              n.params?.status === 'completed',
          )
            ? true
            : undefined,
        );
        await subscription.close();
      } finally {
        await session.close();
        await client.close();
      }
    });

    it("pushes a rejection with the chair's note, and a cancel as cancelled", async () => {
      const { server } = bench;
      const rejected = await bench.createTask('pushed, rejected');
      const cancelled = await bench.createTask('pushed, cancelled');
      const listen = await openListen(server.url, server.demoToken, {
        taskIds: [rejected.taskId, cancelled.taskId],
      });
      try {
        await listen.next('the first task as it is', taskNote(rejected.taskId, 'working'));
        await listen.next('the second task as it is', taskNote(cancelled.taskId, 'working'));
        await bench.decide(rejected.requestId, 'reject', 'not to this contact');
        const failed = await listen.next('the rejection', taskNote(rejected.taskId, 'failed'));
        assert.match(String(failed.params?.statusMessage), /not to this contact/);
        assert.equal((failed.params?.error as { data: { reason: string } }).data.reason, 'rejected');

        const answer = await rawRequest(
          server.url,
          server.demoToken,
          framed('tasks/cancel', { taskId: cancelled.taskId }),
        );
        assert.equal(answer.kind, 'result', JSON.stringify(answer));
        await listen.next('the cancel', taskNote(cancelled.taskId, 'cancelled'));
        assert.equal(await sentCount(bench.knex, 'pushed, cancelled'), 0);
      } finally {
        await listen.close();
      }
    });

    it('ends at once, gracefully, a listen that names no task of its agent and asks for nothing else', async () => {
      const { server } = bench;
      const theirs = await bench.createTask('theirs, not watched', bench.other.token);
      const listen = await openListen(server.url, server.demoToken, { taskIds: [theirs.taskId] }, 7);
      const ack = await listen.next(
        'the acknowledgement',
        (m) => m.method === 'notifications/subscriptions/acknowledged',
      );
      assert.deepEqual(ack.params?.notifications, {});
      const end = await listen.next('the empty listen result', (m) => m.id === 7 && m.result !== undefined);
      assert.equal(end.result?.resultType, 'complete');
      await listen.ended();
    });

    it('refuses a filter whose taskIds is not a list of ids, or is too long, with -32602', async () => {
      const { server } = bench;
      for (const taskIds of ['one', [42], Array.from({ length: 101 }, (_, i) => `t${i}`)]) {
        const listen = await openListen(server.url, server.demoToken, { taskIds });
        const error = await listen.next('the refusal', (m) => m.error !== undefined);
        assert.equal(error.error?.code, -32602, JSON.stringify(taskIds).slice(0, 50));
        await listen.ended();
      }
    });

    it("refuses a listen without the agent's token like any request", async () => {
      const listen = await openListen(bench.server.url, 'not-a-token', { taskIds: [] });
      assert.equal(listen.status, 401);
      await listen.close();
    });

    it('leaves a listen that names no tasks to the SDK, unchanged', async () => {
      const listen = await openListen(bench.server.url, bench.server.demoToken, { toolsListChanged: true });
      try {
        const ack = await listen.next(
          'the acknowledgement',
          (m) => m.method === 'notifications/subscriptions/acknowledged',
        );
        assert.deepEqual(ack.params?.notifications, { toolsListChanged: true });
      } finally {
        await listen.close();
      }
    });
  });
}

describeOnPostgres('task changes announced to every replica (PostgreSQL)', () => {
  let bench: Awaited<ReturnType<typeof taskBench>>;
  before(async () => {
    bench = await taskBench('postgres');
  });
  after(async () => {
    await bench?.server.stop();
  });

  it("announces a task's id when its request is decided and when the task settles, from any process", async () => {
    // A bus of its own, as another replica's: it hears what this server's database announces.
    const bus = await createPgBus(bench.knex, bench.server.db.url!, createLogger('silent'));
    const heard: string[] = [];
    const stop = bus.onTaskChanged((id) => heard.push(id));
    try {
      const task = await bench.createTask('announced');
      await bench.decide(task.requestId, 'approve');
      await waitFor('the task to complete', async () => {
        const row = (await bench.knex('approval_tasks').where({ id: task.taskId }).first()) as {
          status: string;
        };
        return row.status === 'completed' ? true : undefined;
      });
      await waitFor('the announcements', async () =>
        heard.filter((id) => id === task.taskId).length >= 2 ? true : undefined,
      );
      // A dry run's request, which has no task, announces nothing when it is decided.
      const dry = await rawRequest(
        bench.server.url,
        bench.server.demoToken,
        framed('tools/call', { name: TOOL, arguments: message('a dry run, no task') }, false),
      );
      assert.equal(dry.kind, 'result');
      const dryId = (
        (dry as unknown as { result: { structuredContent: Envelope } }).result.structuredContent.approval as {
          approval_request_id: string;
        }
      ).approval_request_id;
      await bench.decide(dryId, 'approve');
      const taskIds = new Set(
        ((await bench.knex('approval_tasks').select('id')) as { id: string }[]).map((r) => r.id),
      );
      const marker = await bench.createTask('after the dry run');
      await bench.decide(marker.requestId, 'reject', 'a marker');
      await waitFor('the last announcement', async () => (heard.includes(marker.taskId) ? true : undefined));
      taskIds.add(marker.taskId);
      assert.deepEqual(
        heard.filter((id) => !taskIds.has(id)),
        [],
      );
    } finally {
      stop();
      await bus.close();
    }
  });
});
