import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { defaultSeed } from '../helpers/bridge/reference-data.ts';
import { startReferenceBridge, type ReferenceBridge } from '../helpers/bridge/reference.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type Envelope, type TestServer } from '../helpers/server.ts';

const refusal = (res: Envelope) => [res.ok, res.error?.code, res.error?.reason];

/**
 * The approval binds where the write goes: the connector it resolved to and the target's id and display
 * name as the chair saw them. The local store and the bridge both know a contact `ct_alice`, but they are
 * not the same person: an approval for one never sends to the other.
 */
for (const kind of databaseKinds()) {
  describe(`the approval binds the source and the target's name on ${kind}`, () => {
    let bridge: ReferenceBridge;
    let server: TestServer;
    let agent: Client;
    let chair: User;
    const ALICE = { target_type: 'contact', target_id: 'ct_alice' };

    before(async () => {
      const seed = defaultSeed();
      seed.contacts.push({
        contact_id: 'ct_alice',
        display_name: 'All-company announcement list',
        account: 'all-company',
        department: null,
        title: null,
        active: true,
      });
      bridge = await startReferenceBridge({ seed });
      server = await startTestServer(kind, {
        COUNTERSIGN_BRIDGE_URL: bridge.url,
        COUNTERSIGN_DEFAULT_SOURCE: 'local',
      });
      chair = await createUser(server.sql, {
        name: 'chair-binding',
        roles: ['chair'],
        password: 'binding chair 1',
      });
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
      await bridge?.close();
    });

    const approve = (draft: Envelope) =>
      approveAsChair({ approvals: server.services.approvals, user: chair }, draft);
    /** Messages the local store holds for this approval's write (its key is the approval_id). */
    const sentLocally = async (approvalId: string) =>
      Number((await server.sql('messages').where({ write_key: approvalId }).count({ n: '*' }).first())?.n);
    const statusOf = async (approvalId: string) =>
      (await call(agent, 'isphere_get_approval', { approval_id: approvalId })).approval;

    it('refuses to execute through the bridge what was approved for the local store, sends nothing, audits it', async () => {
      const args = { ...ALICE, content_text: 'the board meets at nine', source_preference: 'local' };
      const draft = await call(agent, 'isphere_send_message', args);
      assert.equal(draft.ok, true, JSON.stringify(draft.error));
      assert.equal(draft.audit.source, 'local');
      const approvalId = await approve(draft);
      const decided = await server.sql('audit_events').where({
        approval_request_id: draft.approval.approval_request_id,
        kind: 'approval.approved',
      });
      assert.deepEqual(
        decided.map((r: Envelope) => r.source),
        ['local'],
        'the decision records where the approved write goes',
      );

      const sentBefore = bridge.sent.length;
      const res = await call(agent, 'isphere_send_message', {
        ...args,
        source_preference: 'bridge',
        dry_run: false,
        approval_id: approvalId,
      });
      assert.deepEqual(refusal(res), [false, 'APPROVAL_REQUIRED', 'mismatch']);
      assert.equal(res.error.details.differs, 'source');
      assert.equal(bridge.sent.length, sentBefore, 'nothing went through the bridge');
      const row = await server.sql('audit_events').where({ seq: res.audit.audit_seq }).first();
      assert.equal(row.kind, 'tool.call');
      assert.equal(row.error_code, 'APPROVAL_REQUIRED');
      assert.equal(detailsOf(row).reason, 'mismatch');
      assert.equal(
        (await server.sql('audit_events').where({ approval_id: approvalId, kind: 'write.started' })).length,
        0,
      );
      const approved = await statusOf(approvalId);
      assert.equal(approved.status, 'approved', 'the approval is not spent');
      assert.deepEqual([approved.source, approved.target.display_name], ['local', 'Alice Martin']);

      // Where the chair said it goes, it goes.
      const sent = await call(agent, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approvalId,
      });
      assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
      assert.equal(await sentLocally(approvalId), 1);
      assert.equal(bridge.sent.length, sentBefore);
    });

    it('drafts the same text through another source as a request of its own, showing that source and name', async () => {
      const text = { ...ALICE, content_text: 'same words, two places' };
      const local = await call(agent, 'isphere_send_message', { ...text, source_preference: 'local' });
      const viaBridge = await call(agent, 'isphere_send_message', { ...text, source_preference: 'bridge' });
      assert.equal(local.ok && viaBridge.ok, true);
      assert.notEqual(viaBridge.approval.approval_request_id, local.approval.approval_request_id);
      assert.notEqual(viaBridge.content_sha256, local.content_sha256);
      const shown = await call(agent, 'isphere_get_approval', {
        approval_request_id: viaBridge.approval.approval_request_id,
      });
      assert.equal(shown.approval.source, 'bridge');
      assert.equal(shown.approval.target.display_name, 'All-company announcement list');
      const again = await call(agent, 'isphere_send_message', { ...text, source_preference: 'bridge' });
      assert.equal(again.approval.approval_request_id, viaBridge.approval.approval_request_id);
    });

    it('reports the other source in a preflight, without consuming the approval', async () => {
      const args = { ...ALICE, content_text: 'checked before sending', source_preference: 'local' };
      const approvalId = await approve(await call(agent, 'isphere_send_message', args));
      const check = await call(agent, 'isphere_send_message', {
        ...args,
        source_preference: 'bridge',
        approval_id: approvalId,
      });
      assert.equal(check.ok, true, JSON.stringify(check.error));
      assert.deepEqual(
        [check.preflight.would_execute, check.preflight.code, check.preflight.reason],
        [false, 'APPROVAL_REQUIRED', 'mismatch'],
      );
      const same = await call(agent, 'isphere_send_message', { ...args, approval_id: approvalId });
      assert.equal(same.preflight.would_execute, true);
    });

    it("refuses when the target's display name changed between approval and execution; preflight says so", async () => {
      const args = { target_type: 'contact', target_id: 'ct_elodie', content_text: 'your contract is ready' };
      const draft = await call(agent, 'isphere_send_message', args);
      const approvalId = await approve(draft);
      assert.equal((await statusOf(approvalId)).target.display_name, 'Élodie Durand');
      await server.sql('contacts').where({ id: 'ct_elodie' }).update({ display_name: 'Press office' });
      try {
        const check = await call(agent, 'isphere_send_message', { ...args, approval_id: approvalId });
        assert.deepEqual([check.preflight.would_execute, check.preflight.reason], [false, 'mismatch']);
        const res = await call(agent, 'isphere_send_message', {
          ...args,
          dry_run: false,
          approval_id: approvalId,
        });
        assert.deepEqual(refusal(res), [false, 'APPROVAL_REQUIRED', 'mismatch']);
        assert.equal(res.error.details.differs, 'target_display');
        assert.equal(await sentLocally(approvalId), 0, 'nothing sent');
        assert.equal((await statusOf(approvalId)).status, 'approved');
      } finally {
        await server.sql('contacts').where({ id: 'ct_elodie' }).update({ display_name: 'Élodie Durand' });
      }
    });

    it('never executes a request drafted before its source was recorded', async () => {
      const args = {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text: 'drafted before the upgrade',
      };
      const approvalId = await approve(await call(agent, 'isphere_send_message', args));
      // As the migration leaves a request drafted by the version before it.
      await server.sql('approval_requests').where({ approval_id: approvalId }).update({ source: null });
      const res = await call(agent, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approvalId,
      });
      assert.deepEqual(refusal(res), [false, 'APPROVAL_REQUIRED', 'mismatch']);
      assert.equal(res.error.details.differs, 'source');
      assert.equal(await sentLocally(approvalId), 0);
      assert.equal((await statusOf(approvalId)).source, null);
    });

    it('shows the source on the review page and in approvals show', async () => {
      const draft = await call(agent, 'isphere_send_message', {
        ...ALICE,
        content_text: 'where does this go?',
        source_preference: 'bridge',
      });
      const id: string = draft.approval.approval_request_id;
      const web = new WebClient(server.url);
      await web.login('chair-binding', 'binding chair 1');
      const page = await web.get(`/approvals/${id}`);
      assert.equal(page.res.status, 200);
      assert.match(page.html, /<dt>Source<\/dt>\s*<dd><code>bridge<\/code><\/dd>/);
      assert.match(page.html, /All-company announcement list/);

      const show = await runCli(['approvals', 'show', id, '--as', 'chair-binding'], {
        ...server.env,
        COUNTERSIGN_PASSWORD: 'binding chair 1',
      });
      assert.equal(show.code, 0, show.stderr);
      assert.match(show.stdout, /^source\s+bridge$/m);
    });
  });
}
