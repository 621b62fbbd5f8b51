import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { isDecisionRefusal } from '../../src/approval/decide.ts';
import { verifyDatabaseChain } from '../../src/audit/verify.ts';
import { importData } from '../../src/connectors/local/import.ts';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import { type User } from '../../src/core/identity.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type Envelope, type TestServer } from '../helpers/server.ts';

const MESSAGE = {
  target_type: 'contact',
  target_id: 'ct_david',
  content_text: 'שלום דוד,\nהדוח מצורף. 📎 预算 OK',
};

for (const kind of databaseKinds()) {
  describe(`write path on ${kind}`, () => {
    let server: TestServer;
    let agentA: Client;
    let agentB: Client;
    let chair: User;
    let chair2: User;
    let compliance: User;
    let owner: User;
    let outbound: string;

    // decide() itself, for the tests of decisions (quorum, refusals); executions get their approval_id
    // from approveAsChair.
    const approve = (id: string, user: User) =>
      server.services.approvals.decide({ id, user, decision: 'approve' });
    const reject = (id: string, note: string, user = chair) =>
      server.services.approvals.decide({ id, user, decision: 'reject', note });
    const countMessages = async (where: Record<string, unknown> = {}) =>
      Number(
        (
          await server
            .sql('messages')
            .where({ direction: 'outgoing', ...where })
            .count({ n: '*' })
            .first()
        )?.n,
      );

    /** Drafts, approves as chair-ada and returns the approval_id for a write. */
    async function approved(client: Client, tool: string, args: Record<string, unknown>): Promise<string> {
      return approveAsChair(
        { approvals: server.services.approvals, user: chair },
        await call(client, tool, args),
      );
    }

    const refusal = (res: Envelope) => [res.error?.code, res.error?.reason];

    before(async () => {
      server = await startTestServer(kind, {
        COUNTERSIGN_REQUIRED_APPROVERS: 'send_file=2',
        COUNTERSIGN_MAX_FILE_BYTES: '4096',
      });
      const knex = server.sql;
      chair = await createUser(knex, { name: 'chair-ada', roles: ['chair'], password: 'correct horse 1' });
      chair2 = await createUser(knex, {
        name: 'chair-bo',
        roles: ['chair', 'admin'],
        password: 'correct horse 2',
      });
      compliance = await createUser(knex, {
        name: 'auditor',
        roles: ['compliance', 'admin'],
        password: 'correct horse 3',
      });
      owner = await createUser(knex, { name: 'owner-cy', roles: ['chair'], password: 'correct horse 4' });
      const b = await createAgent(knex, { name: 'agent-b', owner: 'owner-cy' });
      agentA = await connectHttp(server.url, server.demoToken);
      agentB = await connectHttp(server.url, b.token);
      await importData(knex, server.services.blobs, {
        contacts: [
          { id: 'ct_twin1', display_name: 'Sam Twin' },
          { id: 'ct_twin2', display_name: 'Sam Twin' },
        ],
      });
      outbound = server.services.config.files.outbound_dir;
      fs.mkdirSync(outbound, { recursive: true });
    });
    after(async () => {
      await agentA?.close();
      await agentB?.close();
      await server?.stop();
    });

    it('tells an agent whose file is missing which outbound directory it looked in, and that it is empty', async () => {
      const args = { target_type: 'contact', target_id: 'ct_alice', file_path: 'minutes.pdf' };
      const first = await call(agentA, 'isphere_send_file', args);
      assert.deepEqual(refusal(first), ['TARGET_NOT_FOUND', 'file_not_found']);
      assert.deepEqual(first.error.details, { outbound_dir: outbound, empty: true });
      fs.writeFileSync(path.join(outbound, 'agenda.txt'), 'agenda');
      try {
        const second = await call(agentA, 'isphere_send_file', args);
        assert.deepEqual(second.error.details, { outbound_dir: outbound, empty: false });
      } finally {
        fs.rmSync(path.join(outbound, 'agenda.txt'));
      }
    });

    it('drafts a message in dry run by default: planned, hashed, pending, nothing sent', async () => {
      const before = await countMessages();
      const res = await call(agentA, 'isphere_send_message', MESSAGE);
      assert.equal(res.ok, true);
      assert.equal(res.dry_run, true);
      assert.equal(res.send_status, 'planned');
      assert.equal(res.message_ref, null);
      assert.match(res.content_sha256, /^[0-9a-f]{64}$/);
      assert.equal(res.target.display_name, 'דוד לוי');
      assert.equal(res.approval.status, 'pending');
      assert.match(res.approval.review_url, new RegExp(`/approvals/${res.approval.approval_request_id}$`));
      assert.ok(Date.parse(res.approval.expires_at) > Date.now());
      assert.equal(res.audit.dry_run, true);
      assert.equal(res.audit.content_sha256, res.content_sha256);
      assert.equal(await countMessages(), before);

      const again = await call(agentA, 'isphere_send_message', MESSAGE);
      assert.equal(
        again.approval.approval_request_id,
        res.approval.approval_request_id,
        'same content, same request',
      );
      assert.equal(again.content_sha256, res.content_sha256);
    });

    it('runs the whole round trip for a message: draft, approve, get_approval, execute, receive', async () => {
      const args = { ...MESSAGE, content_text: 'Round trip — 往返 — הלוך ושוב' };
      const draft = await call(agentA, 'isphere_send_message', args);
      const requestId = draft.approval.approval_request_id;

      const pending = await call(agentA, 'isphere_get_approval', { approval_request_id: requestId });
      assert.equal(pending.approval.status, 'pending');
      assert.equal(pending.approval.approval_id, null);

      await approveAsChair({ approvals: server.services.approvals, user: chair }, requestId, 'fine by me');
      const got = await call(agentA, 'isphere_get_approval', { approval_request_id: requestId });
      assert.equal(got.approval.status, 'approved');
      assert.deepEqual(got.approval.approvers, ['chair-ada']);
      assert.equal(got.approval.note, 'fine by me');
      const approvalId: string = got.approval.approval_id;
      assert.match(approvalId, /^[0-9a-f-]{36}$/);

      const sent = await call(agentA, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approvalId,
      });
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
      assert.equal(sent.send_status, 'sent');
      assert.equal(sent.dry_run, false);
      assert.match(sent.message_ref, /^ms_/);
      assert.equal(sent.audit.approval_id, approvalId);
      assert.equal(sent.content_sha256, draft.content_sha256);

      const inbox = await call(agentA, 'isphere_receive_messages', { conversation_id: 'cv_david' });
      assert.equal(inbox.messages[0].message_id, sent.message_ref);
      assert.equal(inbox.messages[0].content_text, args.content_text);

      const done = await call(agentA, 'isphere_get_approval', { approval_id: approvalId });
      assert.equal(done.approval.status, 'succeeded');
      assert.equal(done.approval.execution.result.message_ref, sent.message_ref);

      const kinds = (
        await server.sql('audit_events').where('approval_request_id', requestId).orderBy('seq')
      ).map((r: { kind: string }) => r.kind);
      assert.deepEqual(kinds, [
        'approval.requested',
        'approval.approved',
        'write.started',
        'write.succeeded',
      ]);
      const started = await server
        .sql('audit_events')
        .where({ approval_request_id: requestId, kind: 'write.started' })
        .first();
      assert.equal(started.content_sha256, draft.content_sha256);
      assert.equal(started.target_ref, 'ct_david');
      assert.ok(
        !JSON.stringify(await server.sql('audit_events').select('*')).includes('Round trip'),
        'no bodies in the audit log',
      );
    });

    it('sends to a group and to a conversation, creating the conversation a contact lacks', async () => {
      const group = { target_type: 'group', target_id: 'gr_alpha', content_text: '会议改到周二。' };
      const gid = await approved(agentA, 'isphere_send_message', group);
      const sent = await call(agentA, 'isphere_send_message', { ...group, dry_run: false, approval_id: gid });
      assert.equal(sent.send_status, 'sent');
      const alpha = await call(agentA, 'isphere_receive_messages', { conversation_id: 'cv_alpha', limit: 1 });
      assert.equal(alpha.messages[0].content_text, '会议改到周二。');

      const toLina = { target_type: 'contact', target_id: 'li.na', content_text: 'Hello Lina' }; // by account
      const lid = await approved(agentA, 'isphere_send_message', toLina);
      const res = await call(agentA, 'isphere_send_message', { ...toLina, dry_run: false, approval_id: lid });
      assert.equal(res.target.target_id, 'ct_lina');
      const conv = await call(agentA, 'isphere_receive_messages', { query: '李娜' });
      assert.equal(conv.messages[0].content_text, 'Hello Lina');
    });

    it('answers TARGET_NOT_FOUND, AMBIGUOUS_TARGET and PERMISSION_DENIED for bad targets', async () => {
      const missing = await call(agentA, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'nobody',
        content_text: 'x',
      });
      assert.equal(missing.error.code, 'TARGET_NOT_FOUND');
      const twins = await call(agentA, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'Sam Twin',
        content_text: 'x',
      });
      assert.equal(twins.error.code, 'AMBIGUOUS_TARGET');
      assert.equal(twins.error.details.candidates.length, 2);
      const inactive = await call(agentA, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_chen_old',
        content_text: 'x',
      });
      assert.equal(inactive.error.code, 'PERMISSION_DENIED');
      const archived = await call(agentA, 'isphere_send_message', {
        target_type: 'group',
        target_id: 'gr_offsite',
        content_text: 'x',
      });
      assert.equal(archived.error.code, 'PERMISSION_DENIED');
      const blank = await call(agentA, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_alice',
        content_text: '',
      });
      assert.equal(blank.error.code, 'INVALID_ARGUMENT');
      const huge = await call(agentA, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_alice',
        content_text: 'x'.repeat(64 * 1024 + 1),
      });
      assert.deepEqual(refusal(huge), ['INVALID_ARGUMENT', 'content_too_large']);
    });

    describe('refuses a real write with APPROVAL_REQUIRED and its reason, each audited', () => {
      it('missing: dry_run false without approval_id', async () => {
        const res = await call(agentA, 'isphere_send_message', { ...MESSAGE, dry_run: false });
        assert.deepEqual(refusal(res), ['APPROVAL_REQUIRED', 'missing']);
        const row = await server.sql('audit_events').where('seq', res.audit.audit_seq).first();
        assert.equal(row.error_code, 'APPROVAL_REQUIRED');
        assert.equal(
          (typeof row.details === 'string' ? JSON.parse(row.details) : row.details).reason,
          'missing',
        );
      });

      it('unknown: an approval_id nobody issued', async () => {
        for (const approval_id of ['3f1e9f3c-1111-4aaa-8bbb-123456789abc', 'not-a-uuid']) {
          const res = await call(agentA, 'isphere_send_message', { ...MESSAGE, dry_run: false, approval_id });
          assert.deepEqual(refusal(res), ['APPROVAL_REQUIRED', 'unknown']);
        }
      });

      it('pending: the request is not approved yet', async () => {
        const draft = await call(agentA, 'isphere_send_message', {
          ...MESSAGE,
          content_text: 'still pending',
        });
        const res = await call(agentA, 'isphere_send_message', {
          ...MESSAGE,
          content_text: 'still pending',
          dry_run: false,
          approval_id: draft.approval.approval_request_id,
        });
        assert.deepEqual(refusal(res), ['APPROVAL_REQUIRED', 'pending']);
      });

      it('rejected: the chair said no, and the note reaches the agent', async () => {
        const args = { ...MESSAGE, content_text: 'please reject me' };
        const draft = await call(agentA, 'isphere_send_message', args);
        const id = draft.approval.approval_request_id;
        await reject(id, 'Not before the board meets — לא עכשיו');
        const got = await call(agentA, 'isphere_get_approval', { approval_request_id: id });
        assert.equal(got.approval.status, 'rejected');
        assert.equal(got.approval.note, 'Not before the board meets — לא עכשיו');
        const res = await call(agentA, 'isphere_send_message', { ...args, dry_run: false, approval_id: id });
        assert.deepEqual(refusal(res), ['APPROVAL_REQUIRED', 'rejected']);
      });

      it('expired: an approval not used in time', async () => {
        const args = { ...MESSAGE, content_text: 'too late' };
        const id = await approved(agentA, 'isphere_send_message', args);
        await server
          .sql('approval_requests')
          .where({ approval_id: id })
          .update({ expires_at: new Date(Date.now() - 1000) });
        const res = await call(agentA, 'isphere_send_message', { ...args, dry_run: false, approval_id: id });
        assert.deepEqual(refusal(res), ['APPROVAL_REQUIRED', 'expired']);
        const row = await server.sql('approval_requests').where({ approval_id: id }).first();
        assert.equal(row.status, 'expired');
        assert.ok(
          await server.sql('audit_events').where({ kind: 'approval.expired', approval_id: id }).first(),
        );
      });

      it('consumed: one approval, one write', async () => {
        const args = { ...MESSAGE, content_text: 'only once' };
        const id = await approved(agentA, 'isphere_send_message', args);
        const first = await call(agentA, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: id,
        });
        assert.equal(first.send_status, 'sent');
        const second = await call(agentA, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: id,
        });
        assert.deepEqual(refusal(second), ['APPROVAL_REQUIRED', 'consumed']);
        assert.equal(await countMessages({ content_text: 'only once' }), 1);
      });

      it('mismatch: one character, the target or the tool changed after approval', async () => {
        const args = { ...MESSAGE, content_text: 'Pay 100 EUR' };
        const id = await approved(agentA, 'isphere_send_message', args);
        const oneChar = await call(agentA, 'isphere_send_message', {
          ...args,
          content_text: 'Pay 900 EUR',
          dry_run: false,
          approval_id: id,
        });
        assert.deepEqual(refusal(oneChar), ['APPROVAL_REQUIRED', 'mismatch']);
        const otherTarget = await call(agentA, 'isphere_send_message', {
          ...args,
          target_id: 'ct_alice',
          dry_run: false,
          approval_id: id,
        });
        assert.deepEqual(refusal(otherTarget), ['APPROVAL_REQUIRED', 'mismatch']);
        fs.writeFileSync(path.join(outbound, 'pay.txt'), 'Pay 100 EUR');
        const otherTool = await call(agentA, 'isphere_send_file', {
          target_type: 'contact',
          target_id: 'ct_david',
          file_path: 'pay.txt',
          dry_run: false,
          approval_id: id,
        });
        assert.deepEqual(refusal(otherTool), ['APPROVAL_REQUIRED', 'mismatch']);
        // The approval survives refused attempts and still works for exactly what was approved.
        const ok = await call(agentA, 'isphere_send_message', { ...args, dry_run: false, approval_id: id });
        assert.equal(ok.send_status, 'sent');
        assert.equal(await countMessages({ content_text: 'Pay 900 EUR' }), 0);
      });

      it("wrong_agent: agent B presenting agent A's approval", async () => {
        const args = { ...MESSAGE, content_text: 'for agent A only' };
        const id = await approved(agentA, 'isphere_send_message', args);
        const res = await call(agentB, 'isphere_send_message', { ...args, dry_run: false, approval_id: id });
        assert.deepEqual(refusal(res), ['APPROVAL_REQUIRED', 'wrong_agent']);
        assert.equal(await countMessages({ content_text: 'for agent A only' }), 0);
      });
    });

    it("never shows an agent another agent's requests", async () => {
      const draft = await call(agentA, 'isphere_send_message', { ...MESSAGE, content_text: 'private to A' });
      const byB = await call(agentB, 'isphere_get_approval', {
        approval_request_id: draft.approval.approval_request_id,
      });
      assert.equal(byB.error.code, 'TARGET_NOT_FOUND');
      const listB = await call(agentB, 'isphere_list_approvals', {});
      assert.ok(!JSON.stringify(listB).includes(draft.approval.approval_request_id));
      const listA = await call(agentA, 'isphere_list_approvals', { status: 'pending', limit: 2 });
      assert.equal(listA.approvals.length, 2);
      assert.ok(listA.next_cursor);
      const page2 = await call(agentA, 'isphere_list_approvals', {
        status: 'pending',
        limit: 2,
        cursor: listA.next_cursor,
      });
      assert.ok(page2.approvals.every((a: { status: string }) => a.status === 'pending'));
      assert.notEqual(page2.approvals[0]?.approval_request_id, listA.approvals[0].approval_request_id);
    });

    it('answers a repeated idempotency_key with the stored result, and a reused one with IDEMPOTENCY_CONFLICT', async () => {
      const args = { ...MESSAGE, content_text: 'idempotent hello' };
      const id = await approved(agentA, 'isphere_send_message', args);
      const first = await call(agentA, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: id,
        idempotency_key: 'k-1',
      });
      const again = await call(agentA, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: id,
        idempotency_key: 'k-1',
      });
      assert.equal(again.ok, true);
      assert.equal(again.message_ref, first.message_ref);
      assert.equal(await countMessages({ content_text: 'idempotent hello' }), 1);
      const other = await call(agentA, 'isphere_send_message', {
        ...args,
        content_text: 'different content',
        dry_run: false,
        approval_id: id,
        idempotency_key: 'k-1',
      });
      assert.equal(other.error.code, 'IDEMPOTENCY_CONFLICT');
    });

    it('settles concurrent executions of one approval: exactly one write', async () => {
      const args = { ...MESSAGE, content_text: 'race in one process' };
      const id = await approved(agentA, 'isphere_send_message', args);
      const results = await Promise.all(
        Array.from({ length: 20 }, () =>
          call(agentA, 'isphere_send_message', { ...args, dry_run: false, approval_id: id }),
        ),
      );
      assert.equal(results.filter((r) => r.send_status === 'sent').length, 1);
      assert.ok(
        results
          .filter((r) => !r.ok)
          .every((r) => r.error.code === 'APPROVAL_REQUIRED' && r.error.reason === 'consumed'),
      );
      assert.equal(await countMessages({ content_text: 'race in one process' }), 1);
    });

    describe('files', () => {
      it('round trip: draft with sha256 and size, two chairs approve, send, receive', async () => {
        const bytes = Buffer.from('Quarterly report — דוח רבעוני — 季度报告\n');
        fs.writeFileSync(path.join(outbound, 'report.txt'), bytes);
        const sha = createHash('sha256').update(bytes).digest('hex');
        const args = {
          target_type: 'group',
          target_id: 'gr_finance',
          file_path: 'report.txt',
          caption: 'Q3',
        };
        const draft = await call(agentA, 'isphere_send_file', args);
        assert.equal(draft.send_status, 'planned');
        assert.equal(draft.file_sha256, sha);
        assert.equal(draft.file_size_bytes, bytes.length);
        assert.equal(draft.file_ref, null);
        const id = draft.approval.approval_request_id;

        const one = await approve(id, chair);
        assert.equal(one.status, 'pending', 'send_file needs two chairs');
        assert.equal(one.approval_id, null);
        const same = await approve(id, chair);
        assert.deepEqual(same.approvers, ['chair-ada'], 'the same chair twice counts once');
        const two = await approve(id, chair2);
        assert.equal(two.status, 'approved');
        assert.deepEqual(two.approvers, ['chair-ada', 'chair-bo']);

        const sent = await call(agentA, 'isphere_send_file', {
          ...args,
          dry_run: false,
          approval_id: two.approval_id,
        });
        assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
        assert.match(sent.file_ref, /^fl_/);
        const files = await call(agentA, 'isphere_receive_files', { conversation_id: 'cv_finance' });
        const got = files.files.find((f: { file_id: string }) => f.file_id === sent.file_ref);
        assert.equal(got.sha256, sha);
        assert.equal(got.file_name, 'report.txt');
      });

      it('refuses execution when the file changed after approval', async () => {
        fs.writeFileSync(path.join(outbound, 'contract.txt'), 'version 1');
        const args = { target_type: 'contact', target_id: 'ct_alice', file_path: 'contract.txt' };
        const draft = await call(agentA, 'isphere_send_file', args);
        await approve(draft.approval.approval_request_id, chair); // send_file needs two chairs
        const approvalId = await approveAsChair(
          { approvals: server.services.approvals, user: chair2 },
          draft,
        );
        fs.writeFileSync(path.join(outbound, 'contract.txt'), 'version 2');
        const res = await call(agentA, 'isphere_send_file', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.deepEqual(refusal(res), ['APPROVAL_REQUIRED', 'mismatch']);
      });

      it('refuses paths outside the outbound directory, by .., absolute path or symlink', async () => {
        const secret = path.join(server.db.dataDir, 'secret.txt');
        fs.writeFileSync(secret, 'top secret');
        fs.symlinkSync(secret, path.join(outbound, 'innocent.txt'));
        fs.symlinkSync(server.db.dataDir, path.join(outbound, 'updir'));
        for (const file_path of [
          '../secret.txt',
          secret,
          'innocent.txt',
          'updir/secret.txt',
          '/etc/passwd',
        ]) {
          const res = await call(agentA, 'isphere_send_file', {
            target_type: 'contact',
            target_id: 'ct_alice',
            file_path,
          });
          assert.equal(res.error?.code, 'PERMISSION_DENIED', file_path);
        }
        const missing = await call(agentA, 'isphere_send_file', {
          target_type: 'contact',
          target_id: 'ct_alice',
          file_path: 'nope.txt',
        });
        assert.equal(missing.error.code, 'TARGET_NOT_FOUND');
      });

      it('refuses a file over the size cap', async () => {
        fs.writeFileSync(path.join(outbound, 'big.bin'), Buffer.alloc(4097));
        const res = await call(agentA, 'isphere_send_file', {
          target_type: 'contact',
          target_id: 'ct_alice',
          file_path: 'big.bin',
        });
        assert.deepEqual(refusal(res), ['INVALID_ARGUMENT', 'file_too_large']);
      });
    });

    describe('decisions', () => {
      it('refuses deciders who may not decide, and rejections without a note', async () => {
        const draft = await call(agentB, 'isphere_send_message', { ...MESSAGE, content_text: 'from B' });
        const id = draft.approval.approval_request_id;
        const reason = async (p: Promise<unknown>) => {
          try {
            await p;
            return 'accepted';
          } catch (err) {
            assert.ok(isDecisionRefusal(err), String(err));
            return err.reason;
          }
        };
        assert.equal(await reason(approve(id, compliance)), 'not_chair');
        assert.equal(await reason(approve(id, owner)), 'owner_of_agent');
        assert.equal(
          await reason(server.services.approvals.decide({ id, user: chair, decision: 'reject', note: '  ' })),
          'note_required',
        );
        assert.equal(await reason(approve('00000000-0000-4000-8000-000000000000', chair)), 'not_found');
        await reject(id, 'no');
        assert.equal(await reason(reject(id, 'no')), 'accepted', 'the same decision twice changes nothing');
        assert.equal(await reason(approve(id, chair)), 'already_decided');
        assert.equal(await reason(approve(id, chair2)), 'not_pending');
        const rows = await server
          .sql('audit_events')
          .where({ approval_request_id: id, kind: 'approval.rejected' });
        assert.equal(rows.length, 1, 'the repeated rejection recorded nothing');
      });

      it('expires pending requests past their time, with an audit row', async () => {
        const draft = await call(agentA, 'isphere_send_message', {
          ...MESSAGE,
          content_text: 'left waiting',
        });
        const id = draft.approval.approval_request_id;
        await server
          .sql('approval_requests')
          .where({ id })
          .update({ expires_at: new Date(Date.now() - 1) });
        await server.services.maintain();
        const got = await call(agentA, 'isphere_get_approval', { approval_request_id: id });
        assert.equal(got.approval.status, 'expired');
        assert.ok(
          await server
            .sql('audit_events')
            .where({ kind: 'approval.expired', approval_request_id: id })
            .first(),
        );
        const redraft = await call(agentA, 'isphere_send_message', {
          ...MESSAGE,
          content_text: 'left waiting',
        });
        assert.notEqual(redraft.approval.approval_request_id, id, 'a fresh request replaces the expired one');
      });
    });

    it('leaves an unbroken audit chain', async () => {
      const report = await verifyDatabaseChain(server.sql);
      assert.equal(report.first_bad, undefined);
      assert.equal(report.valid, report.rows);
    });
  });
}
