import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Knex } from 'knex';
import { chainHash, rowFromDb } from '../../src/audit/chain.ts';
import {
  checkpointIfDue,
  checkpointPayload,
  createCheckpoint,
  latestCheckpoint,
  listCheckpoints,
  type Checkpoint,
  type CheckpointDeps,
} from '../../src/audit/checkpoints.ts';
import { verifyDatabase } from '../../src/audit/context.ts';
import { exportAudit } from '../../src/audit/export.ts';
import { AUDIT_LOCK_KEY, createAuditLog } from '../../src/audit/log.ts';
import { loadSigner, type Signer } from '../../src/audit/signing.ts';
import { verifyExport } from '../../src/audit/verify-export.ts';
import { loadConfig } from '../../src/config.ts';
import { isAppError } from '../../src/core/errors.ts';
import type { Database } from '../../src/db/knex.ts';
import { pinArgs, runCli } from '../helpers/cli.ts';
import { databaseKinds, openMigratedDatabase, type TestDatabase } from '../helpers/db.ts';
import { startTestServer, waitFor, type TestServer, checkpointDepsOf } from '../helpers/server.ts';

/**
 * What a database administrator can do: change rows in one transaction with the append-only triggers
 * out of the way (session_replication_role = replica, as a superuser may), holding the chain's lock so
 * that the server's own appends wait.
 */
async function asAdmin(knex: Knex, change: (trx: Knex.Transaction) => Promise<void>): Promise<void> {
  await knex.transaction(async (trx) => {
    await trx.raw('select pg_advisory_xact_lock(?)', [AUDIT_LOCK_KEY]);
    await trx.raw('set local session_replication_role = replica');
    await change(trx);
  });
}

/** Edits row `seq`'s details and re-hashes every row from it to the head, so that the links hold again. */
async function rewriteRow(trx: Knex.Transaction, seq: number, details: Record<string, unknown>) {
  const rows = ((await trx('audit_events').where('seq', '>=', seq).orderBy('seq')) as unknown[]).map(
    rowFromDb,
  );
  let prevHash = rows[0]!.prev_hash;
  for (const row of rows) {
    const body = row.seq === seq ? { ...row, details: { ...row.details, ...details } } : row;
    const hash = chainHash(prevHash, body);
    await trx('audit_events')
      .where('seq', row.seq)
      .update({ details: JSON.stringify(body.details), prev_hash: prevHash, hash });
    prevHash = hash;
  }
}

/** The head row's seq and hash. */
async function head(knex: Knex | Knex.Transaction) {
  const row = (await knex('audit_events').orderBy('seq', 'desc').first('seq', 'hash')) as {
    seq: number | string;
    hash: string;
  };
  return { seq: Number(row.seq), hash: row.hash };
}

/** What an administrator who also holds the signing key does: signs the head and stores the checkpoint. */
async function signHeadWith(knex: Knex, signer: Signer, origin: string) {
  const h = await head(knex);
  const statement = { origin, seq: h.seq, head_hash: h.hash, ts: new Date().toISOString() };
  const checkpoint: Checkpoint = {
    ...statement,
    key_id: signer.key_id,
    public_key: signer.public_key,
    signature: signer.sign(checkpointPayload(statement)),
  };
  await knex('audit_checkpoints').insert(checkpoint);
}

function foreignSigner(dir: string): Signer {
  const file = path.join(dir, `foreign-${Math.random().toString(36).slice(2)}.pem`);
  const { privateKey } = generateKeyPairSync('ed25519');
  fs.writeFileSync(file, privateKey.export({ format: 'pem', type: 'pkcs8' }));
  return loadSigner(dir, file);
}

/**
 * An export of the live table, signed by the server's checkpoint deps; `insider`: as someone holding the
 * key file would sign it, without the server's own record of the last head it signed.
 */
