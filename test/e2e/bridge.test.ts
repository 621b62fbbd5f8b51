import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { startReferenceBridge, type ReferenceBridge } from '../helpers/bridge/reference.ts';
import { BridgeErrorKind, ERROR_CODE } from '../../src/connectors/bridge/wire.ts';
import { createUser } from '../../src/accounts/users.ts';
import { type User } from '../../src/core/identity.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type Envelope, type TestServer } from '../helpers/server.ts';

const sha256 = (bytes: Buffer | string) => createHash('sha256').update(bytes).digest('hex');
const errorOf = (res: Envelope) => [res.ok, res.error?.code, res.error?.reason];

for (const kind of databaseKinds()) {
  describe(`bridge connector on ${kind}`, () => {
    let bridge: ReferenceBridge;
    let server: TestServer;
    let agent: Client;
    let chair: User;
    let outbound: string;

    /** Drafts a write in dry run (nothing reaches the bridge), has the chair approve it, returns the approval_id. */
    async function approved(tool: string, args: Record<string, unknown>): Promise<string> {
      const sentBefore = bridge.sent.length;
      const draft = await call(agent, tool, args);
      assert.equal(draft.ok, true, JSON.stringify(draft.error));
      assert.equal(draft.audit.source, 'bridge');
      assert.equal(bridge.sent.length, sentBefore, 'a dry run sends nothing');
      return approveAsChair({ approvals: server.services.approvals, user: chair }, draft);
    }

    const statusOf = async (approvalId: string) =>
      (await call(agent, 'isphere_get_approval', { approval_id: approvalId })).approval;

    /** Makes an execution look older than the reconciliation cutoff (twice the call deadline). */
    const backdate = (approvalId: string) =>
      server
        .sql('approval_requests')
        .where({ approval_id: approvalId })
        .update({ execution_started_at: new Date(Date.now() - 3_600_000).toISOString() });

    before(async () => {
      bridge = await startReferenceBridge();
      server = await startTestServer(kind, {
        COUNTERSIGN_BRIDGE_URL: bridge.url,
        COUNTERSIGN_BRIDGE_TIMEOUT_MS: '1000',
        COUNTERSIGN_DEFAULT_SOURCE: 'bridge',
      });
      chair = await createUser(server.sql, {
        name: 'chair-bridge',
        roles: ['chair'],
        password: 'correct horse bridge',
      });
      agent = await connectHttp(server.url, server.demoToken);
      outbound = server.services.config.files.outbound_dir;
      fs.mkdirSync(outbound, { recursive: true });
    });
    afterEach(async () => {
      bridge.setFault(null);
      bridge.release();
      await bridge.idle();
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
      await bridge?.close();
    });

    describe('the contract tools against the reference bridge', () => {
      it('searches contacts on the bridge, in any script, paging with its cursor', async () => {
        const first = await call(agent, 'isphere_search_contacts', { query: 'chris lee', limit: 1 });
        assert.equal(first.status, 'ok');
        assert.equal(first.audit.source, 'bridge');
        assert.deepEqual(
          first.contacts.map((c: Envelope) => [c.contact_id, c.source, c.confidence]),
          [['u-chris1', 'bridge', 1]],
        );
        assert.ok(first.next_cursor);
        const second = await call(agent, 'isphere_search_contacts', {
          query: 'chris lee',
          limit: 1,
          cursor: first.next_cursor,
        });
        assert.deepEqual(
          second.contacts.map((c: Envelope) => c.contact_id),
          ['u-chris2'],
        );
        assert.equal(second.next_cursor, null);

        const arabic = await call(agent, 'isphere_search_contacts', { query: 'عمر' });
        assert.deepEqual(
          arabic.contacts.map((c: Envelope) => c.contact_id),
          ['u-omar'],
        );
        const byTitle = await call(agent, 'isphere_search_contacts', { query: 'エンジニア' });
        assert.equal(byTitle.contacts[0].display_name, '佐藤由紀');

        const hidden = await call(agent, 'isphere_search_contacts', { query: 'Léa' });
        assert.equal(hidden.status, 'empty');
        const inactive = await call(agent, 'isphere_search_contacts', {
          query: 'Léa',
          include_inactive: true,
        });
        assert.deepEqual(
          inactive.contacts.map((c: Envelope) => [c.contact_id, c.active]),
          [['u-lea', false]],
        );

        const local = await call(agent, 'isphere_search_contacts', {
          query: 'Alice',
          source_preference: 'local',
        });
        assert.equal(local.contacts[0].source, 'local', 'the local store stays available by name');
      });

      it('searches groups, leaving archived ones out unless asked', async () => {
        const ops = await call(agent, 'isphere_search_groups', { query: 'ops' });
        assert.deepEqual(
          ops.groups.map((g: Envelope) => [g.group_id, g.member_count, g.source]),
          [['g-ops', 2, 'bridge']],
        );
        // Both names start with the query: same rank, then by name.
        const all = await call(agent, 'isphere_search_groups', { query: 'ops', include_archived: true });
        assert.deepEqual(
          all.groups.map((g: Envelope) => g.group_id),
          ['g-old', 'g-ops'],
        );
        const cyrillic = await call(agent, 'isphere_search_groups', { query: 'лекторий' });
        assert.equal(cyrillic.groups[0].group_id, 'g-lectorium');
      });

      it('reads messages by conversation id, by conversation name and by keyword', async () => {
        const ops = await call(agent, 'isphere_receive_messages', { conversation_id: 'c-ops' });
        assert.equal(ops.conversation.display_name, 'Ops Desk');
        assert.deepEqual(
          ops.messages.map((m: Envelope) => m.message_id),
          ['m-3', 'm-2'],
        );
        assert.deepEqual(ops.messages[1].attachments, [
          {
            file_id: 'f-agenda',
            file_name: 'agenda.txt',
            size_bytes: 32,
            download_ref: 'bridge:file:f-agenda',
          },
        ]);

        const named = await call(agent, 'isphere_receive_messages', { query: 'ЛЕКТОРИЙ' });
        assert.equal(named.conversation.conversation_id, 'c-lectorium');
        assert.equal(named.messages[0].content_text, 'Лекция в четверг —資料は明日送ります');

        const otherType = await call(agent, 'isphere_receive_messages', {
          query: 'Ops Desk',
          conversation_type: 'direct',
        });
        assert.equal(otherType.conversation, null, 'the group conversation is not a direct one');

        const keyword = await call(agent, 'isphere_receive_messages', { query: 'budget' });
        assert.equal(keyword.conversation, null);
        assert.deepEqual(
          keyword.messages.map((m: Envelope) => m.message_id),
          ['m-3'],
        );

        const missing = await call(agent, 'isphere_receive_messages', { conversation_id: 'c-nowhere' });
        assert.deepEqual(errorOf(missing), [false, 'TARGET_NOT_FOUND', 'conversation_not_found']);
      });

      it('lists files and downloads one, streaming its bytes into the download directory', async () => {
        const listed = await call(agent, 'isphere_receive_files', { conversation_id: 'c-ops' });
        assert.equal(listed.files.length, 1);
        const expected = '1. Budget\n2. Hiring\n3. Any other';
        assert.equal(listed.files[0].sha256, sha256(expected));

        const got = await call(agent, 'isphere_receive_files', {
          file_id: 'f-agenda',
          mode: 'download',
          output_dir: 'from-bridge',
          dry_run: false,
        });
        assert.equal(got.ok, true, JSON.stringify(got.error));
        const saved: string = got.files[0].saved_path;
        assert.equal(
          path.dirname(saved),
          path.join(server.services.config.files.download_dir, 'from-bridge'),
        );
        assert.equal(fs.readFileSync(saved, 'utf8'), expected);
        assert.equal(got.files[0].sha256, sha256(expected));
        assert.equal(got.audit.file_sha256, sha256(expected));

        const absent = await call(agent, 'isphere_receive_files', { file_id: 'f-none' });
        assert.deepEqual(errorOf(absent), [false, 'TARGET_NOT_FOUND', 'file_not_found']);
      });

      it('sends an approved message once, keyed by its approval_id; a retried execution sends nothing', async () => {
        const args = {
          target_type: 'contact',
          target_id: 'u-anna',
          content_text: 'Vertrag geprüft ✓ — مرحبا',
        };
        const approvalId = await approved('isphere_send_message', args);
        const sentBefore = bridge.sent.length;

        const done = await call(agent, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.equal(done.ok, true, JSON.stringify(done.error));
        assert.equal(done.send_status, 'sent');
        assert.equal(done.audit.source, 'bridge');
        assert.equal(bridge.sent.length, sentBefore + 1);
        const write = bridge.sent.at(-1)!;
        assert.equal(write.key, approvalId, 'the Idempotency-Key is the approval_id');
        assert.deepEqual(
          [write.target_type, write.target_id, write.text],
          ['contact', 'u-anna', args.content_text],
        );
        assert.equal(done.message_ref, write.ref);

        const retry = await call(agent, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.deepEqual(errorOf(retry), [false, 'APPROVAL_REQUIRED', 'consumed']);
        assert.equal(bridge.sent.length, sentBefore + 1);

        const inbox = await call(agent, 'isphere_receive_messages', { conversation_id: 'c-anna' });
        assert.equal(inbox.messages[0].message_id, write.ref);
        assert.equal((await statusOf(approvalId)).status, 'succeeded');
      });

      it('answers a repeated idempotency_key with the stored result and no second write', async () => {
        const args = { target_type: 'group', target_id: 'g-lectorium', content_text: 'Спасибо!' };
        const approvalId = await approved('isphere_send_message', args);
        const sentBefore = bridge.sent.length;
        const real = { ...args, dry_run: false, approval_id: approvalId, idempotency_key: 'thanks-1' };
        const first = await call(agent, 'isphere_send_message', real);
        const again = await call(agent, 'isphere_send_message', real);
        assert.equal(first.ok, true, JSON.stringify(first.error));
        assert.equal(again.ok, true, JSON.stringify(again.error));
        assert.equal(again.message_ref, first.message_ref);
        assert.equal(bridge.sent.length, sentBefore + 1);
      });

      it('sends an approved file: the bridge receives exactly the approved bytes, once', async () => {
        const bytes = Buffer.from('quarterly figures · 四半期 · רבעון\n');
        fs.writeFileSync(path.join(outbound, 'figures.txt'), bytes);
        const args = {
          target_type: 'conversation',
          target_id: 'c-ops',
          file_path: 'figures.txt',
          caption: 'Q1',
        };
        const approvalId = await approved('isphere_send_file', args);
        const sentBefore = bridge.sent.length;

        const done = await call(agent, 'isphere_send_file', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.equal(done.ok, true, JSON.stringify(done.error));
        assert.equal(bridge.sent.length, sentBefore + 1);
        const write = bridge.sent.at(-1)!;
        assert.equal(write.key, approvalId);
        assert.equal(write.text, 'Q1');
        assert.deepEqual(write.file?.bytes, bytes);
        assert.equal(write.file?.file_name, 'figures.txt');
        assert.equal(done.file_sha256, sha256(bytes));
        assert.equal(done.file_ref, write.file_ref);
        assert.equal(done.message_ref, write.ref);

        const listed = await call(agent, 'isphere_receive_files', { file_id: write.file_ref! });
        assert.equal(listed.files[0].sha256, sha256(bytes), 'the file is now in the conversation');
      });
    });

    describe('the contract itself (what any bridge must do)', () => {
      const post = (key: string, text: string) =>
        fetch(new URL('messages', bridge.url), {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
          body: JSON.stringify({ target_type: 'contact', target_id: 'u-omar', text }),
        });

      it('never writes twice for one Idempotency-Key, and refuses the key for other content', async () => {
        const sentBefore = bridge.sent.length;
        const first = await post('key-contract-1', 'hello');
        const repeat = await post('key-contract-1', 'hello');
        assert.equal(first.status, 200);
        const ref = ((await first.json()) as { ref: string }).ref;
        assert.equal(((await repeat.json()) as { ref: string }).ref, ref);
        assert.equal(bridge.sent.length, sentBefore + 1);

        const other = await post('key-contract-1', 'something else');
        assert.equal(other.status, 409);
        assert.equal(
          ((await other.json()) as { error: { kind: string } }).error.kind,
          'IDEMPOTENCY_CONFLICT',
        );

        const lookup = await fetch(new URL('writes/key-contract-1', bridge.url));
        assert.deepEqual(await lookup.json(), { status: 'found', ref, file_ref: null });
        const never = await fetch(new URL('writes/key-never-used', bridge.url));
        assert.deepEqual(await never.json(), { status: 'not_found' });
        assert.equal(bridge.sent.length, sentBefore + 1);
      });
    });

    describe('failures', () => {
      it('answers TIMEOUT when the bridge does not answer in time', async () => {
        bridge.setFault({ kind: 'delay', ms: 60_000 }, { route: 'GET /contacts' });
        const res = await call(agent, 'isphere_search_contacts', { query: 'anna' });
        assert.deepEqual(errorOf(res), [false, 'TIMEOUT', 'bridge_timeout']);
      });

      for (const [fault, reason] of [
        [{ kind: 'http_500' }, 'bridge_http_500'],
        [{ kind: 'not_json' }, 'malformed_answer'],
        [{ kind: 'wrong_shape' }, 'malformed_answer'],
        [{ kind: 'error', error: 'MESSENGER_ON_FIRE', status: 502 }, 'bridge_http_502'],
      ] as const) {
        it(`answers CONNECTOR_FAILED (${reason}) for a ${fault.kind} answer`, async () => {
          bridge.setFault(fault);
          const res = await call(agent, 'isphere_search_groups', { query: 'ops' });
          assert.deepEqual(errorOf(res), [false, 'CONNECTOR_FAILED', reason]);
        });
      }

      it('answers SOURCE_UNAVAILABLE when the bridge is unreachable, and recovers without a restart', async () => {
        await bridge.refuseConnections();
        try {
          const refused = await call(agent, 'isphere_search_contacts', { query: 'anna' });
          assert.deepEqual(errorOf(refused), [false, 'SOURCE_UNAVAILABLE', 'bridge_unreachable']);
        } finally {
          await bridge.acceptConnections();
        }
        bridge.setFault({ kind: 'reset' }, { times: 1 });
        const reset = await call(agent, 'isphere_search_contacts', { query: 'anna' });
        assert.deepEqual(errorOf(reset), [false, 'SOURCE_UNAVAILABLE', 'bridge_unreachable']);
        const back = await call(agent, 'isphere_search_contacts', { query: 'anna' });
        assert.equal(back.contacts[0].contact_id, 'u-anna');
      });

      for (const errorKind of BridgeErrorKind.options) {
        it(`maps the bridge's ${errorKind} to ${ERROR_CODE[errorKind]}`, async () => {
          bridge.setFault({ kind: 'error', error: errorKind }, { route: 'GET /contacts' });
          const res = await call(agent, 'isphere_search_contacts', { query: 'anna' });
          assert.deepEqual(errorOf(res), [false, ERROR_CODE[errorKind], `bridge_${errorKind.toLowerCase()}`]);
        });
      }

      it("resolves write targets with the bridge's own answers: ambiguous, missing, not allowed", async () => {
        const draft = (target_id: string) =>
          call(agent, 'isphere_send_message', { target_type: 'contact', target_id, content_text: 'hi' });
        const twins = await draft('Chris Lee');
        assert.deepEqual(errorOf(twins), [false, 'AMBIGUOUS_TARGET', 'bridge_ambiguous_target']);
        assert.deepEqual(
          twins.error.details.candidates.map((c: Envelope) => c.target_id),
          ['u-chris1', 'u-chris2'],
        );
        assert.deepEqual(errorOf(await draft('u-nobody')), [
          false,
          'TARGET_NOT_FOUND',
          'bridge_target_not_found',
        ]);
        assert.deepEqual(errorOf(await draft('u-lea')), [
          false,
          'PERMISSION_DENIED',
          'bridge_permission_denied',
        ]);
        const byAccount = await draft('yuki.sato');
        assert.equal(byAccount.ok, true, JSON.stringify(byAccount.error));
        assert.equal(byAccount.target.target_id, 'u-yuki');
      });

      it('records a write the bridge refuses as failed, with nothing sent', async () => {
        const args = { target_type: 'contact', target_id: 'u-yuki', content_text: 'refused' };
        const approvalId = await approved('isphere_send_message', args);
        const sentBefore = bridge.sent.length;
        bridge.setFault({ kind: 'error', error: 'NOT_LOGGED_IN' }, { route: 'POST /messages' });
        const res = await call(agent, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.deepEqual(errorOf(res), [false, 'NOT_LOGGED_IN', 'bridge_not_logged_in']);
        assert.equal(bridge.sent.length, sentBefore);
        assert.equal((await statusOf(approvalId)).status, 'failed');
      });
    });

    describe('reconciliation of interrupted bridge writes', () => {
      it('settles a write whose answer timed out as succeeded, from the bridge, without sending it again', async () => {
        const args = { target_type: 'contact', target_id: 'u-omar', content_text: 'late but sent' };
        const approvalId = await approved('isphere_send_message', args);
        const sentBefore = bridge.sent.length;
        bridge.setFault({ kind: 'delay', ms: 60_000 }, { route: 'POST /messages' });
        const res = await call(agent, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.deepEqual(errorOf(res), [false, 'TIMEOUT', 'bridge_timeout']);
        assert.equal((await statusOf(approvalId)).status, 'executing', 'the outcome is not known yet');

        // While the bridge still holds the write, it answers "pending": reconciliation waits.
        await backdate(approvalId);
        await server.services.maintain();
        assert.equal((await statusOf(approvalId)).status, 'executing');

        bridge.setFault(null);
        bridge.release();
        await bridge.idle();
        assert.equal(bridge.sent.length, sentBefore + 1, 'the slow write landed');
        const write = bridge.sent.at(-1)!;
        assert.equal(write.key, approvalId);

        const retry = await call(agent, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.deepEqual(errorOf(retry), [false, 'APPROVAL_REQUIRED', 'consumed']);

        await server.services.maintain();
        assert.equal((await statusOf(approvalId)).status, 'succeeded');
        const rows = await server
          .sql('audit_events')
          .where({ approval_id: approvalId })
          .whereIn('kind', ['write.started', 'write.succeeded'])
          .orderBy('seq');
        assert.deepEqual(
          rows.map((r) => r.kind),
          ['write.started', 'write.succeeded'],
        );
        assert.equal(rows[0].source, 'bridge');
        const row = rows[1];
        assert.equal(row.details.ref, write.ref);
        assert.equal(row.details.reconciled, true);
        assert.equal(bridge.sent.length, sentBefore + 1);
      });

      it('settles a write lost on the way as failed, once the bridge can be asked', async () => {
        const args = { target_type: 'contact', target_id: 'u-omar', content_text: 'lost on the way' };
        const approvalId = await approved('isphere_send_message', args);
        const sentBefore = bridge.sent.length;
        bridge.setFault({ kind: 'reset' }, { route: 'POST /messages' });
        const res = await call(agent, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.deepEqual(errorOf(res), [false, 'SOURCE_UNAVAILABLE', 'bridge_unreachable']);
        assert.equal((await statusOf(approvalId)).status, 'executing');

        await backdate(approvalId);
        await bridge.refuseConnections();
        try {
          await server.services.maintain();
          assert.equal(
            (await statusOf(approvalId)).status,
            'executing',
            'an unreachable bridge is asked again later',
          );
        } finally {
          await bridge.acceptConnections();
        }
        await server.services.maintain();
        assert.equal((await statusOf(approvalId)).status, 'failed');
        assert.equal(bridge.sent.length, sentBefore);
      });
    });

    it('leaves an unbroken audit chain', async () => {
      const report = await verifyDatabaseChain(server.sql);
      assert.equal(report.first_bad, undefined);
      assert.equal(report.valid, report.rows);
    });
  });
}
