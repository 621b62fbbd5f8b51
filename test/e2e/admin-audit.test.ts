import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { pinArgs, runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';

type Row = { kind: string; actor: string | null; agent_id: string | null; details: Record<string, unknown> };

/** Administrative actions leave rows in the chain (docs/audit.md): who did what, before and after, never a secret. */
for (const kind of databaseKinds()) {
  describe(`administrative audit rows on ${kind}`, () => {
    let server: TestServer;
    const cli = (args: string[], input?: string) =>
      runCli(args, server.env, input === undefined ? {} : { input });
    /** The rows of these kinds, read back from a verified export (as compliance would). */
    async function exported(kinds: string[]): Promise<Row[]> {
      const file = path.join(server.db.dataDir, `admin-${Date.now()}.jsonl`);
      const res = await cli(['audit', 'export', '--format', 'jsonl', '-o', file]);
      assert.equal(res.code, 0, res.stderr);
      const verified = await cli(['audit', 'verify', file, ...pinArgs(server.env)]);
      assert.equal(verified.code, 0, verified.stdout + verified.stderr);
      return fs
        .readFileSync(file, 'utf8')
        .trimEnd()
        .split('\n')
        .map((l) => JSON.parse(l) as Row)
        .filter((r) => kinds.includes(r.kind));
    }

    before(async () => {
      server = await startTestServer(kind);
    });
    after(async () => {
      await server?.stop();
    });

    it('records what the first run created, as first-run', async () => {
      const rows = await exported(['agent.created', 'user.created']);
      assert.deepEqual(
        rows.map((r) => [r.kind, r.actor, r.details.agent ?? r.details.user]),
        [
          ['agent.created', 'first-run', 'demo'],
          ['user.created', 'first-run', 'chair'],
          ['user.created', 'first-run', 'admin'],
        ],
      );
    });

    it('records agent add, each changed setting with before and after, and revoke, by the OS user and host', async () => {
      assert.equal(
        (await cli(['agent', 'add', 'scribe', '--profile', 'drafting', '--rate-limit', '30'])).code,
        0,
      );
      assert.equal((await cli(['agent', 'set', 'scribe', '--profile', 'all', '--rate-limit', '60'])).code, 0);
      assert.equal(
        (await cli(['agent', 'set', 'scribe', '--rate-limit', '60'])).code,
        0,
        'unchanged: no row',
      );
      assert.equal((await cli(['agent', 'revoke', 'scribe'])).code, 0);
      assert.equal((await cli(['agent', 'revoke', 'scribe'])).code, 1, 'refused: nothing recorded');
      const agent = await server.sql('agents').where({ name: 'scribe' }).first();
      const rows = (
        await exported([
          'agent.created',
          'agent.profile_changed',
          'agent.rate_limit_changed',
          'agent.revoked',
        ])
      ).filter((r) => r.agent_id === agent.id);
      assert.deepEqual(
        rows.map((r) => [r.kind, r.details]),
        [
          [
            'agent.created',
            {
              agent: 'scribe',
              agent_name: 'scribe',
              profile: 'drafting',
              owner: null,
              rate_limit_per_min: 30,
            },
          ],
          [
            'agent.profile_changed',
            { agent: 'scribe', agent_name: 'scribe', before: 'drafting', after: 'all' },
          ],
          ['agent.rate_limit_changed', { agent: 'scribe', agent_name: 'scribe', before: 30, after: 60 }],
          ['agent.revoked', { agent: 'scribe', agent_name: 'scribe' }],
        ],
      );
      for (const r of rows) assert.match(r.actor ?? '', /^cli:.+@.+/);
    });

    it('records user add with roles and never the password', async () => {
      assert.equal(
        (await cli(['user', 'add', 'uma', '--role', 'compliance'], 'uma-secret-password\n')).code,
        0,
      );
      const rows = (await exported(['user.created'])).filter((r) => r.details.user === 'uma');
      assert.equal(rows.length, 1);
      assert.deepEqual(rows[0]!.details, { user: 'uma', roles: ['compliance'] });
      assert.match(rows[0]!.actor ?? '', /^cli:/);
      const all = JSON.stringify(await server.sql('audit_events').select('details'));
      assert.ok(!all.includes('uma-secret-password'));
      const db = await cli(['audit', 'verify', '--db']);
      assert.equal(db.code, 0, db.stdout);
    });
  });
}
