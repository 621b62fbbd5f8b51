import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { databaseKinds } from '../helpers/db.ts';
import { connectHttp, startTestServer, waitFor, type Envelope, type TestServer } from '../helpers/server.ts';
import { taskSession } from '../helpers/tasks-client.ts';
import { startUpstreamFixture, type UpstreamFixture } from '../helpers/upstream-fixture.ts';

/** An upstream MCP server's write tool asked for as a task: completed with the upstream's own result. */
for (const kind of databaseKinds()) {
  describe(`an upstream write asked as a task on ${kind}`, () => {
    let crm: UpstreamFixture;
    let server: TestServer;
    let client: Client;
    let chair: User;
    let configFile: string;

    before(async () => {
      crm = await startUpstreamFixture();
      configFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-tasks-up-')), 'config.json');
      fs.writeFileSync(configFile, JSON.stringify({ upstreams: [{ name: 'crm', url: crm.url }] }));
      server = await startTestServer(kind, { COUNTERSIGN_CONFIG: configFile });
      chair = await createUser(server.sql, {
        name: 'chair-ada',
        roles: ['chair'],
        password: 'correct horse 1',
      });
      client = await connectHttp(server.url, server.demoToken, 'modern');
    });
    after(async () => {
      await client?.close();
      await server?.stop();
      await crm?.close();
      fs.rmSync(path.dirname(configFile), { recursive: true, force: true });
    });

    it('drafts, waits for the chair, and completes once with what the upstream answered', async () => {
      const text = 'note asked as a task';
      const session = taskSession(client, server.url, server.demoToken);
      try {
        const execution = await session.callTool('crm__set_note', { text, dry_run: false });
        assert.equal(execution.kind, 'task');
        const request = await waitFor('the drafted request', async () => {
          const row = (await server.sql('approval_requests').where({ tool: 'crm__set_note' }).first()) as
            { id: string } | undefined;
          return row;
        });
        assert.equal(crm.notes.includes(text), false, 'nothing is sent before the decision');
        await server.services.approvals.decide({ id: request.id, user: chair, decision: 'approve' });
        const { outcome } = await execution.settle();
        assert.equal(outcome.status, 'completed', JSON.stringify(outcome));
        const result = (outcome as { result: { structuredContent: Envelope } }).result;
        assert.equal(result.structuredContent.ok, true, JSON.stringify(result.structuredContent));
        assert.match(JSON.stringify(result.structuredContent), /noted #1/);
      } finally {
        await session.close();
      }
      assert.deepEqual(crm.notes, [text]);
    });
  });
}
