import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import { contentSha256 } from '../../src/approval/gate.ts';
import type { Notice } from '../../src/approval/outbox.ts';
import type { Agent } from '../../src/core/identity.ts';
import { isAppError } from '../../src/core/errors.ts';
import { bodyOf } from '../../src/notify/email.ts';
import { requestBlocks } from '../../src/notify/slack-blocks.ts';
import { webhookBody } from '../../src/notify/webhook.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type Envelope, type TestServer } from '../helpers/server.ts';

const refusal = (res: Envelope) => [res.ok, res.error?.code, res.error?.reason];

/** An approval whose approver is disabled before execution no longer executes. */
for (const kind of databaseKinds()) {
  describe(`an approval by a since-disabled chair on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    /** A new chair, who approves a fresh draft of `content_text`; the draft's arguments and approval_id. */
    async function approvedBy(name: string, content_text: string) {
      const user = await createUser(server.sql, {
        name,
        roles: ['chair'],
        password: `${name} pw 1`,
      });
      const args = { target_type: 'contact', target_id: 'ct_david', content_text };
      const draft = await call(agent, 'isphere_send_message', args);
      const approvalId = await approveAsChair({ approvals: server.services.approvals, user }, draft);
      return { args, approvalId };
    }
    const disable = async (name: string) => {
      const res = await runCli(['user', 'disable', name], server.env);
      assert.equal(res.code, 0, res.stderr);
    };
    const sentFor = async (approvalId: string) =>
      Number((await server.sql('messages').where({ write_key: approvalId }).count({ n: '*' }).first())?.n);
    const statusOf = async (approvalId: string) =>
      (await call(agent, 'isphere_get_approval', { approval_id: approvalId })).approval.status;

    it('refuses with approver_disabled, in a preflight and a real run, sends nothing, audits it', async () => {
      const { args, approvalId } = await approvedBy('chair-leaving', 'approved, then the chair left');
      await disable('chair-leaving');

      const check = await call(agent, 'isphere_send_message', { ...args, approval_id: approvalId });
      assert.deepEqual(
        [check.preflight.would_execute, check.preflight.code, check.preflight.reason],
        [false, 'APPROVAL_REQUIRED', 'approver_disabled'],
      );
      const res = await call(agent, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approvalId,
      });
      assert.deepEqual(refusal(res), [false, 'APPROVAL_REQUIRED', 'approver_disabled']);
      assert.equal(await sentFor(approvalId), 0, 'nothing sent');
      assert.equal(await statusOf(approvalId), 'approved', 'nothing marked executing');
      const row = await server.sql('audit_events').where({ seq: res.audit.audit_seq }).first();
      assert.equal(row.error_code, 'APPROVAL_REQUIRED');
      assert.equal(detailsOf(row).reason, 'approver_disabled');
      const started = await server
        .sql('audit_events')
        .where({ approval_id: approvalId, kind: 'write.started' });
      assert.equal(started.length, 0);

      // With an idempotency_key the locking transaction decides, and refuses the same way.
      const keyed = await call(agent, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approvalId,
        idempotency_key: 'after-the-chair-left',
      });
      assert.deepEqual(refusal(keyed), [false, 'APPROVAL_REQUIRED', 'approver_disabled']);
      assert.equal(await sentFor(approvalId), 0);
    });

    it('gives a redraft a fresh request in place of the one the disabled chair approved; that one executes', async () => {
      const { args, approvalId } = await approvedBy('chair-gone', 'approved by a chair who has gone');
      const voided = (await call(agent, 'isphere_get_approval', { approval_id: approvalId })).approval;
      await disable('chair-gone');

      const redraft = await call(agent, 'isphere_send_message', args);
      assert.equal(redraft.ok, true, JSON.stringify(redraft.error));
      assert.notEqual(redraft.approval.approval_request_id, voided.approval_request_id);
      assert.equal(redraft.approval.status, 'pending');
      assert.equal(await statusOf(approvalId), 'expired');
      const [expired] = await server
        .sql('audit_events')
        .where({ approval_request_id: voided.approval_request_id, kind: 'approval.expired' });
      assert.ok(expired);
      assert.deepEqual(
        [detailsOf(expired).from, detailsOf(expired).reason],
        ['approved', 'approver_disabled'],
      );

      const chair = await createUser(server.sql, {
        name: 'chair-new',
        roles: ['chair'],
        password: 'new pw 1',
      });
      const fresh = await approveAsChair({ approvals: server.services.approvals, user: chair }, redraft);
      const sent = await call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id: fresh });
      assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
      assert.equal(await sentFor(fresh), 1);
      assert.equal(await sentFor(approvalId), 0);
    });

    it('refuses a start whose early read of the approval came before the chair was disabled', async () => {
      const { args, approvalId } = await approvedBy('chair-midway', 'read early, disabled before the start');
      const approvals = server.services.approvals;
      const early = approvals.readApproval(approvalId);
      assert.equal((await early)?.approver_disabled, false);
      await disable('chair-midway');

      const view = (await call(agent, 'isphere_get_approval', { approval_id: approvalId })).approval;
      const demo = (await server.sql('agents').where({ name: 'demo' }).first()) as Agent;
      const target = view.target;
      const content_sha256 = contentSha256('send_message', 'local', target, {
        content_text: args.content_text,
      });
      assert.equal(content_sha256, view.content_sha256, 'the same write as approved');
      await assert.rejects(
        approvals.beginExecution(
          {
            agent: demo,
            tool: 'send_message',
            approval_id: approvalId,
            target,
            content_sha256,
            file_sha256: null,
            request_id: randomUUID(),
            trace_id: randomUUID(),
            source: 'local',
          },
          early,
        ),
        (err) => isAppError(err, 'APPROVAL_REQUIRED', 'approver_disabled'),
      );
      assert.equal(await statusOf(approvalId), 'approved');
    });

    it('still executes an approval whose chairs are all active, whoever else is disabled', async () => {
      const { args, approvalId } = await approvedBy('chair-staying', 'the chair is still here');
      await createUser(server.sql, {
        name: 'chair-other',
        roles: ['chair'],
        password: 'other pw 1',
      });
      await disable('chair-other');
      const sent = await call(agent, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approvalId,
      });
      assert.equal(sent.send_status, 'sent', JSON.stringify(sent.error));
      assert.equal(await sentFor(approvalId), 1);
    });
  });
}

describe('notices name the source', () => {
  const notice: Notice = {
    event: 'requested',
    approval_request_id: '6f1c2a54-0d7e-4a53-9c1e-0a7d1b2c3d4e',
    agent_id: '7e2d3b65-1e8f-4b64-8d2f-1b8e2c3d4e5f',
    agent: 'demo',
    tool: 'send_message',
    target: { target_type: 'contact', target_id: 'ct_alice', display_name: 'Alice Martin' },
    source: 'bridge',
    content_sha256: 'a'.repeat(64),
    file_sha256: null,
    excerpt: 'hello',
    excerpt_truncated: false,
    file: null,
    status: 'pending',
    review_url: null,
    expires_at: '2026-12-05T10:00:00.000Z',
    approvers: [],
    decided_by: null,
    note: null,
  };

  it('in the e-mail, on a line of its own', () => {
    assert.match(bodyOf(notice), /^Source: +bridge$/m);
    assert.match(bodyOf({ ...notice, source: null }), /^Source: +\(not recorded\)$/m);
  });

  it("in the webhook's JSON, beside the target", () => {
    const body = JSON.parse(webhookBody(notice)) as Record<string, unknown>;
    assert.equal(body.source, 'bridge');
  });

  it("in Slack's request message, as a field beside the target", () => {
    const fields = requestBlocks(notice).flatMap((b) =>
      'fields' in b ? (b.fields as { text: string }[]) : [],
    );
    assert.ok(
      fields.some((f) => f.text === '*Source*\nbridge'),
      JSON.stringify(fields),
    );
  });
});
