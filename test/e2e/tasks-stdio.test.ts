import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';
import { approveAsChair } from '../helpers/approvals.ts';
import { runCli } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from '../helpers/db.ts';
import { connectStdio, testEnv, waitFor, type Envelope } from '../helpers/server.ts';

const CHAIR = { name: 'ada', password: 'ada password' };

/** A write asked as a core task (2025-11-25) over stdio, approved from the CLI in a process of its own. */
for (const kind of databaseKinds()) {
  describe(`tasks over stdio on ${kind}`, () => {
    let db: TestDatabase;
    let env: Record<string, string>;
    let token: string;

    before(async () => {
      db = await createTestDatabase(kind);
      env = testEnv(db, { COUNTERSIGN_DEMO: 'false' });
      assert.equal((await runCli(['demo'], env)).code, 0);
      const added = await runCli(['agent', 'add', 'desktop'], env);
      assert.equal(added.code, 0, added.stderr);
      token = added.stdout.trim().split('\n').at(-1)!;
      const chair = await runCli(['user', 'add', CHAIR.name, '--role', 'chair'], env, {
        input: `${CHAIR.password}\n`,
      });
      assert.equal(chair.code, 0, chair.stderr);
    });
    after(async () => db?.drop());

    it('the official requester gets a task, and it completes with sent once a chair approves', async () => {
      const { client, exited } = await connectStdio({ ...env, COUNTERSIGN_AGENT_TOKEN: token });
      const session = createTaskSessionFromClient(client, { endpointId: 'countersign-stdio' });
      try {
        const args = { target_type: 'contact', target_id: 'ct_alice', content_text: 'a task over stdio' };
        const execution = await session.callTool(
          'isphere_send_message',
          { ...args, dry_run: false },
          { task: { preference: 'prefer' } },
        );
        assert.equal(execution.kind, 'task');
        // The chair finds the request as the CLI lists it, and approves it there.
        const requestId = await waitFor('the drafted request', async () => {
          const res = await runCli(['approvals', 'list', '--as', CHAIR.name], {
            ...env,
            COUNTERSIGN_PASSWORD: CHAIR.password,
          });
          return res.stdout
            .split('\n')
            .find((l) => /^[0-9a-f-]{36}\tpending\t/.test(l))
            ?.split('\t')[0];
        });
        await approveAsChair({ env, ...CHAIR }, requestId);
        const { outcome } = await execution.settle();
        assert.equal(outcome.status, 'completed', JSON.stringify(outcome));
        const result = (outcome as { result: { structuredContent: Envelope } }).result;
        assert.equal(result.structuredContent.send_status, 'sent');
      } finally {
        await session.close();
        await client.close();
      }
      await exited();
    });
  });
}
