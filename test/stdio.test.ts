import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { builtinTools } from '../src/tools/index.ts';
import { databaseKinds } from './helpers/db.ts';
import { createTestDatabase, type TestDatabase } from './helpers/db.ts';
import { runCli } from './helpers/cli.ts';
import { call, connectStdio, ERAS, testEnv } from './helpers/server.ts';

for (const kind of databaseKinds()) {
  describe(`stdio transport on ${kind}`, () => {
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
    });
    after(async () => db?.drop());

    for (const era of ERAS) {
      it(`serves the read tools to the agent named by COUNTERSIGN_AGENT_TOKEN, logging only to stderr (${era} client)`, async () => {
        const { client, stderr, exited } = await connectStdio(
          { ...env, LOG_LEVEL: 'info', COUNTERSIGN_AGENT_TOKEN: token },
          era,
        );
        try {
          assert.equal(client.getProtocolEra(), era);
          const tools = await client.listTools();
          assert.deepEqual(
            tools.tools.map((t) => t.name),
            builtinTools.map((t) => `isphere_${t.name}`),
          );
          const res = await call(client, 'isphere_search_contacts', { query: '张' });
          assert.equal(res.contacts[0].contact_id, 'ct_zhang');
          assert.ok(res.audit.audit_seq > 0);
          // Any log line on stdout would have broken the JSON-RPC stream above; the logs are on stderr.
          assert.match(stderr(), /countersign serving on stdio/);
          assert.ok(!stderr().includes(token), 'the token is never logged');
        } finally {
          await client.close();
        }
        // The client closing stdin ends the server cleanly: nothing but its own log lines on stderr.
        await exited();
        assert.doesNotMatch(stderr(), /Error|Warning|Maximum call stack/);
      });
    }

    it('exits non-zero with a clear message for a bad token', async () => {
      const res = await runCli(['serve', '--stdio'], { ...env, COUNTERSIGN_AGENT_TOKEN: 'cs_wrong' });
      assert.equal(res.code, 1);
      assert.match(res.stderr, /COUNTERSIGN_AGENT_TOKEN refused: unknown token/);
      assert.equal(res.stdout, '');
      const none = await runCli(['serve', '--stdio'], env);
      assert.equal(none.code, 1);
      assert.match(none.stderr, /missing token/);
    });
  });
}
