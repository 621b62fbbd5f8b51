import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { openDatabase } from '../../src/db/knex.ts';
import { lockedBy } from '../../src/db/lock.ts';
import { runCli, spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds, type TestDatabase } from '../helpers/db.ts';
import { call, connectHttp, testEnv } from '../helpers/server.ts';

describe('the embedded database while a server holds it', () => {
  let db: TestDatabase;
  let env: Record<string, string>;
  let server: Awaited<ReturnType<typeof spawnServer>>;

  before(async () => {
    db = await createTestDatabase('pglite');
    env = testEnv(db);
    server = await spawnServer(env);
  });
  after(async () => {
    if (server) await stopChild(server.child);
    await db?.drop();
  });

  it('refuses a second process on the same data dir, naming the holder', async () => {
    await assert.rejects(
      openDatabase({ pgliteDir: path.join(db.dataDir, 'pglite'), command: 'test' }),
      (err: unknown) =>
        lockedBy(err)?.pid === server.child.pid && (err as Error).message.includes(`pid ${server.child.pid}`),
    );
    const second = await runCli(['serve'], env);
    assert.equal(second.code, 1);
    assert.match(second.stderr, new RegExp(`held by another countersign process \\(pid ${server.child.pid}`));
  });

  it("answers a second start on the same port with the data directory's holder and its address", async () => {
    const port = new URL(server.url).port;
    const second = await runCli(['serve'], { ...env, COUNTERSIGN_PORT: port });
    assert.equal(second.code, 1);
    assert.doesNotMatch(second.stderr, /in use/, 'the cause, not the port');
    assert.ok(second.stderr.includes(`(pid ${server.child.pid} on `), second.stderr);
    assert.ok(second.stderr.includes(`which serves it at ${server.url}`), second.stderr);
    assert.match(
      second.stderr,
      /stop it first; give this one its own data directory \(COUNTERSIGN_DATA_DIR\)/,
    );
  });

  it('runs agent commands through the running server instead of opening the dir again', async () => {
    const added = await runCli(['agent', 'add', 'via-server'], env);
    assert.equal(added.code, 0, added.stderr);
    // Where it ran is said only at debug level: the answer is the same either way.
    assert.doesNotMatch(added.stderr, /sending the command to it/);
    const token = added.stdout.trim().split('\n').at(-1)!;
    assert.match(token, /^cs_[A-Za-z0-9_-]{55}$/, 'a tagged token (docs/operations.md)');

    const client = await connectHttp(server.url, token);
    assert.equal((await call(client, 'isphere_search_contacts', { query: 'alice' })).ok, true);
    await client.close();

    const list = await runCli(['agent', 'list'], { ...env, LOG_LEVEL: 'debug' });
    assert.match(list.stdout, /^via-server\t.*\tactive$/m);
    assert.match(list.stderr, /holds the embedded database; sending the command to it/);
    const revoked = await runCli(['agent', 'revoke', 'via-server'], env);
    assert.equal(revoked.code, 0);
    const again = await runCli(['agent', 'revoke', 'via-server'], env);
    assert.equal(again.code, 1);
    assert.match(again.stderr, /no active agent named "via-server"/);
    const dup = await runCli(['agent', 'add', 'demo'], env);
    assert.equal(dup.code, 1);
    assert.match(dup.stderr, /already exists/);
  });

  it('says plainly what to do when the holder cannot be reached, without hanging', async () => {
    const announce = path.join(db.dataDir, 'admin.json');
    const saved = fs.readFileSync(announce);
    fs.rmSync(announce);
    try {
      const res = await runCli(['agent', 'list'], env, { timeoutMs: 20_000 });
      assert.equal(res.code, 1);
      assert.match(res.stderr, /holds the database .* stop the server and retry/);
    } finally {
      fs.writeFileSync(announce, saved, { mode: 0o600 });
    }
  });
});

for (const kind of databaseKinds()) {
  describe(`CLI data commands on ${kind}`, () => {
    let db: TestDatabase;
    let env: Record<string, string>;
    before(async () => {
      db = await createTestDatabase(kind);
      env = testEnv(db);
    });
    after(async () => db?.drop());

    it('migrates, loads the demo and imports JSON and CSV', async () => {
      const migrate = await runCli(['migrate'], env);
      assert.equal(migrate.code, 0, migrate.stderr);
      const demo = await runCli(['demo'], env);
      assert.match(demo.stdout, /imported 10 contacts, 4 groups, 7 conversations, 12 messages, 3 files/);

      const csv = path.join(db.dataDir, 'people.csv');
      fs.writeFileSync(
        csv,
        'id,display_name,account,department,title,active\nct_x,"Smith, Jane",jsmith,Sales,Rep,true\nct_y,נועה,noa,,,false\n',
      );
      const imported = await runCli(['import', csv], env);
      assert.equal(imported.code, 0, imported.stderr);
      assert.match(imported.stdout, /imported 2 contacts/);

      const json = path.join(db.dataDir, 'data.json');
      fs.writeFileSync(json, JSON.stringify({ contacts: [{ id: 'ct_z', display_name: 'Zoë' }] }));
      assert.equal((await runCli(['import', json], env)).code, 0);
    });

    it('refuses a malformed import with a message naming the field', async () => {
      const bad = path.join(db.dataDir, 'bad.json');
      fs.writeFileSync(bad, JSON.stringify({ contacts: [{ id: 'ct_q' }] }));
      const res = await runCli(['import', bad], env);
      assert.equal(res.code, 1);
      assert.match(res.stderr, /contacts\.0\.display_name/);
      const missing = await runCli(['import', path.join(db.dataDir, 'nope.json')], env);
      assert.equal(missing.code, 1);
      assert.match(missing.stderr, /cannot read/);
    });

    it('adds an agent, printing its token alone on the last stdout line, and stores only its hash', async () => {
      const res = await runCli(['agent', 'add', 'bot-1'], env);
      assert.equal(res.code, 0, res.stderr);
      const token = res.stdout.trim().split('\n').at(-1)!;
      assert.match(token, /^cs_/);
      const list = await runCli(['agent', 'list'], env);
      assert.match(list.stdout, /bot-1/);
      assert.ok(!list.stdout.includes(token));
      const bad = await runCli(['agent', 'add', 'has space'], env);
      assert.equal(bad.code, 1);
    });
  });
}
