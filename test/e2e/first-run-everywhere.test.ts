import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { WebClient } from '../helpers/browser-less.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, type TestDatabase } from '../helpers/db.ts';
import { call, connectHttp, testEnv, waitFor } from '../helpers/server.ts';

/** The logins a first-run banner shows. */
function banner(stderr: string) {
  const login = (who: string) => {
    const m = new RegExp(`${who} login \\(shown once\\): (\\S+) / (\\S+)`).exec(stderr);
    return m ? { name: m[1]!, password: m[2]! } : undefined;
  };
  return {
    token: /demo agent token \(shown once\): (cs_\S+)/.exec(stderr)?.[1],
    chair: login('chair'),
    admin: login('admin and compliance'),
  };
}

/**
 * Claude Desktop's way in (README): `agent add` on a fresh data directory, then `serve --stdio`. The
 * first run happens on that first command, as on a first `serve`: demo data, the demo agent, a chair
 * and an admin who is also compliance, each shown once on stderr; every user has a way in.
 */
describe('the first run of a fresh data directory, from any command', () => {
  let db: TestDatabase;
  let env: Record<string, string>;
  before(async () => {
    db = await createTestDatabase('pglite');
    fs.rmSync(path.join(db.dataDir, 'pglite'), { recursive: true, force: true });
    env = testEnv(db);
  });
  after(async () => db?.drop());

  it('agent add on a fresh directory runs the first run, shows its banner once, and serve shows none', async () => {
    const added = await runCli(['agent', 'add', 'claude-desktop'], env);
    assert.equal(added.code, 0, added.stderr);
    const shown = banner(added.stderr);
    assert.ok(shown.token, added.stderr);
    assert.equal(shown.chair?.name, 'chair');
    assert.equal(shown.admin?.name, 'admin');
    assert.match(added.stderr, /start the server: countersign serve/);
    assert.ok(fs.statSync(path.join(db.dataDir, 'outbound')).isDirectory(), 'send_file has its directory');
    assert.match(added.stdout, /^cs_/, 'the command itself still ran: its token on stdout');
    assert.match(added.stderr, /agent "claude-desktop" created/);

    const again = await runCli(['agent', 'add', 'another'], env);
    assert.equal(again.code, 0, again.stderr);
    assert.doesNotMatch(again.stderr, /shown once|first run/);

    const server = await spawnServer(env);
    try {
      assert.doesNotMatch(server.stderr(), /shown once/);
      // It says how to get new logins instead (issue 44, item 9).
      await waitFor('the way to new logins', async () =>
        /printed at the first start only/.test(server.stderr()) ? true : undefined,
      );
      assert.match(server.stderr(), /countersign agent rotate demo, countersign user reset-password chair/);
      // The demo data and the demo agent are there, with the printed token.
      const agent = await connectHttp(server.url, shown.token!);
      assert.equal((await call(agent, 'isphere_search_contacts', { query: 'David' })).ok, true);
      await agent.close();

      // Compliance has a way in: the admin opens the audit log; the chair is not offered it.
      const admin = new WebClient(server.url);
      assert.equal((await admin.login('admin', shown.admin!.password)).res.status, 303);
      const audit = await admin.get('/audit');
      assert.equal(audit.res.status, 200);
      const chair = new WebClient(server.url);
      assert.equal((await chair.login('chair', shown.chair!.password)).res.status, 303);
      const queue = await chair.get('/approvals');
      assert.equal(queue.res.status, 200);
      assert.doesNotMatch(queue.html, /href="\/audit"|href="\/admin\//, 'no link the chair may not open');
      assert.match(audit.html, /href="\/audit"/);
    } finally {
      await stopChild(server.child);
    }
  });
});
