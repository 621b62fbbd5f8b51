import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { databaseKinds } from '../helpers/db.ts';
import { startTestServer, waitFor, type TestServer } from '../helpers/server.ts';
import { framed, rawRequest, sentCount } from '../helpers/tasks-client.ts';

/**
 * Writes asked as tasks under approval rules: what the rules decide at the dry run decides the task,
 * and a policy made stricter after the approval sends the request back to pending without failing the
 * task, which completes once the extra approval is given.
 */
const TOOL = 'isphere_send_message';
const rule = (name: string, when: string, then: unknown) => ({ name, when, then });

for (const kind of databaseKinds()) {
  describe(`tasks under approval rules on ${kind}`, () => {
    let server: TestServer;
    let chairs: User[];

    before(async () => {
      server = await startTestServer(kind);
      chairs = [];
      for (const name of ['task-chair-a', 'task-chair-b'])
        chairs.push(await createUser(server.sql, { name, roles: ['chair'], password: `${name} pw 1` }));
    });
    after(() => server?.stop());

    const knex = () => server.sql;
    const setPolicy = (rules: unknown[]) => server.services.approvals.policy.set({ rules }, 'test-admin');
    const sent = (text: string) => sentCount(knex(), text);
    const ask = (text: string) =>
      rawRequest(
        server.url,
        server.demoToken,
        framed('tools/call', {
          name: TOOL,
          arguments: { target_type: 'contact', target_id: 'ct_david', content_text: text, dry_run: false },
        }),
      );
    const taskOf = async (text: string) => {
      const answer = await ask(text);
      assert.equal(answer.kind, 'result', JSON.stringify(answer));
      const created = (answer as { result: { resultType?: string; taskId?: string } }).result;
      assert.equal(created.resultType, 'task', JSON.stringify(created));
      return String(created.taskId);
    };
    const statusOf = async (taskId: string) => {
      const got = await rawRequest(server.url, server.demoToken, framed('tasks/get', { taskId }));
      return (got as unknown as { result: { status: string } }).result.status;
    };
    const requestOf = async (text: string) =>
      (await knex()('approval_requests').orderBy('created_at', 'desc').limit(20)).find(
        (r: { review: unknown }) => JSON.stringify(r.review).includes(text),
      ) as { id: string; status: string };

    it('answers a denied write with the dry run’s refusal, and makes no task', async () => {
      await setPolicy([
        rule('No payroll', 'content.normalized.contains("payroll")', { deny: { reason: 'HR only' } }),
      ]);
      const answer = await ask('the payroll file, as a task');
      const refused = (
        answer as { result: { isError?: boolean; structuredContent?: { error?: { reason?: string } } } }
      ).result;
      assert.equal(refused.isError, true);
      assert.equal(refused.structuredContent?.error?.reason, 'policy_denied');
      assert.equal(Number((await knex()('approval_tasks').count({ n: '*' }).first())?.n), 0);
    });

    it('completes at once a task a rule lets through without review, recorded as approved by the rule', async () => {
      await setPolicy([
        rule('Hello is harmless', 'content.normalized.startsWith("hello")', {
          allow_without_review: { reason: 'greetings' },
        }),
      ]);
      const text = 'hello David, asked as a task';
      const taskId = await taskOf(text);
      await waitFor(
        'the task to complete',
        async () => (await statusOf(taskId)) === 'completed' || undefined,
      );
      assert.equal(await sent(text), 1);
      const approved = await knex()('audit_events')
        .where({ approval_request_id: (await requestOf(text)).id, kind: 'approval.approved' })
        .first();
      assert.equal(approved.actor, 'policy:Hello is harmless');
    });

    it('keeps a task working when a stricter policy sends its approved request back, and completes it on the extra approval', async () => {
      await setPolicy([
        rule('One chair', 'content.normalized.contains("stricter")', { require: { approvers: 1 } }),
      ]);
      const text = 'stricter later, asked as a task';
      const taskId = await taskOf(text);
      const { id } = await requestOf(text);
      await setPolicy([
        rule('Two chairs', 'content.normalized.contains("stricter")', { require: { approvers: 2 } }),
      ]);
      await server.services.approvals.decide({ id, user: chairs[0]!, decision: 'approve' });
      // The runner's execution meets the stricter policy: refused, and the request waits again.
      await waitFor(
        'the request back to pending',
        async () =>
          (await knex()('audit_events')
            .where({ approval_request_id: id, kind: 'approval.reopened' })
            .first()) ?? undefined,
      );
      assert.equal((await requestOf(text)).status, 'pending');
      assert.equal(await statusOf(taskId), 'working');
      assert.equal(await sent(text), 0);
      await server.services.approvals.decide({ id, user: chairs[1]!, decision: 'approve' });
      await waitFor(
        'the task to complete',
        async () => (await statusOf(taskId)) === 'completed' || undefined,
      );
      assert.equal(await sent(text), 1);
    });
  });
}
