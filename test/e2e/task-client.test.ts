import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { databaseKinds } from '../helpers/db.ts';
import { startTestServer, waitFor, type TestServer } from '../helpers/server.ts';
import { runTaskExample, sentCount } from '../helpers/tasks-client.ts';

for (const kind of databaseKinds()) {
  describe(`the task client example (examples/) on ${kind}`, () => {
    let server: TestServer;
    let chair: User;
    before(async () => {
      server = await startTestServer(kind);
      chair = await createUser(server.sql, {
        name: 'chair-ada',
        roles: ['chair'],
        password: 'correct horse 1',
      });
    });
    after(async () => server?.stop());

    for (const revision of ['2026-07-28', '2025-11-25']) {
      it(`asks a write as a task, waits for the chair and prints the sent result (${revision})`, async () => {
        const text = `a task from the example, ${revision}`;
        const example = runTaskExample(
          { COUNTERSIGN_URL: server.url, COUNTERSIGN_AGENT_TOKEN: server.demoToken },
          revision,
          text,
        );
        try {
          const request = await waitFor(`the request for "${text}"`, async () => {
            const rows = (await server.sql('approval_requests').orderBy('created_at', 'desc').limit(20)) as {
              id: string;
              review: unknown;
              status: string;
            }[];
            return rows.find((r) => JSON.stringify(r.review).includes(text));
          });
          assert.equal(request.status, 'pending');
          await waitFor('the example to say it waits', async () =>
            /^task \S+: waiting for a chair to decide/m.test(example.stderr()) ? true : undefined,
          );
          assert.equal(await sentCount(server.sql, text), 0, 'nothing sent before the decision');
          await server.services.approvals.decide({ id: request.id, user: chair, decision: 'approve' });
          assert.equal(await example.exit, 0, example.stderr());
          const result = JSON.parse(example.stdout()) as {
            structuredContent: { send_status: string; dry_run: boolean };
          };
          assert.equal(result.structuredContent.send_status, 'sent');
          assert.equal(result.structuredContent.dry_run, false);
          assert.equal(await sentCount(server.sql, text), 1);
        } finally {
          example.kill();
        }
      });
    }
  });
}
