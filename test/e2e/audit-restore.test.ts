import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { after, it } from 'node:test';
import pg from 'pg';
import { verifyDatabase } from '../../src/audit/context.ts';
import { loadConfig } from '../../src/config.ts';
import { isAppError } from '../../src/core/errors.ts';
import { createLogger } from '../../src/log.ts';
import { runCli } from '../helpers/cli.ts';
import { describeOnPostgres } from '../helpers/db.ts';
import {
  startSqlServer,
  startTestServer,
  testEnv,
  type SqlServer,
  type TestServer,
} from '../helpers/server.ts';
import { appendRows } from '../helpers/tamper.ts';

/** A backup of the database as an operator takes one (pg_dump), restored into a new database. */
async function backupInto(url: string): Promise<{ url: string; drop(): Promise<void> }> {
  const admin = new URL(process.env.TEST_DATABASE_URL!);
  const name = `countersign_restore_${randomBytes(6).toString('hex')}`;
  const run = async (sql: string) => {
    const c = new pg.Client({ connectionString: admin.href });
    await c.connect();
    await c.query(sql);
    await c.end();
  };
  await run(`create database ${name}`);
  const target = new URL(admin.href);
  target.pathname = `/${name}`;
  const dump = execFileSync('pg_dump', ['--no-owner', url], { maxBuffer: 256 * 1024 * 1024 });
  execFileSync('psql', ['-q', '-v', 'ON_ERROR_STOP=1', target.href], {
    input: dump,
    stdio: ['pipe', 'ignore', 'inherit'],
  });
  return { url: target.href, drop: () => run(`drop database if exists ${name} with (force)`) };
}

describeOnPostgres('a database restored from a backup', () => {
  let live: TestServer;
  let backup: { url: string; drop(): Promise<void> } | undefined;
  const running: SqlServer[] = [];
  let liveOpen = false;
  after(async () => {
    for (const s of running) await s.close();
    await backup?.drop();
    if (liveOpen) await live.close();
    await live?.db.drop();
  });

  /** A replica on the restored database, with the live one's data directory and host roots. */
  const startOnBackup = async () => {
    const env = { ...testEnv(live.db), DATABASE_URL: backup!.url };
    const server = await startSqlServer(loadConfig(env, live.db.dataDir), createLogger('silent'));
    running.push(server);
    return { server, env };
  };

  it('is TAMPERED until an operator accepts it, then signs again, with the acceptance in the chain', async () => {
    live = await startTestServer('postgres');
    liveOpen = true;
    await appendRows(live.services.audit, 3);
    assert.ok(await live.services.checkpoints.checkpoint());
    backup = await backupInto(live.db.url!);
    // The live log goes on past the backup and signs a newer head; then its database is lost.
    await appendRows(live.services.audit, 5);
    const lost = await live.services.checkpoints.checkpoint();
    assert.ok(lost);
    await live.close();
    liveOpen = false;

    const first = await startOnBackup();
    await assert.rejects(first.server.services.checkpoints.checkpoint(), (err) =>
      isAppError(err, 'TAMPERED', 'rows_deleted'),
    );
    await running.pop()!.close();

    const refused = await runCli(['audit', 'accept-restore'], first.env);
    assert.notEqual(refused.code, 0, 'a reason is required');
    const accepted = await runCli(
      ['audit', 'accept-restore', '--reason', 'restored last night’s dump'],
      first.env,
    );
    assert.equal(accepted.code, 0, accepted.stdout + accepted.stderr);
    assert.match(accepted.stdout, new RegExp(`signed head at seq ${lost.seq}`));
    const again = await runCli(['audit', 'accept-restore', '--reason', 'twice'], first.env);
    assert.notEqual(again.code, 0, 'nothing left to accept');

    const restarted = await startOnBackup();
    const { config } = restarted.server.services;
    const knex = restarted.server.sql;
    assert.ok(await restarted.server.services.checkpoints.checkpoint(), 'signs again');
    const row = await knex('audit_events').where({ kind: 'audit.restore_accepted' }).first();
    assert.equal(row.details.reason, 'restored last night’s dump');
    assert.deepEqual(
      row.details.given_up.map((g: { seq: number; head_hash: string }) => [g.seq, g.head_hash]),
      [[lost.seq, lost.head_hash]],
    );
    assert.equal((await verifyDatabase(knex, [], config)).ok, true);
  });
});
