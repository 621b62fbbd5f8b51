import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import type { Manifest } from '../../src/audit/export.ts';
import { verifyExport } from '../../src/audit/verify-export.ts';
import { createUser } from '../../src/accounts/users.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

for (const kind of databaseKinds()) {
  describe(`the compliance pages on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let auditor: WebClient;
    let chair: WebClient;
    let requestId: string;

    before(async () => {
      server = await startTestServer(kind);
      await createUser(server.sql, {
        name: 'cora',
        roles: ['compliance'],
        password: 'cora password',
      });
      await createUser(server.sql, { name: 'chet', roles: ['chair'], password: 'chet password' });
      agent = await connectHttp(server.url, server.demoToken);
      await call(agent, 'isphere_search_contacts', { query: 'alice' });
      await call(agent, 'isphere_search_contacts', {});
      const draft = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_alice',
        content_text: 'audited',
      });
      requestId = draft.approval.approval_request_id;
      auditor = new WebClient(server.url);
      assert.equal((await auditor.login('cora', 'cora password')).res.status, 303);
      chair = new WebClient(server.url);
      await chair.login('chet', 'chet password');
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    it('lists the log newest first with filters, and shows a row in full', async () => {
      const page = await auditor.get('/audit');
      assert.equal(page.res.status, 200);
      assert.match(page.html, /Head at seq <strong>\d+<\/strong>/);
      const errors = await auditor.get('/audit?result=error&kind=tool.call');
      assert.match(errors.html, /\(INVALID_<wbr>ARGUMENT\)/, 'the code, breaking only after its underscore');
      assert.doesNotMatch(errors.html, /data-label="Kind" class="kind">approval\.<wbr>requested/);
      const byApproval = await auditor.get(`/audit?approval=${requestId}`);
      assert.match(byApproval.html, /data-label="Kind" class="kind">approval\.<wbr>requested/);
      const byAgent = await auditor.get('/audit?agent=demo&tool=isphere_send_message');
      assert.match(byAgent.html, /isphere_send_message/);
      const seq = /href="\/audit\/rows\/(\d+)"/.exec(page.html)![1]!;
      const row = await auditor.get(`/audit/rows/${seq}`);
      assert.equal(row.res.status, 200);
      assert.match(row.html, /prev_hash/);
      assert.equal((await auditor.get('/audit/rows/999999')).res.status, 404);
    });

    it('pages by seq', async () => {
      for (let i = 0; i < 55; i++) await call(agent, 'isphere_search_groups', { query: `page ${i}` });
      const first = await auditor.get('/audit');
      const older = /href="(\/audit\?[^"]*before=\d+[^"]*)"/.exec(first.html)![1]!.replace(/&amp;/g, '&');
      const second = await auditor.get(older);
      const seqs = (html: string) =>
        [...html.matchAll(/href="\/audit\/rows\/(\d+)"/g)].map((m) => Number(m[1]));
      assert.equal(seqs(first.html).length, 50);
      assert.ok(Math.max(...seqs(second.html)) < Math.min(...seqs(first.html)));
    });

    it('reports the chain status', async () => {
      const res = await auditor.get('/audit/verify');
      assert.match(res.html, /Valid/);
      assert.match(res.html, /(\d+)\/\1 rows valid/);
    });

    /** Exports from the log page filtered by `filter`, as the form does: the export's id and manifest. */
    async function exportFromPage(format: 'jsonl' | 'csv', filter: Record<string, string>) {
      const page = await auditor.get(`/audit?${new URLSearchParams(filter)}`);
      const res = await auditor.post('/audit/export', {
        _csrf: WebClient.field(page.html, '_csrf'),
        format,
        ...filter,
      });
      assert.equal(res.res.status, 303);
      const exportPage = await auditor.get(res.res.headers.get('location')!);
      assert.match(exportPage.html, /Export ready/);
      const id = /\/audit\/exports\/([0-9a-f-]{36})\/file/.exec(exportPage.html)![1]!;
      const manifest = JSON.parse((await auditor.get(`/audit/exports/${id}/manifest`)).html) as Manifest;
      return { id, manifest };
    }

    it('exports with a signed manifest that verifies offline, and records the export', async () => {
      const { id, manifest } = await exportFromPage('csv', { kind: 'tool.call' });
      const file = await auditor.get(`/audit/exports/${id}/file`);
      assert.match(file.res.headers.get('content-disposition') ?? '', /attachment/);
      const local = path.join(server.db.dataDir, 'web-export.csv');
      fs.writeFileSync(local, file.html);
      const report = await verifyExport(local, manifest);
      assert.equal(report.ok, true, JSON.stringify(report.first_bad));
      assert.equal(manifest.filter.kind, 'tool.call');
      const created = await server.sql('audit_events').where({ kind: 'export.created', actor: 'cora' });
      assert.equal(created.length, 1);
      const noCsrf = await auditor.post('/audit/export', { format: 'jsonl' });
      assert.equal(noCsrf.res.status, 403);
    });

    /** Downloads export `id`'s file, expecting a refusal recorded as audit.tampered with `reason`. */
    async function refusedDownload(id: string, reason: string) {
      const file = await auditor.get(`/audit/exports/${id}/file`);
      assert.equal(file.res.status, 422);
      assert.doesNotMatch(file.html, /PRIVATE KEY/);
      const rows = await server
        .sql('audit_events')
        .where({ kind: 'audit.tampered', actor: 'cora', error_code: 'TAMPERED' });
      const details = rows.map((r) => (typeof r.details === 'string' ? JSON.parse(r.details) : r.details));
      assert.ok(
        details.some((d) => d.reason === reason && d.export_id === id),
        JSON.stringify(details),
      );
    }

    it("never serves a file an export's row was pointed at by SQL, such as the signing key", async () => {
      const { id } = await exportFromPage('jsonl', { kind: 'tool.call' });
      const key = path.join(server.db.dataDir, 'audit-signing-key.pem');
      assert.match(fs.readFileSync(key, 'utf8'), /BEGIN PRIVATE KEY/);
      await server.sql('audit_exports').where({ id }).update({ file_path: key });
      await refusedDownload(id, 'export_path_outside');
    });

    it("refuses an export whose file changed after its manifest was signed, or whose manifest isn't ours", async () => {
      const { id } = await exportFromPage('jsonl', { kind: 'tool.call' });
      const [row] = await server.sql('audit_exports').where({ id });
      fs.appendFileSync(row.file_path, '{"seq":999}\n');
      await refusedDownload(id, 'export_file_changed');

      const second = await exportFromPage('jsonl', { kind: 'tool.call' });
      assert.equal((await auditor.get(`/audit/exports/${second.id}/file`)).res.status, 200);
      // A manifest rewritten by SQL to name another file hash no longer carries the server's signature.
      const forged = { ...second.manifest, file_sha256: '0'.repeat(64) };
      await server
        .sql('audit_exports')
        .where({ id: second.id })
        .update({ manifest: JSON.stringify(forged) });
      await refusedDownload(second.id, 'export_manifest_unsigned');
    });

    it("exports with the log page's target filter, not every row", async () => {
      const { manifest } = await exportFromPage('jsonl', { target: 'ct_nobody_here' });
      assert.deepEqual([manifest.filter.target_ref, manifest.row_count], ['ct_nobody_here', 0]);
    });

    it('keeps chairs out of the audit pages and compliance out of every decision route', async () => {
      assert.equal((await chair.get('/audit')).res.status, 403);
      assert.equal((await chair.get('/audit/verify')).res.status, 403);
      const detail = await auditor.get(`/approvals/${requestId}`);
      assert.doesNotMatch(detail.html, /name="decision"/);
      for (const decision of ['approve', 'reject']) {
        const res = await auditor.post(`/approvals/${requestId}/decision`, {
          decision,
          note: 'nope',
          _csrf: WebClient.field(detail.html, '_csrf'),
        });
        assert.equal(res.res.status, 403);
      }
      const after = await call(agent, 'isphere_get_approval', { approval_request_id: requestId });
      assert.equal(after.approval.status, 'pending');
    });
  });
}
