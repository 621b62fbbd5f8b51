import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, afterEach, describe, it } from 'node:test';
import { createCheckpoint, type CheckpointDeps } from '../../src/audit/checkpoints.ts';
import { exportToFile } from '../../src/audit/export-file.ts';
import { createSignedHeadGuard, SIGNED_HEAD_FILE } from '../../src/audit/signed-head.ts';
import { isAppError } from '../../src/core/errors.ts';
import { databaseKinds } from '../helpers/db.ts';
import { startTestServer, type TestServer, checkpointDepsOf } from '../helpers/server.ts';
import { appendRows, deleteNewest, rewriteRow } from '../helpers/tamper.ts';

const tampered = (reason: string) => (err: unknown) => isAppError(err, 'TAMPERED', reason);

for (const kind of databaseKinds()) {
  describe(`the last signed head, kept outside the database, on ${kind}`, () => {
    const servers: TestServer[] = [];
    const start = async () => {
      const server = await startTestServer(kind);
      servers.push(server);
      return server;
    };
    afterEach(async () => {
      for (const s of servers.splice(0)) await s.stop();
    });
    after(async () => {
      for (const s of servers.splice(0)) await s.stop();
    });
    const signedHead = (server: TestServer) =>
      JSON.parse(fs.readFileSync(path.join(server.db.dataDir, SIGNED_HEAD_FILE), 'utf8')) as {
        seq: number;
        head_hash: string;
      };
    const health = async (server: TestServer) =>
      (await (await fetch(new URL('/healthz', server.url))).json()) as {
        status: string;
        audit_chain: { state: string; reason?: string; seq?: number };
      };

    it('refuses to checkpoint or export a chain rewritten behind its back, says so on /healthz and in the log', async () => {
      const server = await start();
      const deps = checkpointDepsOf(server);
      await appendRows(server.services.audit, 160);
      const signed = (await createCheckpoint(deps))!;
      assert.deepEqual(
        { seq: signedHead(server).seq, head_hash: signedHead(server).head_hash },
        { seq: signed.seq, head_hash: signed.head_hash },
      );
      assert.equal((await health(server)).audit_chain.state, 'ok');

      await rewriteRow(server.sql, 100, { i: 'rewritten' });
      await appendRows(server.services.audit, 1);

      await assert.rejects(createCheckpoint(deps), tampered('head_mismatch'));
      const file = path.join(server.db.dataDir, 'after-rewrite.jsonl');
      await assert.rejects(
        exportToFile(deps, { format: 'jsonl', filter: {}, path: file, actor: 'test' }),
        tampered('head_mismatch'),
      );
      assert.equal(fs.existsSync(file), false, 'nothing of the refused export is left');
      assert.equal(
        await server
          .sql('audit_checkpoints')
          .count({ n: '*' })
          .first()
          .then((r) => Number(r!.n)),
        0,
      );

      const h = await health(server);
      assert.equal(h.status, 'degraded');
      assert.deepEqual(
        [h.audit_chain.state, h.audit_chain.reason, h.audit_chain.seq],
        ['tampered', 'head_mismatch', signed.seq],
      );

      // Recorded once, on the next append that succeeded, however often the signature is refused.
      await assert.rejects(createCheckpoint(deps), tampered('head_mismatch'));
      const rows = await server.sql('audit_events').where({ kind: 'audit.tampered' });
      assert.equal(rows.length, 1);
      assert.equal(rows[0].error_code, 'TAMPERED');
      assert.equal(rows[0].details.reason, 'head_mismatch');
      assert.equal(rows[0].details.seq, signed.seq);
    });

    it('refuses to sign once the newest signed rows are deleted', async () => {
      const server = await start();
      const deps = checkpointDepsOf(server);
      await appendRows(server.services.audit, 150);
      const signed = (await createCheckpoint(deps))!;
      await deleteNewest(server.sql, 120);
      await assert.rejects(createCheckpoint(deps), tampered('rows_deleted'));
      const h = await health(server);
      assert.deepEqual(
        [h.status, h.audit_chain.reason, h.audit_chain.seq],
        ['degraded', 'rows_deleted', signed.seq],
      );
    });

    it('lets a replica that never signed sign a good chain, and one whose head is older check only the rows since', async () => {
      const server = await start();
      await appendRows(server.services.audit, 150);
      const fresh = fs.mkdtempSync(path.join(server.db.dataDir, 'replica-'));
      const replica: CheckpointDeps = {
        ...checkpointDepsOf(server),
        guard: createSignedHeadGuard({ dataDir: fresh, origin: server.services.checkpoints.origin }),
      };
      const first = (await createCheckpoint(replica))!;
      const head = () =>
        JSON.parse(fs.readFileSync(path.join(fresh, SIGNED_HEAD_FILE), 'utf8')) as { seq: number };
      assert.equal(head().seq, first.seq);

      // Its head falls behind while another replica signs; it still signs a chain that extends it.
      await appendRows(server.services.audit, 20);
      await server.services.checkpoints.checkpoint();
      await appendRows(server.services.audit, 5);
      const later = (await createCheckpoint(replica))!;
      assert.ok(later.seq > first.seq);
      assert.equal(head().seq, later.seq);

      // An older head the chain no longer holds is refused even with checkpoints in the table.
      const row = (await server.sql('audit_events').where('seq', 10).first()) as { hash: string };
      fs.writeFileSync(
        path.join(fresh, SIGNED_HEAD_FILE),
        JSON.stringify({
          origin: replica.origin,
          seq: 10,
          head_hash: row.hash.replace(/^./, (c) => (c === '0' ? '1' : '0')),
          ts: later.ts,
        }),
      );
      await appendRows(server.services.audit, 1);
      await assert.rejects(createCheckpoint(replica), tampered('head_mismatch'));

      // A file that holds no head does not disarm the check.
      fs.writeFileSync(path.join(fresh, SIGNED_HEAD_FILE), '{"seq":');
      await assert.rejects(createCheckpoint(replica), tampered('signed_head_invalid'));
    });
  });
}
