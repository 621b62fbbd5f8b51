import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client } from '@modelcontextprotocol/client';
import { importData } from '../../src/connectors/local/import.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

const pagers = Array.from({ length: 45 }, (_, i) => ({
  id: `ct_pager_${String(i).padStart(2, '0')}`,
  display_name: `Pager ${String(i).padStart(2, '0')}`,
  department: 'Paging',
}));

for (const kind of databaseKinds()) {
  describe(`read tools on ${kind}`, () => {
    let server: TestServer;
    let client: Client;

    before(async () => {
      server = await startTestServer(kind);
      await importData(server.sql, server.services.blobs, { contacts: pagers });
      client = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await client?.close();
      await server?.stop();
    });

    describe('isphere_search_contacts', () => {
      it('finds a contact by Latin, Hebrew and Chinese text', async () => {
        const latin = await call(client, 'isphere_search_contacts', { query: 'élodie' });
        assert.deepEqual(
          latin.contacts.map((c: { contact_id: string }) => c.contact_id),
          ['ct_elodie'],
        );
        const hebrew = await call(client, 'isphere_search_contacts', { query: 'לוי' });
        assert.equal(hebrew.contacts[0].display_name, 'דוד לוי');
        const chinese = await call(client, 'isphere_search_contacts', { query: '王伟' });
        assert.equal(chinese.contacts[0].contact_id, 'ct_wang');
        assert.equal(chinese.contacts[0].confidence, 1);
        assert.equal(chinese.contacts[0].source, 'local');
        assert.equal(chinese.status, 'ok');
      });

      it('matches department and title too, and ranks exact names first', async () => {
        const byDept = await call(client, 'isphere_search_contacts', { query: '研发部' });
        assert.deepEqual(byDept.contacts.map((c: { contact_id: string }) => c.contact_id).sort(), [
          'ct_wang',
          'ct_zhang',
        ]);
        const ranked = await call(client, 'isphere_search_contacts', { query: 'martin' });
        assert.equal(ranked.contacts[0].contact_id, 'ct_alice');
      });

      it('hides inactive contacts unless asked', async () => {
        const active = await call(client, 'isphere_search_contacts', { query: '陈静' });
        assert.equal(active.status, 'empty');
        assert.equal(active.ok, true);
        assert.deepEqual(active.contacts, []);
        const all = await call(client, 'isphere_search_contacts', { query: '陈静', include_inactive: true });
        assert.equal(all.contacts[0].active, false);
      });

      it('answers status empty when nothing matches', async () => {
        const res = await call(client, 'isphere_search_contacts', { query: 'no such person zz' });
        assert.equal(res.ok, true);
        assert.equal(res.status, 'empty');
        assert.equal(res.next_cursor, null);
        assert.equal(res.error, undefined);
      });

      it('pages through every result exactly once with cursors', async () => {
        const seen: string[] = [];
        let cursor: string | undefined;
        let pages = 0;
        do {
          const res = await call(client, 'isphere_search_contacts', {
            query: 'pager',
            limit: 7,
            ...(cursor ? { cursor } : {}),
          });
          seen.push(...res.contacts.map((c: { contact_id: string }) => c.contact_id));
          cursor = res.next_cursor ?? undefined;
          pages++;
        } while (cursor);
        assert.equal(pages, 7);
        assert.equal(seen.length, 45);
        assert.equal(new Set(seen).size, 45);
        assert.deepEqual([...seen].sort(), pagers.map((p) => p.id).sort());
      });

      it('clamps a limit above the maximum to the maximum', async () => {
        const res = await call(client, 'isphere_search_contacts', { query: 'pager', limit: 1000 });
        assert.equal(res.ok, true);
        assert.equal(res.contacts.length, 45); // all of them, at most 100
        const groups = await call(client, 'isphere_search_groups', { query: 'a', limit: 5000 });
        assert.equal(groups.ok, true);
      });

      it('refuses a tampered cursor', async () => {
        const first = await call(client, 'isphere_search_contacts', { query: 'pager', limit: 5 });
        const cursor: string = first.next_cursor;
        const [body, mac] = cursor.split('.');
        const forged = Buffer.from(
          JSON.stringify({
            ...JSON.parse(Buffer.from(body!, 'base64url').toString()),
            p: { r: 0, n: 'Pager 40', id: 'x' },
          }),
        ).toString('base64url');
        for (const bad of [`${forged}.${mac}`, `${body}.${mac!.slice(0, -2)}xx`, 'garbage', `${body}`]) {
          const res = await call(client, 'isphere_search_contacts', { query: 'pager', cursor: bad });
          assert.equal(res.ok, false);
          assert.equal(res.error.code, 'INVALID_ARGUMENT');
        }
      });

      it('refuses a cursor replayed against another query', async () => {
        const first = await call(client, 'isphere_search_contacts', { query: 'pager', limit: 5 });
        const res = await call(client, 'isphere_search_contacts', {
          query: 'pag',
          cursor: first.next_cursor,
        });
        assert.equal(res.error.code, 'INVALID_ARGUMENT');
        assert.equal(res.error.reason, 'cursor_other_query');
      });

      it('refuses missing, blank, wrong-typed and unknown parameters', async () => {
        const cases: Record<string, unknown>[] = [
          {},
          { query: '   ' },
          { query: 42 },
          { query: 'a', limit: '20' },
          { query: 'a', limit: 0 },
          { query: 'a', limit: 2.5 },
          { query: 'a', include_inactive: 'yes' },
          { query: 'a', source_preference: 'carrier-pigeon' },
          { query: 'a', dryrun: true },
          { query: 'a\u0000b' },
        ];
        for (const args of cases) {
          const res = await call(client, 'isphere_search_contacts', args);
          assert.equal(res.ok, false, JSON.stringify(args));
          assert.equal(res.status, 'error');
          assert.equal(res.error.code, 'INVALID_ARGUMENT', JSON.stringify(args));
          assert.match(res.error.trace_id, /^[0-9a-f]{32}$/);
          assert.equal(res.audit.result, 'error');
          assert.ok(res.audit.audit_seq > 0);
        }
      });

      it('answers SOURCE_UNAVAILABLE for a source that is not configured', async () => {
        const res = await call(client, 'isphere_search_contacts', {
          query: 'a',
          source_preference: 'bridge',
        });
        assert.equal(res.error.code, 'SOURCE_UNAVAILABLE');
        const local = await call(client, 'isphere_search_contacts', {
          query: 'alice',
          source_preference: 'local',
        });
        assert.equal(local.ok, true);
      });
    });

    describe('isphere_search_groups', () => {
      it('finds groups in every script, with member counts, archived only on request', async () => {
        const hebrew = await call(client, 'isphere_search_groups', { query: 'כספים' });
        assert.equal(hebrew.groups[0].group_id, 'gr_finance');
        assert.equal(hebrew.groups[0].member_count, 3);
        assert.equal(hebrew.groups[0].owner_ref, 'local:contact:ct_david');
        const chinese = await call(client, 'isphere_search_groups', { query: '项目组' });
        assert.equal(chinese.groups[0].group_id, 'gr_alpha');
        const archived = await call(client, 'isphere_search_groups', { query: 'offsite' });
        assert.equal(archived.status, 'empty');
        const withArchived = await call(client, 'isphere_search_groups', {
          query: 'offsite',
          include_archived: true,
        });
        assert.equal(withArchived.groups[0].archived, true);
      });

      it('lists every group by name when no query is given, a page at a time', async () => {
        const all = await call(client, 'isphere_search_groups', {});
        assert.equal(all.ok, true);
        const names = all.groups.map((g: { display_name: string }) => g.display_name);
        assert.ok(names.length >= 2, `${names.length} groups`);
        assert.ok(
          !all.groups.some((g: { archived: boolean }) => g.archived),
          'archived ones only on request',
        );
        const first = await call(client, 'isphere_search_groups', { limit: 1 });
        assert.equal(first.groups[0].group_id, all.groups[0].group_id);
        const second = await call(client, 'isphere_search_groups', { limit: 1, cursor: first.next_cursor });
        assert.equal(second.groups[0].group_id, all.groups[1].group_id);
        const blank = await call(client, 'isphere_search_groups', { query: '   ' });
        assert.equal(blank.error.code, 'INVALID_ARGUMENT', 'a blank query is still refused: leave it out');
      });
    });

    describe('isphere_receive_messages', () => {
      it('reads a conversation by id, newest first, with attachment metadata', async () => {
        const res = await call(client, 'isphere_receive_messages', { conversation_id: 'cv_alice' });
        assert.equal(res.conversation.display_name, 'Alice Martin');
        assert.deepEqual(
          res.messages.map((m: { message_id: string }) => m.message_id),
          ['ms_002', 'ms_001'],
        );
        assert.equal(res.messages[0].attachments[0].file_name, 'board-minutes.txt');
        assert.equal(
          res.messages[1].content_text,
          'Can you draft the reply to the auditors?\nDeadline is Friday.',
        );
        assert.equal(res.audit.target_ref, 'cv_alice');
      });

      it('reads a conversation by its name, in Hebrew, and keeps text exact', async () => {
        const res = await call(client, 'isphere_receive_messages', { query: 'דוד לוי' });
        assert.equal(res.conversation.conversation_id, 'cv_david');
        assert.equal(res.messages[0].content_text, 'תודה רבה 🙏');
      });

      it('searches message text by keyword across conversations', async () => {
        const res = await call(client, 'isphere_receive_messages', { query: 'budget review' });
        assert.equal(res.conversation, null);
        assert.deepEqual(res.messages.map((m: { message_id: string }) => m.message_id).sort(), [
          'ms_007',
          'ms_008',
        ]);
      });

      it('filters by since and pages with cursors', async () => {
        const since = await call(client, 'isphere_receive_messages', {
          conversation_id: 'cv_alpha',
          since: '2026-11-27T03:10:00Z',
        });
        assert.deepEqual(
          since.messages.map((m: { message_id: string }) => m.message_id),
          ['ms_011'],
        );
        const first = await call(client, 'isphere_receive_messages', {
          conversation_id: 'cv_alpha',
          limit: 1,
        });
        const second = await call(client, 'isphere_receive_messages', {
          conversation_id: 'cv_alpha',
          limit: 1,
          cursor: first.next_cursor,
        });
        assert.equal(first.messages[0].message_id, 'ms_011');
        assert.equal(second.messages[0].message_id, 'ms_010');
        assert.equal(second.next_cursor, null);
      });

      it('returns the plan without bodies on dry_run', async () => {
        const res = await call(client, 'isphere_receive_messages', {
          conversation_id: 'cv_wang',
          dry_run: true,
        });
        assert.deepEqual(res.messages, []);
        assert.equal(res.plan.conversation_id, 'cv_wang');
        assert.equal(res.audit.dry_run, true);
        assert.ok(!JSON.stringify(res).includes('预算表'));
      });

      it('refuses an unknown conversation and a call with neither id nor query', async () => {
        const missing = await call(client, 'isphere_receive_messages', { conversation_id: 'cv_nope' });
        assert.equal(missing.error.code, 'TARGET_NOT_FOUND');
        const neither = await call(client, 'isphere_receive_messages', {});
        assert.equal(neither.error.code, 'INVALID_ARGUMENT');
        const badSince = await call(client, 'isphere_receive_messages', {
          conversation_id: 'cv_alice',
          since: 'yesterday',
        });
        assert.equal(badSince.error.code, 'INVALID_ARGUMENT');
      });
    });

    describe('isphere_receive_files', () => {
      it('lists files of a conversation with their sha256', async () => {
        const res = await call(client, 'isphere_receive_files', { conversation_id: 'cv_wang' });
        assert.equal(res.mode, 'list');
        assert.equal(res.files[0].file_name, '预算.csv');
        assert.match(res.files[0].sha256, /^[0-9a-f]{64}$/);
        assert.equal(res.files[0].saved_path, null);
      });

      it('plans a download by default (dry run) and writes nothing', async () => {
        const res = await call(client, 'isphere_receive_files', {
          mode: 'download',
          file_id: 'fl_budget',
          output_dir: 'plan-only',
        });
        assert.equal(res.audit.dry_run, true);
        const dir = path.join(server.services.config.files.download_dir, 'plan-only');
        assert.equal(
          res.files[0].saved_path,
          path.join(fs.realpathSync(server.services.config.files.download_dir), 'plan-only', '预算.csv'),
        );
        assert.equal(fs.existsSync(dir), false);
      });

      it('downloads into the download directory and reports the sha256 of the saved bytes', async () => {
        const res = await call(client, 'isphere_receive_files', {
          mode: 'download',
          file_id: 'fl_minutes',
          output_dir: 'inbox',
          dry_run: false,
        });
        assert.equal(res.ok, true);
        const saved = fs.readFileSync(res.files[0].saved_path);
        assert.match(saved.toString(), /Budget approved/);
        const { createHash } = await import('node:crypto');
        assert.equal(res.files[0].sha256, createHash('sha256').update(saved).digest('hex'));
        const again = await call(client, 'isphere_receive_files', {
          mode: 'download',
          file_id: 'fl_minutes',
          output_dir: 'inbox',
          dry_run: false,
        });
        assert.notEqual(again.files[0].saved_path, res.files[0].saved_path, 'never overwrites');
      });

      it('never opens a path written into a file row by SQL in place of its SHA-256', async () => {
        const knex = server.sql;
        const row = await knex('files').where({ id: 'fl_budget' }).first();
        await knex('files').insert({ ...row, id: 'fl_pointed', sha256: '../../audit-signing-key.pem' });
        const res = await call(client, 'isphere_receive_files', {
          mode: 'download',
          file_id: 'fl_pointed',
          output_dir: 'pointed',
          dry_run: false,
        });
        assert.equal(res.error?.code, 'CONNECTOR_FAILED');
        assert.equal(res.error.reason, 'blob_name_invalid');
        const dir = path.join(server.services.config.files.download_dir, 'pointed');
        for (const name of fs.existsSync(dir) ? fs.readdirSync(dir) : [])
          assert.doesNotMatch(fs.readFileSync(path.join(dir, name), 'utf8'), /PRIVATE KEY/);
        await knex('files').where({ id: 'fl_pointed' }).delete();
      });

      it('refuses output_dir escapes by .., absolute path and symlink', async () => {
        const root = server.services.config.files.download_dir;
        fs.mkdirSync(root, { recursive: true });
        const outside = fs.mkdtempSync(path.join(server.db.dataDir, 'outside-'));
        fs.symlinkSync(outside, path.join(root, 'sneaky'));
        for (const output_dir of ['../escape', '/tmp', 'sneaky', 'sneaky/deeper', 'a/../../escape']) {
          for (const dry_run of [true, false]) {
            const res = await call(client, 'isphere_receive_files', {
              mode: 'download',
              file_id: 'fl_minutes',
              output_dir,
              dry_run,
            });
            assert.equal(res.error?.code, 'PERMISSION_DENIED', output_dir);
          }
        }
        assert.deepEqual(fs.readdirSync(outside), []);
      });

      it('needs output_dir for download, and answers TARGET_NOT_FOUND for an unknown file', async () => {
        const noDir = await call(client, 'isphere_receive_files', {
          mode: 'download',
          file_id: 'fl_minutes',
        });
        assert.equal(noDir.error.code, 'INVALID_ARGUMENT');
        const unknown = await call(client, 'isphere_receive_files', { file_id: 'fl_nope' });
        assert.equal(unknown.error.code, 'TARGET_NOT_FOUND');
      });
    });

    describe('protocol errors', () => {
      it('answers -32602 for an unknown tool', async () => {
        await assert.rejects(
          client.callTool({ name: 'isphere_launch_missiles', arguments: {} }),
          (err: unknown) => {
            assert.ok(err instanceof ProtocolError);
            assert.equal(err.code, -32602);
            return true;
          },
        );
      });

      it('answers -32601 for an unsupported method', async () => {
        // Asked directly: the v2 client's listResources() answers [] itself when no capability is offered.
        await assert.rejects(client.request({ method: 'resources/list', params: {} }), (err: unknown) => {
          assert.ok(err instanceof ProtocolError);
          assert.equal(err.code, -32601);
          return true;
        });
      });
    });

    describe('audit', () => {
      it('writes exactly one chained row per call, whose seq the response carries', async () => {
        const knex = server.sql;
        const before = Number((await knex('audit_events').max({ m: 'seq' }).first())?.m ?? 0);
        const res = await call(client, 'isphere_search_contacts', { query: 'alice' });
        const bad = await call(client, 'isphere_search_contacts', {});
        const rows = await knex('audit_events').where('seq', '>', before).orderBy('seq');
        assert.equal(rows.length, 2);
        assert.equal(Number(rows[0].seq), res.audit.audit_seq);
        assert.equal(rows[0].kind, 'tool.call');
        assert.equal(rows[0].tool, 'isphere_search_contacts');
        assert.equal(rows[0].result, 'ok');
        assert.equal(rows[1].error_code, 'INVALID_ARGUMENT');
        assert.equal(Number(rows[1].seq), bad.audit.audit_seq);
        assert.ok(!JSON.stringify(rows).includes('alice'), 'no query text in the audit row');
        const report = await verifyDatabaseChain(knex);
        assert.equal(report.first_bad, undefined);
        assert.equal(report.valid, report.rows);
      });

      it('keeps the chain whole under concurrent calls', async () => {
        await Promise.all(
          Array.from({ length: 40 }, (_, i) =>
            call(client, 'isphere_search_contacts', { query: `pager ${i % 10}` }),
          ),
        );
        const report = await verifyDatabaseChain(server.sql);
        assert.equal(report.first_bad, undefined);
        assert.ok(report.rows >= 40);
      });
    });
  });
}
