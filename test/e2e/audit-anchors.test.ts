import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { checkpointPayload } from '../../src/audit/checkpoints.ts';
import type { Manifest } from '../../src/audit/export.ts';
import { chainHash } from '../../src/audit/chain.ts';
import { verifyExport } from '../../src/audit/verify-export.ts';
import { fingerprintOf } from '../../src/audit/pins.ts';
import { loadSigner } from '../../src/audit/signing.ts';
import { pinArgs, runCli } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds } from '../helpers/db.ts';
import { startTestServer, testEnv, type TestServer } from '../helpers/server.ts';
import { loadConfig } from '../../src/config.ts';
import { createLogger } from '../../src/log.ts';
import { startHttpServer } from '../../src/app/serve-http.ts';
import { isAppError } from '../../src/core/errors.ts';
import { appendRows, deleteNewest, rewriteRow } from '../helpers/tamper.ts';
import { startTestTsa, type TestTsa } from '../helpers/tsa.ts';

type Line = Record<string, unknown> & { seq: number; prev_hash: string; hash: string };

const readLines = (file: string) =>
  fs
    .readFileSync(file, 'utf8')
    .trimEnd()
    .split('\n')
    .map((l) => JSON.parse(l) as Line);

describe('anchors off the box', () => {
  let tsa: TestTsa;
  let root: string;
  before(async () => {
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-anchors-'));
    tsa = await startTestTsa(path.join(root, 'tsa'));
  });
  after(async () => {
    await tsa?.close();
    fs.rmSync(root, { recursive: true, force: true });
  });

  it('refuses to start with anchors it cannot use, naming the setting', async () => {
    const db = await createTestDatabase('pglite');
    try {
      const missing = path.join(root, 'no-such-witness');
      for (const [env, key] of [
        [{ COUNTERSIGN_WITNESS_DIR: missing }, 'audit.anchors.witness_dir'],
        [
          { COUNTERSIGN_TSA_URL: tsa.url, COUNTERSIGN_TSA_CERT: path.join(root, 'no-such.pem') },
          'audit.anchors.tsa_cert_path',
        ],
      ] as const) {
        const config = loadConfig(testEnv(db, env), db.dataDir);
        await assert.rejects(startHttpServer(config, createLogger('silent')), (err: unknown) => {
          assert.ok(isAppError(err, 'CONFIG_INVALID'));
          assert.ok((err as Error).message.startsWith(key));
          return true;
        });
      }
      assert.throws(
        () => loadConfig(testEnv(db, { COUNTERSIGN_TSA_URL: 'ftp://127.0.0.1/tsa' }), db.dataDir),
        /tsa_url/,
      );
    } finally {
      await db.drop();
    }
  });

  it('signs the checkpoint but leaves it unanchored when the authority is unreachable or its reply is not signed under the certificate', async () => {
    const other = await startTestTsa(path.join(root, 'other-at-signing'));
    await other.close();
    const settings: Record<string, string>[] = [
      { COUNTERSIGN_TSA_URL: 'http://127.0.0.1:9/tsa' },
      { COUNTERSIGN_TSA_URL: tsa.url, COUNTERSIGN_TSA_CERT: other.caCert },
    ];
    for (const env of settings) {
      const server = await startTestServer('pglite', env);
      try {
        await appendRows(server.services.audit, 3);
        const checkpoint = await server.services.checkpoints.checkpoint();
        assert.ok(checkpoint);
        assert.equal((await server.sql('audit_anchors')).length, 0);
      } finally {
        await server.stop();
      }
    }
  });

  for (const kind of databaseKinds()) {
    describe(`on ${kind}`, () => {
      let server: TestServer;
      let witness: string;
      let exported: { file: string; manifest: Manifest };
      const verify = (args: string[]) =>
        runCli(['audit', 'verify', ...args, ...(args[0] === '--db' ? [] : pinArgs(server.env))], server.env);

      before(async () => {
        witness = fs.mkdtempSync(path.join(root, `witness-${kind}-`));
        server = await startTestServer(kind, {
          COUNTERSIGN_TSA_URL: tsa.url,
          COUNTERSIGN_TSA_CERT: tsa.caCert,
          COUNTERSIGN_WITNESS_DIR: witness,
        });
        await appendRows(server.services.audit, 160);
      });
      after(async () => {
        await server?.stop();
      });

      it('time-stamps each checkpoint, writes it to the witness directory, and an export carries the anchors', async () => {
        const asked = tsa.requests();
        const checkpoint = (await server.services.checkpoints.checkpoint())!;
        assert.equal(tsa.requests(), asked + 1);
        const stored = await server.sql('audit_anchors').where({ seq: checkpoint.seq });
        assert.equal(stored.length, 1);
        assert.equal(stored[0].head_hash, checkpoint.head_hash);
        const names = fs.readdirSync(witness);
        assert.ok(
          names.some(
            (n) => n.endsWith('.checkpoint.json') && n.startsWith(String(checkpoint.seq).padStart(20, '0')),
          ),
        );
        assert.ok(names.some((n) => n.endsWith('.tsa.json')));

        await appendRows(server.services.audit, 5);
        const file = path.join(server.db.dataDir, 'good.jsonl');
        const result = await server.services.checkpoints.exportToFile({
          format: 'jsonl',
          filter: {},
          path: file,
          actor: 'test',
        });
        exported = { file, manifest: result.manifest };
        assert.equal(result.anchors_path, `${file}.anchors.jsonl`);
        const carried = readLines(result.anchors_path).map(
          (a) => (a as unknown as { checkpoint: { seq: number } }).checkpoint.seq,
        );
        assert.deepEqual(carried, [checkpoint.seq, result.manifest.checkpoint.seq]);
      });

      it('verifies a good chain with its anchors, offline and live', async () => {
        const offline = await verify([exported.file, '--tsa-cert', tsa.caCert, '--witness', witness]);
        assert.equal(offline.code, 0, offline.stdout + offline.stderr);
        assert.match(offline.stdout, /anchors: \d+ anchored heads match the chain; valid/);
        const byTsaCert = await verify([exported.file, '--tsa-cert', tsa.tsaCert]);
        assert.equal(byTsaCert.code, 0, byTsaCert.stdout + byTsaCert.stderr);
        const live = await verify(['--db', '--tsa-cert', tsa.caCert, '--witness', witness]);
        assert.equal(live.code, 0, live.stdout + live.stderr);
      });

      it('refuses tokens of another authority', async () => {
        const other = await startTestTsa(path.join(root, `other-${kind}`));
        await other.close();
        const result = await verify([exported.file, '--tsa-cert', other.caCert]);
        assert.equal(result.code, 1);
        assert.match(result.stdout, /bad_token: .*untrusted/);
      });

      /** What a holder of the signing key could forge: the export's rows changed, re-chained and re-signed. */
      function forge(
        name: string,
        change: (lines: Line[]) => Line[],
        signer = server.services.checkpoints.signer,
      ) {
        const lines = change(readLines(exported.file));
        let prev = lines[0]!.prev_hash;
        for (const line of lines) {
          // The chain's own checkpoint rows, re-signed over the forged head before each: the key holder can.
          const details = line.details as Record<string, unknown> | undefined;
          if (line.kind === 'checkpoint' && typeof details?.signature === 'string') {
            details.head_hash = prev;
            details.key_id = signer.key_id;
            details.signature = signer.sign(
              checkpointPayload({
                origin: details.origin as string,
                seq: details.checkpoint_seq as number,
                head_hash: prev,
                ts: details.ts as string,
              }),
            );
          }
          const { prev_hash: _p, hash: _h, ...body } = line;
          line.prev_hash = prev;
          line.hash = chainHash(prev, body as never);
          prev = line.hash;
        }
        const last = lines.at(-1)!;
        const statement = {
          ...checkpointPayload(exported.manifest.checkpoint),
          seq: last.seq,
          head_hash: last.hash,
          ts: new Date().toISOString(),
        };
        const checkpoint = {
          ...exported.manifest.checkpoint,
          ...statement,
          key_id: signer.key_id,
          public_key: signer.public_key,
          signature: signer.sign(checkpointPayload(statement)),
        };
        const lastCheckpointRow = lines.filter((l) => l.kind === 'checkpoint').at(-1);
        const rowsSha = createHash('sha256');
        for (const line of lines) rowsSha.update(`${line.hash}\n`);
        const { signature: _s, ...unsigned } = {
          ...exported.manifest,
          file: `${name}.jsonl`,
          row_count: lines.length,
          last_seq: last.seq,
          last_hash: last.hash,
          rows_sha256: rowsSha.digest('hex'),
          file_sha256: undefined,
          checkpoint,
          key_id: signer.key_id,
          public_key: signer.public_key,
          chain_checkpoint: lastCheckpointRow
            ? {
                seq: lastCheckpointRow.seq,
                prev_hash: lastCheckpointRow.prev_hash,
                details: lastCheckpointRow.details as Record<string, unknown>,
              }
            : null,
        };
        const manifest = { ...unsigned, signature: signer.sign(unsigned) } as Manifest;
        const file = path.join(server.db.dataDir, `${name}.jsonl`);
        // Each line as the exporter writes it: the hashed fields in canonical order, then the two links.
        fs.writeFileSync(
          file,
          lines
            .map(({ prev_hash, hash, ...body }) => {
              const sorted = Object.fromEntries(Object.entries(body).sort(([a], [b]) => (a < b ? -1 : 1)));
              return JSON.stringify({ ...sorted, prev_hash, hash });
            })
            .join('\n') + '\n',
        );
        fs.writeFileSync(`${file}.manifest.json`, JSON.stringify(manifest));
        fs.copyFileSync(`${exported.file}.anchors.jsonl`, `${file}.anchors.jsonl`);
        return { file, manifest };
      }

      it('takes an export re-signed with a fresh key as integrity only without a pin, and refuses it pinned', async () => {
        const fresh = loadSigner(fs.mkdtempSync(path.join(root, 'fresh-key-')));
        const forged = forge(
          'fresh-key',
          (lines) => {
            lines.find((l) => l.seq === 100)!.details = { i: 'rewritten' };
            return lines;
          },
          fresh,
        );
        const plain = (...args: string[]) => runCli(['audit', 'verify', ...args], server.env);
        const unpinned = await plain(forged.file);
        assert.equal(unpinned.code, 1, unpinned.stdout + unpinned.stderr);
        assert.match(unpinned.stdout, /rows valid; manifest signature valid; checkpoint signature valid/);
        assert.match(unpinned.stdout, /^integrity only: /m);
        assert.ok(unpinned.stdout.includes(`sha256:${fingerprintOf(fresh.public_key)}`), unpinned.stdout);
        assert.equal((await plain(forged.file, '--accept-unpinned-key')).code, 0);
        const anchored = await plain(forged.file, '--require-anchored', '--accept-unpinned-key');
        assert.notEqual(anchored.code, 0);
        assert.match(anchored.stderr, /--require-anchored: pin the signing key/);

        const real = server.services.checkpoints.signer.public_key;
        const pinned = await verify([forged.file]);
        assert.equal(pinned.code, 1, pinned.stdout);
        assert.match(pinned.stdout, /manifest signature unknown key/);
        assert.match(pinned.stdout, /which is not pinned$/m);
        const byFingerprint = await plain(forged.file, '--fingerprint', fingerprintOf(real));
        assert.equal(byFingerprint.code, 1, byFingerprint.stdout);
        assert.match(byFingerprint.stdout, /which is not pinned$/m);

        // The real export passes by each kind of pin: a fingerprint, a trust file.
        const trust = path.join(root, 'trusted-keys');
        fs.writeFileSync(trust, `# the server's audit key\n${real}\nsha256:${'ab'.repeat(32)}\n`);
        for (const pin of [
          ['--fingerprint', `sha256:${fingerprintOf(real)}`],
          ['--trust', trust],
        ]) {
          const good = await plain(exported.file, ...pin);
          assert.equal(good.code, 0, good.stdout + good.stderr);
          assert.match(good.stdout, /^origin: signed by pinned key sha256:[0-9a-f]{64}$/m);
          assert.equal((await plain(forged.file, ...pin)).code, 1);
        }
        const printed = await runCli(['audit', 'key', '--fingerprint'], server.env);
        assert.equal(printed.stdout.trim(), `sha256:${fingerprintOf(real)}`);
      });

      it('detects a rewritten past in an export signed with the right key, back to the last anchor', async () => {
        const forged = forge('rewritten', (lines) => {
          lines.find((l) => l.seq === 100)!.details = { i: 'rewritten' };
          return lines;
        });
        // Without anchors the forgery passes: the key signed it.
        assert.equal((await verifyExport(forged.file, forged.manifest)).ok, true);
        for (const args of [
          ['--tsa-cert', tsa.caCert],
          ['--witness', witness],
        ]) {
          const result = await verify([forged.file, ...args]);
          assert.equal(result.code, 1, result.stdout);
          assert.match(result.stdout, /differs: .*head anchored at seq \d+ differs/);
        }
      });

      it('detects the deletion of the newest rows in an export signed with the right key', async () => {
        const anchored = (await server.sql('audit_anchors').min({ s: 'seq' }).first()) as {
          s: number;
        };
        const forged = forge('cut', (lines) => lines.filter((l) => l.seq < Number(anchored.s)));
        assert.equal((await verifyExport(forged.file, forged.manifest)).ok, true);
        for (const args of [
          ['--tsa-cert', tsa.caCert],
          ['--witness', witness],
        ]) {
          const result = await verify([forged.file, ...args]);
          assert.equal(result.code, 1, result.stdout);
          assert.match(result.stdout, /deleted: .*rows deleted/);
        }
      });

      it("detects an insider's rewrite of the live table, checkpoints and anchors deleted", async () => {
        await rewriteRow(server.sql, 100, { i: 'rewritten' });
        // The checkpoint rows the chain recorded contradict the re-hashed rows already; the anchors
        // name the same rewrite from outside the database.
        const plain = await verify(['--db']);
        assert.equal(plain.code, 1, plain.stdout);
        for (const args of [
          ['--tsa-cert', tsa.caCert, '--witness', witness],
          ['--witness', witness],
        ]) {
          const result = await verify(['--db', ...args]);
          assert.equal(result.code, 1, result.stdout);
          assert.match(result.stdout, /differs: .*seq \d+/);
        }
        // The server refuses to sign it too, the witness directory holding the head it signed.
        await assert.rejects(server.services.checkpoints.checkpoint(), { code: 'TAMPERED' });
      });

      it("detects an insider's deletion of the newest rows of the live table", async () => {
        await deleteNewest(server.sql, 120);
        const result = await verify(['--db', '--witness', witness, '--tsa-cert', tsa.caCert]);
        assert.equal(result.code, 1, result.stdout);
        assert.match(result.stdout, /deleted: .*but the chain ends at seq 120: rows deleted/);
      });
    });
  }
});
