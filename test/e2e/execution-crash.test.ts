import assert from 'node:assert/strict';
import path from 'node:path';
import { describe, it } from 'node:test';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { openDatabase } from '../../src/db/knex.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, testEnv, waitFor } from '../helpers/server.ts';

const CHAIR_PASSWORD = 'crash-test-password';

/**
 * A server process killed with SIGKILL in the middle of an execution: after a restart, the approval
 * is reconciled from what the connector actually did, nothing is written twice, and the chain holds.
 */
for (const kind of databaseKinds()) {
  for (const [step, expected] of [
    ['after_write_started', 'failed'],
    ['after_connector_write', 'succeeded'],
  ] as const) {
    describe(`SIGKILL ${step.replace(/_/g, ' ')} on ${kind}`, () => {
      it(`reconciles the approval to ${expected} after restart, with no duplicate write`, async () => {
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
          const client = await connectHttp(doomed.url, token);
          const args = { target_type: 'contact', target_id: 'ct_alice', content_text: `crash ${step}` };
          const draft = await call(client, 'isphere_send_message', args);
          const requestId: string = draft.approval.approval_request_id;
          const approvalId = await approveAsChair(
            { env, name: 'chair', password: CHAIR_PASSWORD },
            requestId,
          );

          const exited = new Promise((resolve) =>
            doomed.child.once('exit', (_code, signal) => resolve(signal)),
          );
          // The server dies mid-call; the client learns nothing back (its request times out).
          await assert.rejects(
            call(
              client,
              'isphere_send_message',
              { ...args, dry_run: false, approval_id: approvalId },
              { timeout: 3000 },
            ),
          );
          assert.equal(await exited, 'SIGKILL');
          await client.close().catch(() => undefined);

          const revived = await spawnServer(env);
          const after = await connectHttp(revived.url, token);
          // Reconciliation runs in the background (every second here) and settles what the crash left.
          const settled = await waitFor('the interrupted execution to be reconciled', async () => {
            const view = await call(after, 'isphere_get_approval', { approval_request_id: requestId });
            return view.approval.status === 'executing' ? undefined : view;
          });
          assert.equal(settled.approval.status, expected);
          const retry = await call(after, 'isphere_send_message', {
            ...args,
            dry_run: false,
            approval_id: approvalId,
          });
          assert.equal(retry.error.reason, 'consumed', 'an interrupted approval is never retried');
          await after.close();
          await stopChild(revived.child);

          const check = await openDatabase({
            url: db.url,
            pgliteDir: path.join(db.dataDir, 'pglite'),
            command: 'test',
          });
          try {
            const messages = await check.knex('messages').where({ content_text: args.content_text });
            assert.equal(messages.length, expected === 'succeeded' ? 1 : 0);
            const kinds = (
              await check.knex('audit_events').where({ approval_request_id: requestId }).orderBy('seq')
            ).map((r: { kind: string }) => r.kind);
            assert.deepEqual(kinds, [
              'approval.requested',
              'approval.approved',
              'write.started',
              expected === 'succeeded' ? 'write.succeeded' : 'write.failed',
            ]);
            const report = await verifyDatabaseChain(check.knex);
            assert.equal(report.first_bad, undefined);
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
