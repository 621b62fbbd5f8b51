import assert from 'node:assert/strict';
import path from 'node:path';
import { describe, it } from 'node:test';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds } from '../helpers/db.ts';
import { testEnv, waitFor, type Envelope } from '../helpers/server.ts';
import { framed, rawRequest } from '../helpers/tasks-client.ts';

const CHAIR_PASSWORD = 'crash-test-password';

type Task = { status: string; result?: { isError?: boolean; structuredContent: Envelope } };

/**
 * The server that runs an approved task's write is killed (SIGKILL) in the middle of it: after a
 * restart, reconciliation settles the approval from what the connector did, the task's runner calls
 * again with the same idempotency key and gets that outcome, and nothing is written twice.
 */
for (const kind of databaseKinds()) {
  for (const [step, written] of [
    ['after_write_started', false],
    ['after_connector_write', true],
  ] as const) {
    describe(`a task's write killed ${step.replace(/_/g, ' ')} on ${kind}`, () => {
      it(`settles the task from the reconciled outcome, ${written ? 'sent once' : 'not sent'}`, async () => {
        const db = await createTestDatabase(kind);
        const env = testEnv(db, {
          COUNTERSIGN_DEMO: 'false',
          COUNTERSIGN_CALL_TIMEOUT_MS: '200',
          COUNTERSIGN_MAINTENANCE_INTERVAL_S: '1',
        });
        try {
          assert.equal((await runCli(['demo'], env)).code, 0);
          const token = (await runCli(['agent', 'add', 'crasher'], env)).stdout.trim().split('\n').at(-1)!;
          const user = await runCli(['user', 'add', 'chair', '--role', 'chair'], env, {
            input: `${CHAIR_PASSWORD}\n`,
          });
          assert.equal(user.code, 0, user.stderr);

          const doomed = await spawnServer(env, { crashAt: step });
          const text = `task crash ${step}`;
          const args = { target_type: 'contact', target_id: 'ct_alice', content_text: text, dry_run: false };
          const created = await rawRequest(
            doomed.url,
            token,
            framed('tools/call', { name: 'isphere_send_message', arguments: args }),
          );
          const taskId = String((created as unknown as { result: { taskId: string } }).result.taskId);
          const exited = new Promise((resolve) =>
            doomed.child.once('exit', (_code, signal) => resolve(signal)),
          );
          const requestId = await requestOf(env);
          await approveAsChair({ env, name: 'chair', password: CHAIR_PASSWORD }, requestId);
          // The doomed server's runner takes the approved task and dies in the middle of its write.
          assert.equal(await exited, 'SIGKILL');

          const revived = await spawnServer(env);
          const task = await waitFor('the task to settle', async () => {
            const got = await rawRequest(revived.url, token, framed('tasks/get', { taskId }));
            const view = (got as unknown as { result: Task }).result;
            return view.status === 'working' ? undefined : view;
          });
          assert.equal(task.status, 'completed', JSON.stringify(task));
          if (written) {
            assert.equal(task.result?.isError ?? false, false);
            assert.equal(task.result?.structuredContent.send_status, 'sent');
          } else {
            // The reconciled failure, as a retry with the same key answers it: never a second try.
            assert.equal(task.result?.isError, true);
            assert.equal(task.result?.structuredContent.error.code, 'CONNECTOR_FAILED');
          }
          await stopChild(revived.child);

          const check = await openDatabase({
            url: db.url,
            pgliteDir: path.join(db.dataDir, 'pglite'),
            command: 'test',
          });
          try {
            const messages = await check.knex('messages').where({ content_text: text });
            assert.equal(messages.length, written ? 1 : 0);
            const started = await check
              .knex('audit_events')
              .where({ approval_request_id: requestId, kind: 'write.started' });
            assert.equal(started.length, 1, 'one start, whatever the retries');
            const chain = await verifyDatabaseChain(check.knex);
            assert.equal(chain.first_bad, undefined);
          } finally {
            await check.close();
          }
        } finally {
          await db.drop();
        }
      });
    });
  }
}

/** The id of the one pending request of this fresh database, as `approvals list` shows it to a chair. */
async function requestOf(env: Record<string, string>): Promise<string> {
  return waitFor('the drafted request', async () => {
    const res = await runCli(['approvals', 'list', '--as', 'chair'], {
      ...env,
      COUNTERSIGN_PASSWORD: CHAIR_PASSWORD,
    });
    const line = res.stdout.split('\n').find((l) => /^[0-9a-f-]{36}\tpending\t/.test(l));
    return line?.split('\t')[0];
  });
}
