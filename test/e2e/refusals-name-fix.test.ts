import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { pinArgs, runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from '../helpers/db.ts';
import { testEnv } from '../helpers/server.ts';

/** Each refusal a newcomer meets first says what to do about it (issue: every refusal names its fix). */
describe('refusals that name their fix: the embedded database', () => {
  let db: TestDatabase;
  let env: Record<string, string>;
  before(async () => {
    db = await createTestDatabase('pglite');
    env = testEnv(db);
  });
  after(async () => db?.drop());

  it('a second server on a held embedded database names the holder and both ways on', async () => {
    const first = await spawnServer(env);
    try {
      const second = await runCli(['serve'], env);
      assert.equal(second.code, 1);
      assert.match(second.stderr, new RegExp(`pid ${first.child.pid}`));
      assert.match(second.stderr, /Use that one, or stop it first/);
      assert.match(second.stderr, /DATABASE_URL/);
      assert.match(second.stderr, /db copy --to URL/);
    } finally {
      await stopChild(first.child);
    }
  });
});

for (const kind of databaseKinds()) {
  describe(`refusals that name their fix on ${kind}`, () => {
    let db: TestDatabase;
    let env: Record<string, string>;
    before(async () => {
      db = await createTestDatabase(kind);
      env = testEnv(db);
      // Something on the record to export.
      assert.equal((await runCli(['agent', 'add', 'scribe'], env)).code, 0);
    });
    after(async () => db?.drop());

    it('audit verify of an export whose manifest is not beside it mentions --manifest', async () => {
      const file = path.join(db.dataDir, 'log.jsonl');
      const exported = await runCli(['audit', 'export', '-o', file], env);
      assert.equal(exported.code, 0, exported.stderr);
      fs.renameSync(`${file}.manifest.json`, path.join(db.dataDir, 'elsewhere.json'));
      const refused = await runCli(['audit', 'verify', file], env);
      assert.notEqual(refused.code, 0);
      assert.match(refused.stderr, /--manifest FILE/);
      const named = await runCli(
        ['audit', 'verify', file, '--manifest', path.join(db.dataDir, 'elsewhere.json'), ...pinArgs(env)],
        env,
      );
      assert.equal(named.code, 0, named.stderr);
    });

    it('a CSV import with the wrong header prints the header it expects, and imports nothing', async () => {
      const csv = path.join(db.dataDir, 'people.csv');
      fs.writeFileSync(csv, 'name,email\nAda,ada@example.com\n');
      const refused = await runCli(['import', csv], env);
      assert.equal(refused.code, 1);
      assert.match(refused.stderr, /expected: id,display_name,account,department,title,active/);
      assert.match(refused.stderr, /without id and display_name/);
      assert.match(refused.stderr, /unknown columns name, email/);
    });

    it('--as USER without a password names COUNTERSIGN_PASSWORD', async () => {
      const refused = await runCli(['approvals', 'list', '--as', 'chair'], env, { input: '' });
      assert.notEqual(refused.code, 0);
      assert.match(refused.stderr, /COUNTERSIGN_PASSWORD/);
    });
  });
}
