import assert from 'node:assert/strict';
import { randomBytes, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import { after, before, describe, it } from 'node:test';
import type { Knex } from 'knex';
import { chainHash, rowFromDb, type AuditRow } from '../../src/audit/chain.ts';
import { createCheckpoint } from '../../src/audit/checkpoints.ts';
import { checkpointDeps, verifyDatabase } from '../../src/audit/context.ts';
import { pinRowMacs, readHostRoots } from '../../src/core/host-roots.ts';
import { isAppError } from '../../src/core/errors.ts';
import { pinArgs, runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';
import { appendRows } from '../helpers/tamper.ts';

/**
 * A row at the tail with a correct hash, as an administrator with SQL and no shell on the host can
 * insert it: `row_mac` null (he has no key), or any value he likes.
 */
async function forgeTail(knex: Knex, rowMac: string | null): Promise<number> {
  const last = rowFromDb(await knex('audit_events').orderBy('seq', 'desc').first());
  const row: AuditRow = {
    ...last,
    seq: last.seq + 1,
    event_id: randomUUID(),
    ts: new Date().toISOString(),
    kind: 'approval.approved',
    actor: 'chair',
    approval_request_id: randomUUID(),
    approval_id: randomUUID(),
    approvers: ['chair'],
    result: 'ok',
    error_code: null,
    details: {},
    prev_hash: last.hash,
    hash: '',
  };
  row.hash = chainHash(row.prev_hash, row);
  await knex('audit_events').insert({
    ...row,
    approvers: JSON.stringify(row.approvers),
    details: JSON.stringify(row.details),
    row_mac: rowMac,
  });
  return row.seq;
}

/** The same administrator blanks the MACs of rows from `seq` on (triggers bypassed). */
async function stripMacs(knex: Knex, seq: number): Promise<void> {
  await knex.transaction(async (trx) => {
    await trx.raw('set local session_replication_role = replica');
    await trx('audit_events').where('seq', '>=', seq).update({ row_mac: null });
  });
}

const firstBad = (report: Awaited<ReturnType<typeof verifyDatabase>>) => [
  report.ok,
  report.chain.first_bad?.fault,
  report.chain.first_bad?.seq,
];

for (const kind of databaseKinds()) {
  describe(`row MACs: rows the server did not append, on ${kind}`, () => {
    let server: TestServer;
    before(async () => {
      server = await startTestServer(kind);
    });
    after(async () => {
      await server?.stop();
    });
    const knex = () => server.sql;
    const config = () => server.services.config;

    it('pins the first row that needs a MAC in the host roots, and every row since carries one', async () => {
      await appendRows(server.services.audit, 5);
      const roots = readHostRoots(config().secrets.host_roots_path)!;
      assert.equal(typeof roots.rowMacsFrom, 'number');
      const rows = await knex()('audit_events').where('seq', '>=', roots.rowMacsFrom!).orderBy('seq');
      assert.ok(rows.length >= 5);
      for (const row of rows)
        assert.equal(roots.verify('row', row.hash, row.row_mac), true, `row ${row.seq}`);
      assert.equal((await verifyDatabase(knex(), [], config())).ok, true);
      assert.ok(await server.services.checkpoints.checkpoint(), 'signs its own rows');
    });

    it('keeps the first pin: a later start does not move it', () => {
      const file = config().secrets.host_roots_path;
      const before = readHostRoots(file)!.rowMacsFrom;
      assert.equal(pinRowMacs(file, 10_000).rowMacsFrom, before);
      assert.equal(readHostRoots(file)!.rowMacsFrom, before);
    });

    it('finds an approval appended at the tail by SQL with a correct hash: row_unsigned', async () => {
      const own = await startTestServer(kind);
      try {
        await appendRows(own.services.audit, 3);
        const forged = await forgeTail(own.sql, null);
        const report = await verifyDatabase(own.sql, [], own.services.config);
        assert.deepEqual(firstBad(report), [false, 'row_unsigned', forged]);
        assert.match(report.summary, /TAMPERED/);
        await assert.rejects(own.services.checkpoints.checkpoint(), (err) =>
          isAppError(err, 'TAMPERED', 'row_unsigned'),
        );
        // A replica started after the forgery (no signed head yet) refuses it too.
        const restarted = await checkpointDeps(own.sql, own.services.audit, own.services.config);
        await assert.rejects(createCheckpoint(restarted), (err) =>
          isAppError(err, 'TAMPERED', 'row_unsigned'),
        );
      } finally {
        await own.stop();
      }
    });

    it('finds a forged row whose MAC was made up, after a signed head: row_mac_mismatch', async () => {
      const own = await startTestServer(kind);
      try {
        await appendRows(own.services.audit, 3);
        assert.ok(await own.services.checkpoints.checkpoint());
        await appendRows(own.services.audit, 2);
        const forged = await forgeTail(own.sql, randomBytes(32).toString('hex'));
        await appendRows(own.services.audit, 2);
        const report = await verifyDatabase(own.sql, [], own.services.config);
        assert.deepEqual(firstBad(report), [false, 'row_mac_mismatch', forged]);
        await assert.rejects(own.services.checkpoints.checkpoint(), (err) =>
          isAppError(err, 'TAMPERED', 'row_mac_mismatch'),
        );
      } finally {
        await own.stop();
      }
    });

    it('finds MACs stripped from rows after the pin (triggers bypassed): row_unsigned', async () => {
      const own = await startTestServer(kind);
      try {
        await appendRows(own.services.audit, 4);
        const from = readHostRoots(own.services.config.secrets.host_roots_path)!.rowMacsFrom!;
        const head = Number((await own.sql('audit_events').max({ m: 'seq' }).first())?.m);
        await stripMacs(own.sql, head - 1);
        assert.ok(head - 1 >= from);
        const report = await verifyDatabase(own.sql, [], own.services.config);
        assert.deepEqual(firstBad(report), [false, 'row_unsigned', head - 1]);
      } finally {
        await own.stop();
      }
    });
  });

  describe(`audit verify --db --require-anchored needs a pinned key, on ${kind}`, () => {
    it("takes the host's key file or a given key as pinned, the database's record of it never", async () => {
      const server = await startTestServer(kind);
      try {
        await appendRows(server.services.audit, 3);
        assert.ok(await server.services.checkpoints.checkpoint());
        const { config } = server.services;
        const knex = server.sql;
        assert.equal((await verifyDatabase(knex, [], config)).key_source, 'host');
        const elsewhere = { ...config, audit: { ...config.audit, signing_key_path: '/nonexistent/key.pem' } };
        const recorded = await verifyDatabase(knex, [], elsewhere);
        assert.deepEqual([recorded.ok, recorded.key_source], [true, 'database']);
        const onHost = await runCli(['audit', 'verify', '--db', '--require-anchored'], server.env);
        assert.equal(onHost.code, 0, onHost.stderr);
        assert.match(onHost.stdout, /host's signing key \(pinned\)/);
        const given = await runCli(
          ['audit', 'verify', '--db', '--require-anchored', ...pinArgs(server.env)],
          server.env,
        );
        assert.equal(given.code, 0, given.stderr);
        if (kind === 'postgres') {
          // A command run away from the host's key file (here: the key's path changed) has only the
          // database's record of the key: not enough to say the chain is anchored.
          const env = { ...server.env, COUNTERSIGN_AUDIT_SIGNING_KEY: '/nonexistent/key.pem' };
          const away = await runCli(['audit', 'verify', '--db', '--require-anchored'], env);
          assert.equal(away.code, 1);
          assert.match(away.stdout, /NOT pinned/);
          assert.equal((await runCli(['audit', 'verify', '--db'], env)).code, 0, 'without the flag: valid');
        }
      } finally {
        await server.stop();
      }
    });
  });

  describe(`row MACs: an install upgraded with rows before them, on ${kind}`, () => {
    it('requires no MAC of the rows before the pin, and one of every row after', async () => {
      const server = await startTestServer(kind);
      try {
        const file = server.services.config.secrets.host_roots_path;
        const text = JSON.parse(fs.readFileSync(file, 'utf8')) as Record<string, unknown>;
        const from = readHostRoots(file)!.rowMacsFrom!;
        // Rows from before the upgrade: the same rows without MACs, the file without its pin.
        await stripMacs(server.sql, 1);
        delete text.row_macs_from;
        fs.writeFileSync(file, JSON.stringify(text));
        assert.equal(readHostRoots(file)!.rowMacsFrom, undefined, 'an older file reads');
        assert.equal((await verifyDatabase(server.sql, [], server.services.config)).ok, true);
        const head = Number((await server.sql('audit_events').max({ m: 'seq' }).first())?.m);
        assert.ok(head >= from);
        // The first start of this version pins the row after the head.
        await checkpointDeps(server.sql, server.services.audit, server.services.config);
        assert.equal(readHostRoots(file)!.rowMacsFrom, head + 1);
        await appendRows(server.services.audit, 2);
        assert.equal((await verifyDatabase(server.sql, [], server.services.config)).ok, true);
        const forged = await forgeTail(server.sql, null);
        const report = await verifyDatabase(server.sql, [], server.services.config);
        assert.deepEqual(firstBad(report), [false, 'row_unsigned', forged]);
      } finally {
        await server.stop();
      }
    });
  });
}
