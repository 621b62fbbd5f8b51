import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, initializeStatus, startTestServer, type TestServer } from '../helpers/server.ts';

for (const kind of databaseKinds()) {
  describe(`countersign agent rotate on ${kind}`, () => {
    let server: TestServer;
    before(async () => {
      server = await startTestServer(kind);
    });
    after(async () => {
      await server?.stop();
    });

    it('gives a new token alone on the last line, refuses the old one at once, and audits who did it', async () => {
      const added = await runCli(['agent', 'add', 'rotor'], server.env);
      assert.equal(added.code, 0, added.stderr);
      const oldToken = added.stdout.trim().split('\n').at(-1)!;
      assert.equal(await initializeStatus(server, oldToken), 200);

      const rotated = await runCli(['agent', 'rotate', 'rotor'], server.env);
      assert.equal(rotated.code, 0, rotated.stderr);
      const lines = rotated.stdout.trim().split('\n');
      assert.equal(lines.length, 1, 'stdout holds the token alone');
      const newToken = lines[0]!;
      assert.match(newToken, /^cs_/);
      assert.notEqual(newToken, oldToken);

      assert.equal(await initializeStatus(server, oldToken), 401, 'the old token is refused at once');
      const client = await connectHttp(server.url, newToken);
      assert.equal((await call(client, 'isphere_search_groups', { query: 'board' })).ok, true);
      await client.close();

      const row = await server.sql('audit_events').where({ kind: 'agent.token_rotated' }).first();
      assert.ok(row, 'audited');
      assert.match(row.actor, /^cli:.+@.+/);
      const agent = await server.sql('agents').where({ name: 'rotor' }).first();
      assert.equal(row.agent_id, agent.id);
      const details = typeof row.details === 'string' ? JSON.parse(row.details) : row.details;
      assert.ok(!JSON.stringify(details).includes(newToken), 'no secret in the record');
    });

    it('refuses an unknown or revoked agent, and changes nothing', async () => {
      const unknown = await runCli(['agent', 'rotate', 'nobody'], server.env);
      assert.equal(unknown.code, 1);
      assert.match(unknown.stderr, /no active agent named "nobody"/);
      assert.equal(unknown.stdout, '');

      const added = await runCli(['agent', 'add', 'gone'], server.env);
      const token = added.stdout.trim().split('\n').at(-1)!;
      assert.equal((await runCli(['agent', 'revoke', 'gone'], server.env)).code, 0);
      const revoked = await runCli(['agent', 'rotate', 'gone'], server.env);
      assert.equal(revoked.code, 1);
      assert.equal(await initializeStatus(server, token), 401);
      const rows = await server.sql('audit_events').where({ kind: 'agent.token_rotated' });
      assert.equal(rows.length, 1, 'only the rotation of the test before');
    });
  });
}
