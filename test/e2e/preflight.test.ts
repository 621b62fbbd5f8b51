import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * A dry run that carries an approval_id checks it without executing (the operators' issue): no new
 * request is drafted, nothing is consumed, and the answer says whether a real run with the same
 * arguments would be accepted, or the exact code and reason it would be refused with.
 */
for (const kind of databaseKinds()) {
  describe(`dry run with an approval_id on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chair: User;
    const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'checked first' };

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
      chair = await createUser(server.sql, {
        name: 'chair-pf',
        roles: ['chair'],
        password: 'preflight 1',
      });
    });

    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    const requests = async () => Number((await server.sql('approval_requests').count({ n: '*' }).first())?.n);

    it('says a real run would be accepted, consumes nothing, drafts nothing, and records the approval_id', async () => {
      const draft = await call(agent, 'isphere_send_message', args);
      const approvalId = await approveAsChair({ approvals: server.services.approvals, user: chair }, draft);
      const before = await requests();
      const check = await call(agent, 'isphere_send_message', { ...args, approval_id: approvalId });
      assert.equal(check.ok, true, JSON.stringify(check.error));
      assert.equal(check.dry_run, true);
      assert.equal(check.send_status, 'planned');
      assert.equal(check.approval, null);
      assert.deepEqual(check.preflight, { would_execute: true, code: null, reason: null, message: null });
      assert.equal(await requests(), before, 'no request drafted');
      const row = await server.sql('audit_events').where({ seq: check.audit.audit_seq }).first();
      assert.equal(row.approval_id, approvalId);
      assert.equal(row.dry_run, true);

      const sent = await call(agent, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approvalId,
      });
      assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
      const again = await call(agent, 'isphere_send_message', { ...args, approval_id: approvalId });
      assert.equal(again.preflight.would_execute, false);
      assert.equal(again.preflight.code, 'APPROVAL_REQUIRED');
      assert.equal(again.preflight.reason, 'consumed');
    });

    it('names why not: other content, a pending request, an unknown id', async () => {
      const draft = await call(agent, 'isphere_send_message', { ...args, content_text: 'the approved text' });
      const approvalId = await approveAsChair({ approvals: server.services.approvals, user: chair }, draft);
      const other = await call(agent, 'isphere_send_message', {
        ...args,
        content_text: 'another text',
        approval_id: approvalId,
      });
      assert.equal(other.preflight.would_execute, false);
      assert.equal(other.preflight.reason, 'mismatch');
      assert.match(other.preflight.message, /content differs from what was approved/);

      const pending = await call(agent, 'isphere_send_message', {
        ...args,
        content_text: 'not yet approved',
      });
      const asId = await call(agent, 'isphere_send_message', {
        ...args,
        content_text: 'not yet approved',
        approval_id: pending.approval.approval_request_id,
      });
      assert.equal(asId.preflight.reason, 'pending');

      const unknown = await call(agent, 'isphere_send_message', { ...args, approval_id: 'no-such-approval' });
      assert.equal(unknown.ok, true);
      assert.equal(unknown.preflight.reason, 'unknown');
    });
  });
}