async function exportTo(
  server: TestServer,
  name: string,
  filter: Record<string, string> = {},
  opts: { insider?: boolean } = {},
) {
  const file = path.join(server.db.dataDir, name);
  const out = fs.createWriteStream(file);
  const deps = opts.insider ? { ...checkpointDepsOf(server), guard: undefined } : checkpointDepsOf(server);
  const manifest = await exportAudit(deps, {
    format: 'jsonl',
    filter,
    out,
    file: name,
    actor: 'test',
  });
  await new Promise<void>((r) => out.end(() => r()));
  fs.writeFileSync(`${file}.manifest.json`, JSON.stringify(manifest));
  return { file, manifest };
}

const append = (server: TestServer, n: number) =>
  (async () => {
    for (let i = 0; i < n; i++)
      await server.services.audit.append({
        kind: 'tool.call',
        tool: 'isphere_search_contacts',
        result: 'ok',
      });
  })();

/** Quiet servers: no checkpoint of their own but the first, unless a test asks for a cadence. */
const QUIET = { COUNTERSIGN_CHECKPOINT_INTERVAL_S: '3600', COUNTERSIGN_CHECKPOINT_ROWS: '100000' };

for (const kind of databaseKinds()) {
  describe(`an insider against the audit log on ${kind}`, () => {
    let server: TestServer;
    let firstCheckpointRowAfter100: number;

    before(async () => {
      server = await startTestServer(kind, QUIET);
      // A chain of 160+ rows with a checkpoint signed after every 40 rows.
      for (let i = 0; i < 4; i++) {
        await append(server, 40);
        await server.services.checkpoints.checkpoint();
      }
      const rows = (await server
        .sql('audit_events')
        .where('kind', 'checkpoint')
        .andWhere('seq', '>', 100)
        .orderBy('seq')
        .first('seq')) as { seq: number | string };
      firstCheckpointRowAfter100 = Number(rows.seq);
      assert.ok((await head(server.sql)).seq >= 150);
    });
    after(async () => server?.stop());

    it('fails verify --db, naming the seq, when row 100 was edited, the chain re-hashed and the checkpoints deleted', async () => {
      const clean = await runCli(['audit', 'verify', '--db'], server.env);
      assert.equal(clean.code, 0, clean.stdout + clean.stderr);

      await asAdmin(server.sql, async (trx) => {
        await rewriteRow(trx, 100, { edited: true });
        await trx('audit_checkpoints').delete();
      });
      assert.equal(await server.services.auditReader.latestCheckpoint(), undefined);

      const report = await server.services.auditReader.verify();
      assert.equal(report.ok, false);
      assert.equal(report.chain.first_bad?.seq, firstCheckpointRowAfter100);
      assert.equal(report.chain.first_bad?.fault, 'checkpoint');

      // On the host, with the host roots, the rewritten row itself is found: its MAC covers its old hash.
      const cli = await runCli(['audit', 'verify', '--db'], server.env);
      assert.equal(cli.code, 1, cli.stdout + cli.stderr);
      assert.match(cli.stdout, /TAMPERED: first bad \(seq 100\): row_mac_mismatch/);
    });

    it('refuses to sign an export of the rewritten chain', async () => {
      await assert.rejects(exportTo(server, 'refused.jsonl'), (err) => isAppError(err, 'TAMPERED'));
    });

    it('fails the offline verification of an export signed anyway with the real key, naming the seq', async () => {
      // The administrator also holds the key file: signs the rewritten head, and the export goes ahead.
      const signer = loadSigner(server.db.dataDir);
      assert.equal(signer.key_id, server.services.checkpoints.signer.key_id);
      await signHeadWith(server.sql, signer, server.services.checkpoints.origin);
      const { file, manifest } = await exportTo(server, 'forged.jsonl', {}, { insider: true });
      const report = await verifyExport(file, manifest, signer.public_key);
      assert.equal(report.ok, false);
      assert.equal(report.signature, 'valid');
      assert.equal(report.first_bad?.seq, firstCheckpointRowAfter100);

      const pubkey = path.join(server.db.dataDir, 'public.pem');
      fs.writeFileSync(pubkey, signer.public_key);
      const cli = await runCli(['audit', 'verify', file, '--pubkey', pubkey], server.env);
      assert.equal(cli.code, 1, cli.stdout + cli.stderr);
      assert.match(cli.stdout, new RegExp(`seq ${firstCheckpointRowAfter100}\\): checkpoint row`));
    });

    it('fails when the checkpoint rows were re-written to the new hashes too: their signatures no longer hold', async () => {
      await asAdmin(server.sql, async (trx) => {
        // Each checkpoint row made to quote its re-hashed head, then the chain re-hashed after it.
        const cps = (await trx('audit_events').where('kind', 'checkpoint').orderBy('seq')) as unknown[];
        for (const raw of cps.map(rowFromDb)) {
          const prevRow = rowFromDb(
            await trx('audit_events')
              .where('seq', raw.seq - 1)
              .first(),
          );
          await rewriteRow(trx, raw.seq, { head_hash: prevRow.hash });
        }
      });
      const report = await server.services.auditReader.verify();
      assert.equal(report.ok, false);
      assert.equal(report.chain.first_bad?.fault, 'checkpoint');
      assert.match(report.chain.first_bad?.detail ?? '', /not signed by the log's key/);
    });
  });

  describe(`the unanchored tail on ${kind}`, () => {
    let server: TestServer;
    let cp: Checkpoint;

    before(async () => {
      server = await startTestServer(kind, QUIET);
      await append(server, 5);
      cp = (await server.services.checkpoints.checkpoint())!;
      await append(server, 3);
    });
    after(async () => server?.stop());

    it('names the rows after the last checkpoint and fails under --require-anchored (--db)', async () => {
      const h = await head(server.sql);
      const report = await server.services.auditReader.verify();
      assert.equal(report.ok, true, report.summary);
      // The checkpoint's own row (cp.seq + 1) records it; the rows after it are not signed yet.
      assert.deepEqual(report.tail, { from: cp.seq + 2, to: h.seq });

      const plain = await runCli(['audit', 'verify', '--db'], server.env);
      assert.equal(plain.code, 0, plain.stdout + plain.stderr);
      assert.match(plain.stdout, new RegExp(`^rows ${cp.seq + 2}–${h.seq} follow the last checkpoint$`, 'm'));
      const strict = await runCli(['audit', 'verify', '--db', '--require-anchored'], server.env);
      assert.equal(strict.code, 1, strict.stdout + strict.stderr);
    });

    it('names the tail of an export offline, filtered and unfiltered, and fails it under --require-anchored', async () => {
      // Filtered: the tool calls after the checkpoint's own row are the tail, told by the manifest.
      const filtered = await exportTo(server, 'tail-calls.jsonl', { kind: 'tool.call' });
      assert.equal(filtered.manifest.chain_checkpoint?.seq, cp.seq + 1);
      const filteredReport = await verifyExport(filtered.file, filtered.manifest);
      assert.equal(filteredReport.ok, true, JSON.stringify(filteredReport.first_bad));
      assert.deepEqual(filteredReport.tail, { from: cp.seq + 2, to: filtered.manifest.last_seq });

      // Unfiltered: the export's own checkpoint row is the last in the chain it holds; after it, the
      // filtered export's row, unsigned until the next checkpoint.
      const { file, manifest } = await exportTo(server, 'tail.jsonl');
      const lastRow = manifest.chain_checkpoint!.seq;
      assert.equal(lastRow, filtered.manifest.checkpoint.seq + 1);
      const report = await verifyExport(file, manifest);
      assert.equal(report.ok, true, JSON.stringify(report.first_bad));
      assert.ok(report.checkpoint_rows >= 2);
      assert.deepEqual(report.tail, { from: lastRow + 1, to: manifest.checkpoint.seq });

      const plain = await runCli(['audit', 'verify', file, ...pinArgs(server.env)], server.env);
      assert.equal(plain.code, 0, plain.stdout + plain.stderr);
      assert.match(plain.stdout, /^rows? \d+(–\d+)? follows? the last checkpoint$/m);
      const strict = await runCli(
        ['audit', 'verify', file, '--require-anchored', ...pinArgs(server.env)],
        server.env,
      );
      assert.equal(strict.code, 1, strict.stdout + strict.stderr);
    });

    it('has no tail once a checkpoint covers every row', async () => {
      const signed = (await server.services.checkpoints.checkpoint())!;
      assert.equal((await head(server.sql)).seq, signed.seq + 1);
      const report = await server.services.auditReader.verify();
      assert.equal(report.ok, true, report.summary);
      assert.equal(report.tail, undefined);
      const strict = await runCli(['audit', 'verify', '--db', '--require-anchored'], server.env);
      assert.equal(strict.code, 0, strict.stdout + strict.stderr);
    });

    it("fails, naming the seq, when the rows from a checkpoint's own row on were deleted", async () => {
      await append(server, 2);
      const last = (await server.services.auditReader.latestCheckpoint())!;
      // Deleting only the unsigned rows after the checkpoint row cannot be told; they were the tail.
      await asAdmin(server.sql, async (trx) => {
        await trx('audit_events')
          .where('seq', '>', last.seq + 1)
          .delete();
      });
      assert.equal((await server.services.auditReader.verify()).ok, true);
      // Deleting the row that records the checkpoint too is seen: the stored checkpoint names it.
      await asAdmin(server.sql, async (trx) => {
        await trx('audit_events').where('seq', '>', last.seq).delete();
      });
      const report = await server.services.auditReader.verify();
      assert.equal(report.ok, false);
      assert.match(
        report.summary,
        new RegExp(`checkpoint at seq ${last.seq}: row ${last.seq + 1}, .*missing`),
      );
      const cli = await runCli(['audit', 'verify', '--db'], server.env);
      assert.equal(cli.code, 1, cli.stdout + cli.stderr);
      assert.match(cli.stdout, new RegExp(`checkpoint at seq ${last.seq}:`));

      // And a stored checkpoint past the chain's end (its rows deleted) names its seq.
      await asAdmin(server.sql, async (trx) => {
        await trx('audit_events')
          .where('seq', '>', last.seq - 2)
          .delete();
      });
      const shorter = await server.services.auditReader.verify();
      assert.equal(shorter.ok, false);
      const beyond = new RegExp(`checkpoint at seq (\\d+): the chain ends at seq ${last.seq - 2}`).exec(
        shorter.summary,
      );
      assert.ok(beyond && Number(beyond[1]) > last.seq - 2, shorter.summary);
    });
  });

  describe(`checkpoints by another key on ${kind}`, () => {
    let server: TestServer;

    before(async () => {
      server = await startTestServer(kind, QUIET);
      await append(server, 5);
      await server.services.checkpoints.checkpoint();
    });
    after(async () => server?.stop());

    it('checks the checkpoints with the key given (--pubkey), else the one the cluster recorded', async () => {
      assert.equal((await server.services.auditReader.verify()).ok, true);
      const other = foreignSigner(server.db.dataDir);
      const report = await verifyDatabase(server.sql, [other.public_key]);
      assert.equal(report.ok, false);
      assert.match(report.summary, new RegExp(`not the log's key ${other.key_id}`));
      const pubkey = path.join(server.db.dataDir, 'other-public.pem');
      fs.writeFileSync(pubkey, other.public_key);
      const cli = await runCli(['audit', 'verify', '--db', '--pubkey', pubkey], server.env);
      assert.equal(cli.code, 1, cli.stdout + cli.stderr);
    });

    it('fails a stored checkpoint signed by a foreign key', async () => {
      const foreign = foreignSigner(server.db.dataDir);
      await append(server, 1);
      await signHeadWith(server.sql, foreign, server.services.checkpoints.origin);
      const report = await server.services.auditReader.verify();
      assert.equal(report.ok, false);
      const h = await head(server.sql);
      assert.match(report.summary, new RegExp(`checkpoint at seq ${h.seq}: signed by key ${foreign.key_id}`));
      await asAdmin(server.sql, (trx) => trx('audit_checkpoints').where('key_id', foreign.key_id).delete());
      assert.equal((await server.services.auditReader.verify()).ok, true);
    });

    it('fails a checkpoint row in the chain signed by a foreign key, on --db and offline', async () => {
      const foreign = foreignSigner(server.db.dataDir);
      const origin = server.services.checkpoints.origin;
      let rowSeq = 0;
      await server.sql.transaction(async (trx) => {
        await trx.raw('select pg_advisory_xact_lock(?)', [AUDIT_LOCK_KEY]);
        const h = await head(trx);
        const statement = { origin, seq: h.seq, head_hash: h.hash, ts: new Date().toISOString() };
        const [row] = await server.services.audit.appendIn(trx, {
          kind: 'checkpoint',
          result: 'ok',
          details: {
            checkpoint_seq: h.seq,
            head_hash: h.hash,
            key_id: foreign.key_id,
            origin,
            ts: statement.ts,
            signature: foreign.sign(statement),
          },
        });
        rowSeq = row!.seq;
      });
      const report = await server.services.auditReader.verify();
      assert.equal(report.ok, false);
      assert.equal(report.chain.first_bad?.seq, rowSeq);
      assert.match(report.chain.first_bad?.detail ?? '', new RegExp(`names key ${foreign.key_id}`));
      const cli = await runCli(['audit', 'verify', '--db'], server.env);
      assert.equal(cli.code, 1, cli.stdout + cli.stderr);
      assert.match(cli.stdout, new RegExp(`first bad \\(seq ${rowSeq}\\)`));

      // The server will not sign over it; an administrator holding the key makes the export go ahead.
      await assert.rejects(exportTo(server, 'foreign-refused.jsonl'), (err) => isAppError(err, 'TAMPERED'));
      await signHeadWith(server.sql, server.services.checkpoints.signer, origin);
      const { file, manifest } = await exportTo(server, 'foreign.jsonl');
      const offline = await verifyExport(file, manifest);
      assert.equal(offline.ok, false);
      assert.equal(offline.first_bad?.seq, rowSeq);
    });
  });

  describe(`checkpoint cadence on ${kind}`, () => {
    let testDb: TestDatabase;
    let db: Database;
    let deps: CheckpointDeps;

    before(async () => {
      ({ testDb, db } = await openMigratedDatabase(kind));
      const audit = createAuditLog(db.knex);
      deps = { knex: db.knex, audit, signer: loadSigner(testDb.dataDir), origin: 'countersign:cadence' };
    });
    after(async () => {
      await db?.close();
      await testDb?.drop();
    });

    const appendN = async (n: number) => {
      for (let i = 0; i < n; i++) await deps.audit.append({ kind: 'tool.call', result: 'ok' });
    };

    it('signs when enough rows follow the last checkpoint, or a row is old enough, and not while idle', async () => {
      const cadence = { interval_s: 60, rows: 20 };
      const tsOf = async (seq: number) =>
        ((await db.knex('audit_events').where({ seq }).first('ts')) as { ts: Date }).ts.getTime();
      assert.equal(await checkpointIfDue(deps, cadence), undefined, 'an empty log');
      await appendN(1);
      const t0 = await tsOf(1);
      assert.equal(await checkpointIfDue(deps, cadence, t0 + 59_000), undefined, '1 row, 59 s old');
      const first = await checkpointIfDue(deps, cadence, t0 + 60_000);
      assert.equal(first?.seq, 1, '1 row, 60 s old');

      // Rows: the checkpoint's own row (seq 2) is not counted.
      await appendN(19);
      assert.equal(await checkpointIfDue(deps, cadence, t0 + 60_000), undefined, '19 rows since');
      await appendN(1);
      const byRows = await checkpointIfDue(deps, cadence, t0 + 60_000);
      assert.equal(byRows?.seq, 22, '20 rows since');

      // Its own row follows it: never a reason for another, however long the log stays idle.
      assert.equal(await checkpointIfDue(deps, cadence, Date.now() + 3_600_000), undefined, 'idle');
      await appendN(1);
      const t1 = await tsOf(24);
      assert.equal(await checkpointIfDue(deps, cadence, t1 + 59_000), undefined, 'a row 59 s old');
      const byTime = await checkpointIfDue(deps, cadence, t1 + 60_000);
      assert.equal(byTime?.seq, 24, 'a row 60 s old');
      assert.equal((await listCheckpoints(db.knex)).length, 3);
    });

    it('verifies a log no server has started on (no key recorded) with the configured key', async () => {
      const nothingRecorded = await verifyDatabase(db.knex);
      assert.equal(nothingRecorded.ok, false);
      const config = loadConfig({ COUNTERSIGN_DATA_DIR: testDb.dataDir }, testDb.dataDir);
      const report = await verifyDatabase(db.knex, [], config);
      assert.equal(report.ok, true, report.summary);
    });

    it('goes on after a key rotation: the new key signs, and the log verifies with both keys given', async () => {
      await appendN(2);
      await createCheckpoint(deps);
      const before = deps.signer;
      const rotated = { ...deps, signer: foreignSigner(testDb.dataDir) };
      await appendN(2);
      const signed = await createCheckpoint(rotated);
      assert.equal(signed?.key_id, rotated.signer.key_id);
      assert.equal((await verifyDatabase(db.knex, [before.public_key, rotated.signer.public_key])).ok, true);
      const newOnly = await verifyDatabase(db.knex, [rotated.signer.public_key]);
      assert.equal(newOnly.ok, false);
      assert.match(newOnly.summary, new RegExp(`names key ${before.key_id}`));
    });

    it('defaults to 60 s and 1000 rows, and takes both from the environment', () => {
      const defaults = loadConfig({}, testDb.dataDir).audit;
      assert.equal(defaults.checkpoint_interval_s, 60);
      assert.equal(defaults.checkpoint_rows, 1000);
      const set = loadConfig(
        { COUNTERSIGN_CHECKPOINT_INTERVAL_S: '5', COUNTERSIGN_CHECKPOINT_ROWS: '20' },
        testDb.dataDir,
      ).audit;
      assert.equal(set.checkpoint_interval_s, 5);
      assert.equal(set.checkpoint_rows, 20);
    });
  });

  describe(`the server's checkpoint timer on ${kind}`, () => {
    const quietFor = (ms: number) => new Promise((r) => setTimeout(r, ms));

    it('signs after checkpoint_rows rows, then stays quiet while idle', async () => {
      const server = await startTestServer(kind, {
        COUNTERSIGN_CHECKPOINT_INTERVAL_S: '3600',
        COUNTERSIGN_CHECKPOINT_ROWS: '20',
      });
      try {
        const knex = server.sql;
        await append(server, 25);
        const next = await waitFor('a checkpoint after 20 rows', () => latestCheckpoint(knex));
        assert.ok(next.seq >= 20);
        const count = (await listCheckpoints(knex)).length;
        await quietFor(2500);
        assert.equal((await listCheckpoints(knex)).length, count, 'no checkpoint while idle');
      } finally {
        await server.stop();
      }
    });

    it('signs after checkpoint_interval_s while rows are written, then stays quiet while idle', async () => {
      const server = await startTestServer(kind, {
        COUNTERSIGN_CHECKPOINT_INTERVAL_S: '1',
        COUNTERSIGN_CHECKPOINT_ROWS: '100000',
      });
      try {
        const knex = server.sql;
        const row = await server.services.audit.append({ kind: 'tool.call', result: 'ok' });
        const covering = await waitFor('a checkpoint covering the new row', async () => {
          const cp = await latestCheckpoint(knex);
          return cp && cp.seq >= row.seq ? cp : undefined;
        });
        assert.ok(covering.seq >= row.seq);
        const count = (await listCheckpoints(knex)).length;
        await quietFor(2500);
        assert.equal((await listCheckpoints(knex)).length, count, 'no checkpoint while idle');
      } finally {
        await server.stop();
      }
    });
  });
}
