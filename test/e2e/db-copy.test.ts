import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  COPIED_TABLES,
  SKIPPED_TABLES,
  listTables,
  tallyAll,
  tallyDifferences,
} from '../../src/admin/db-copy.ts';
import { createAgent } from '../../src/accounts/agents.ts';
import { loadConfig } from '../../src/config.ts';
import { openDatabase, toCount, type Database } from '../../src/db/knex.ts';
import { createLogger } from '../../src/log.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { runCli } from '../helpers/cli.ts';
import {
  createTestDatabase,
  describeOnPostgres,
  openMigratedDatabase,
  type TestDatabase,
} from '../helpers/db.ts';
import { call, connectHttp, type Envelope, startSqlServer, startTestServer } from '../helpers/server.ts';

const COPIED: string[] = COPIED_TABLES.map((t) => t.table);

describe('db copy: the tables it knows', () => {
  let testDb: TestDatabase;
  let db: Database;
  before(async () => ({ testDb, db } = await openMigratedDatabase('pglite')));
  after(async () => {
    await db?.close();
    await testDb?.drop();
  });

  it('handles every table the migrations create: each is copied or skipped on purpose, none both', async () => {
    const handled = [...COPIED, ...Object.keys(SKIPPED_TABLES)];
    assert.equal(new Set(handled).size, handled.length, 'a table is both copied and skipped');
    // A migration that adds a table fails here until db copy copies it or says why it does not.
    assert.deepEqual([...(await listTables(db.knex))].sort(), [...handled].sort());
  });

  it('copies parents before children: every foreign key of a copied table points at one copied earlier', async () => {
    const { rows } = (await db.knex.raw(
      `select conrelid::regclass::text as child, confrelid::regclass::text as parent
         from pg_constraint where contype = 'f'`,
    )) as { rows: { child: string; parent: string }[] };
    assert.ok(rows.length > 0);
    for (const { child, parent } of rows) {
      if (!COPIED.includes(child)) continue;
      assert.ok(
        COPIED.indexOf(parent) >= 0 && COPIED.indexOf(parent) < COPIED.indexOf(child),
        `${child} references ${parent}, which must be copied before it`,
      );
    }
  });
});

describe('db copy: refusals that change nothing', () => {
  it('refuses a --to that is not a PostgreSQL URL without printing it, and DATABASE_URL set (exit 2)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-dbcopy-'));
    try {
      const env = { COUNTERSIGN_DATA_DIR: dir, LOG_LEVEL: 'silent' };
      const scheme = await runCli(['db', 'copy', '--to', 'mysql://u:hunter22-secret@h/db'], env);
      assert.equal(scheme.code, 2, scheme.stderr);
      assert.match(scheme.stderr, /--to <url>' must start with postgres:\/\//);
      assert.ok(!(scheme.stdout + scheme.stderr).includes('hunter22-secret'));
      const noDb = await runCli(['db', 'copy', '--to', 'postgres://u:hunter22-secret@h'], env);
      assert.equal(noDb.code, 2, noDb.stderr);
      assert.match(noDb.stderr, /must name the database/);
      assert.ok(!(noDb.stdout + noDb.stderr).includes('hunter22-secret'));
      const missing = await runCli(['db', 'copy'], env);
      assert.equal(missing.code, 2);
      assert.match(missing.stderr, /--to <url>/);
      const both = await runCli(['db', 'copy', '--to', 'postgres://h/db'], {
        ...env,
        DATABASE_URL: 'postgres://h/other',
      });
      assert.equal(both.code, 2, both.stderr);
      assert.match(both.stderr, /DATABASE_URL is set/);
      assert.deepEqual(fs.readdirSync(dir), [], 'nothing was created in the data directory');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses a data directory without a database, and creates none', async () => {
    const dir = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-dbcopy-')), 'nope');
    const res = await runCli(['db', 'copy', '--to', 'postgres://127.0.0.1:1/db'], {
      COUNTERSIGN_DATA_DIR: dir,
      LOG_LEVEL: 'silent',
    });
    assert.equal(res.code, 1, res.stderr);
    assert.match(res.stderr, /no embedded database to copy in .*nope/);
    assert.equal(fs.existsSync(dir), false);
    fs.rmSync(path.dirname(dir), { recursive: true, force: true });
  });

  it('refuses while a running server holds the embedded database, naming it', async () => {
    const server = await startTestServer('pglite');
    try {
      // The target is never reached: the held source is refused first.
      const res = await runCli(['db', 'copy', '--to', 'postgres://127.0.0.1:1/db'], server.env);
      assert.equal(res.code, 1, res.stderr);
      assert.match(res.stderr, new RegExp(`held by another countersign process \\(pid ${process.pid} `));
      assert.match(res.stderr, /stop it first/);
    } finally {
      await server.stop();
    }
  });
});

