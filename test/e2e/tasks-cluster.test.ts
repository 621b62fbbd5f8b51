import assert from 'node:assert/strict';
import { after, before, it } from 'node:test';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { openDatabase, type Database } from '../../src/db/knex.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { startBalancer, type Balancer } from '../helpers/balancer.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, describeOnPostgres, type TestDatabase } from '../helpers/db.ts';
import { testEnv, waitFor, type Envelope } from '../helpers/server.ts';
import { framed, openListen, rawRequest, sentCount, taskNote } from '../helpers/tasks-client.ts';

const REPLICAS = 3;
const TOOL = 'isphere_send_message';
const CHAIR = { name: 'chair-cy', password: 'cluster chair pw' };

type Task = {
  taskId: string;
  status: string;
  statusMessage: string;
  result?: { structuredContent: Envelope };
};

// Several processes can share only PostgreSQL; the embedded database allows one process.
describeOnPostgres(`tasks on ${REPLICAS} replicas of one PostgreSQL`, () => {
  let db: TestDatabase;
  let env: Record<string, string>;
  let direct: Database;
  let replicas: Awaited<ReturnType<typeof spawnServer>>[] = [];
  let token: string;

  const draft = async (url: string, text: string) => {
    const args = { target_type: 'group', target_id: 'gr_board', content_text: text, dry_run: false };
    const answer = await rawRequest(url, token, framed('tools/call', { name: TOOL, arguments: args }));
    assert.equal(answer.kind, 'result', JSON.stringify(answer));
    const created = (answer as unknown as { result: Task & { resultType: string } }).result;
    assert.equal(created.resultType, 'task');
    return created;
  };
  const getTask = async (url: string, taskId: string) => {
    const answer = await rawRequest(url, token, framed('tasks/get', { taskId }));
    assert.equal(answer.kind, 'result', JSON.stringify(answer));
    return (answer as unknown as { result: Task }).result;
  };
  const requestOf = async (text: string) =>
    (await direct.knex('approval_requests').whereRaw("review->>'content_text' = ?", [text]).first('id')) as {
      id: string;
    };
  const sent = (text: string) => sentCount(direct.knex, text);
  const started = async (id: string) =>
    (await direct
      .knex('audit_events')
      .where({ approval_request_id: id, kind: 'write.started' })
      .select('details')) as { details: unknown }[];
  const completed = (balancer: Balancer, taskId: string) =>
    waitFor(
      'the task to complete',
      async () => {
        const task = await getTask(balancer.url, taskId);
        return task.status === 'working' ? undefined : task;
      },
      60_000,
    );

  before(async () => {
    db = await createTestDatabase('postgres');
    // Behind a balancer the review link is the public one, the same whichever replica answers.
    env = testEnv(db, { COUNTERSIGN_DEMO: 'false', COUNTERSIGN_PUBLIC_URL: 'https://countersign.example' });
    assert.equal((await runCli(['demo'], env)).code, 0);
    const chair = await runCli(['user', 'add', CHAIR.name, '--role', 'chair'], env, {
      input: `${CHAIR.password}\n`,
    });
    assert.equal(chair.code, 0, chair.stderr);
    const agent = await runCli(['agent', 'add', 'tasker'], env);
    assert.equal(agent.code, 0, agent.stderr);
    token = agent.stdout.trim().split('\n').at(-1)!;
    replicas = await Promise.all(Array.from({ length: REPLICAS }, () => spawnServer(env)));
    direct = await openDatabase({ url: db.url, pgliteDir: '', command: 'test' });
  });
  after(async () => {
    await Promise.allSettled(replicas.map((r) => stopChild(r.child)));
    await direct?.close();
    await db?.drop();
  });

  it('a task created on one replica reads alike on all, is decided from outside, and runs once', async () => {
    const balancer = await startBalancer(replicas.map((r) => r.url));
    try {
      const text = 'A task, whichever replica.';
      const created = await draft(replicas[0]!.url, text);
      const views = await Promise.all(replicas.map((r) => getTask(r.url, created.taskId)));
      for (const view of views) assert.deepEqual(view, views[0]);
      assert.equal(views[0]!.status, 'working');
      // A listen stream on a third replica: it hears of the decision made outside, and of the run.
      const listen = await openListen(replicas[2]!.url, token, { taskIds: [created.taskId] });
      await listen.next('the task as it is', taskNote(created.taskId, 'working'));
      const { id } = await requestOf(text);
      await approveAsChair({ env, ...CHAIR }, id);
      const pushed = await listen.next('the completion', taskNote(created.taskId, 'completed'), 60_000);
      await listen.close();
      assert.equal((pushed.params?.result as Task['result'])?.structuredContent.send_status, 'sent');
      const task = await completed(balancer, created.taskId);
      assert.equal(task.status, 'completed', JSON.stringify(task));
      assert.equal(task.result?.structuredContent.send_status, 'sent');
      // Every replica's runner saw the approval: one of them ran it, once.
      assert.equal(await sent(text), 1);
      assert.equal((await started(id)).length, 1);
      const again = await Promise.all(replicas.map((r) => getTask(r.url, created.taskId)));
      for (const view of again) assert.deepEqual(view, again[0]);
    } finally {
      await balancer.close();
    }
  });

  it('still completes, once, when the replica that created the task is killed before the decision', async () => {
    const text = 'A task whose replica died.';
    const created = await draft(replicas[0]!.url, text);
    replicas[0]!.child.kill('SIGKILL');
    await new Promise((resolve) => replicas[0]!.child.once('exit', resolve));
    const alive = replicas.slice(1);
    const balancer = await startBalancer(alive.map((r) => r.url));
    try {
      const { id } = await requestOf(text);
      await approveAsChair({ env, ...CHAIR }, id);
      const task = await completed(balancer, created.taskId);
      assert.equal(task.status, 'completed', JSON.stringify(task));
      assert.equal(await sent(text), 1);
      assert.equal((await started(id)).length, 1);
      const chain = await verifyDatabaseChain(direct.knex);
      assert.equal(chain.first_bad, undefined);
    } finally {
      await balancer.close();
    }
  });
});