describeOnPostgres('db copy from PGlite to PostgreSQL', () => {
  let source: TestDatabase;
  let target: TestDatabase;
  let token: string;
  let chair: { name: string; password: string };
  let requestId: string;
  let sent: Envelope;
  const args = { target_type: 'contact', target_id: 'ct_wang', content_text: '王伟你好 — before the move' };
  const envOnCopy = () => ({
    COUNTERSIGN_DATA_DIR: source.dataDir,
    DATABASE_URL: target.url!,
    COUNTERSIGN_PORT: '0',
    LOG_LEVEL: 'silent',
  });
  /** Opens the embedded database (the server that wrote it has stopped) and the copy, for a comparison. */
  async function bothDatabases<T>(work: (src: Database, dst: Database) => Promise<T>): Promise<T> {
    const src = await openDatabase({ pgliteDir: path.join(source.dataDir, 'pglite'), command: 'test' });
    const dst = await openDatabase({ url: target.url, pgliteDir: '', command: 'test' });
    try {
      return await work(src, dst);
    } finally {
      await dst.close();
      await src.close();
    }
  }

  before(async () => {
    // A history on the embedded database: a draft, a chair's approval, the real write, a note, an export.
    const server = await startTestServer('pglite');
    source = server.db;
    token = server.demoToken;
    chair = server.services.firstRun!.chair!;
    // As the CLI does once it has printed the banner; else the next start, on the copy, would renew them.
    await server.services.firstRun!.markShown();
    // An agent with an owner: agents.owner_id points at a user, who must be copied first.
    await createAgent(server.sql, { name: 'owned-bot', owner: chair.name });
    const client = await connectHttp(server.url, token);
    const draft = await call(client, 'isphere_send_message', args);
    requestId = draft.approval.approval_request_id;
    const approval_id = await approveAsChair({ env: server.env, ...chair }, draft);
    sent = await call(client, 'isphere_send_message', {
      ...args,
      dry_run: false,
      approval_id,
      idempotency_key: 'move-1',
    });
    assert.equal(sent.ok, true, JSON.stringify(sent.error));
    assert.equal(
      (await call(client, 'isphere_remember', { session_id: 's', key: 'k', value: 'v' })).ok,
      true,
    );
    const exported = await runCli(
      ['audit', 'export', '-o', path.join(source.dataDir, 'log.jsonl')],
      server.env,
    );
    assert.equal(exported.code, 0, exported.stderr);
    await client.close();
    await server.close(); // stopped, its data directory kept
    target = await createTestDatabase('postgres');
  });
  after(async () => {
    await target?.drop();
    await source?.drop();
  });

  it('copies everything into an empty database, verified there, without printing the password', async () => {
    const withPassword = new URL(target.url!);
    withPassword.password = 'never-printed-pw'; // trust authentication ignores it
    const res = await runCli(['db', 'copy', '--to', withPassword.href], {
      COUNTERSIGN_DATA_DIR: source.dataDir,
      LOG_LEVEL: 'silent',
    });
    assert.equal(res.code, 0, res.stderr);
    assert.ok(!(res.stdout + res.stderr).includes('never-printed-pw'));
    assert.match(res.stdout, /^ {2}approval_requests +1 rows$/m);
    assert.match(res.stdout, /not copied: web_sessions/);
    assert.match(res.stdout, /private half \(.*audit-signing-key\.pem\)/);
    await bothDatabases(async (src, dst) => {
      const auditRows = toCount((await src.knex('audit_events').count({ n: '*' }).first())?.n);
      assert.match(res.stdout, new RegExp(`^ {2}audit_events +${auditRows} rows$`, 'm'));
      assert.deepEqual(tallyDifferences(await tallyAll(src.knex), await tallyAll(dst.knex)), []);
    });
  });

  it('passes audit verify --db on the copy with the same row count', async () => {
    const rows = await bothDatabases(async (src) =>
      toCount((await src.knex('audit_events').count({ n: '*' }).first())?.n),
    );
    const res = await runCli(['audit', 'verify', '--db'], envOnCopy());
    assert.equal(res.code, 0, res.stderr);
    assert.match(res.stdout, new RegExp(`^${rows}/${rows} rows valid; 1 checkpoint valid`, 'm'));
  });

  it("serves the copy: the old agent token, the chair's password, the approval, the note and the idempotency key", async () => {
    const env = envOnCopy();
    const server = await startSqlServer(loadConfig(env, source.dataDir), createLogger('silent'));
    try {
      assert.equal(server.services.firstRun, undefined, 'the first run is over: no new credentials');
      const client = await connectHttp(server.url, token);
      const approval = await call(client, 'isphere_get_approval', { approval_request_id: requestId });
      assert.equal(approval.approval.status, 'succeeded');
      const note = await call(client, 'isphere_recall', { session_id: 's', key: 'k' });
      assert.deepEqual([note.found, note.value], [true, 'v']);
      const messages = await server.sql('messages').count({ n: '*' }).first();
      const again = await call(client, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approval.approval.approval_id,
        idempotency_key: 'move-1',
      });
      assert.equal(again.ok, true, 'the stored result of the write made before the move');
      assert.deepEqual(again.message_ref, sent.message_ref);
      assert.deepEqual(await server.sql('messages').count({ n: '*' }).first(), messages);
      await client.close();
      const list = await runCli(['approvals', 'list', '--as', chair.name, '--status', 'succeeded'], {
        ...env,
        COUNTERSIGN_PASSWORD: chair.password,
      });
      assert.equal(list.code, 0, list.stderr);
      assert.match(list.stdout, new RegExp(`^${requestId}\\tsucceeded`, 'm'));
    } finally {
      await server.close();
    }
  });

  it('refuses a second copy into the now non-empty database, and changes nothing', async () => {
    const snapshot = () =>
      bothDatabases(async (_src, dst) => ({
        tables: await listTables(dst.knex),
        tallies: await tallyAll(dst.knex),
      }));
    const before = await snapshot();
    const res = await runCli(['db', 'copy', '--to', target.url!], {
      COUNTERSIGN_DATA_DIR: source.dataDir,
      LOG_LEVEL: 'silent',
    });
    assert.equal(res.code, 2, res.stderr);
    assert.match(res.stderr, /is not empty: .*\(a countersign table\).*Nothing was changed/);
    const after = await snapshot();
    assert.deepEqual(after.tables, before.tables);
    assert.deepEqual(tallyDifferences(before.tallies, after.tallies), []);
  });

  it('says which tables differ when a copy does not match its source', async () => {
    await bothDatabases(async (src, dst) => {
      await dst.knex('contacts').where({ id: 'ct_wang' }).update({ display_name: 'Wang Wei (edited)' });
      await dst.knex('agent_memory').delete();
      const differences = tallyDifferences(await tallyAll(src.knex), await tallyAll(dst.knex));
      // The server that ran on the copy has added audit rows since; these two are the test's own changes.
      assert.ok(
        differences.includes('agent_memory: 1 rows in the source, 0 in the copy'),
        String(differences),
      );
      assert.ok(
        differences.some((d) => /^contacts: same \d+ rows, different contents$/.test(d)),
        String(differences),
      );
    });
  });
});
