import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import type { Client } from '@modelcontextprotocol/client';
import { createCheckpoint } from '../../src/audit/checkpoints.ts';
import { checkpointDeps, verifyDatabase } from '../../src/audit/context.ts';
import { isAppError } from '../../src/core/errors.ts';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { databaseKinds } from '../helpers/db.ts';
import {
  call,
  connectHttp,
  startTestServer,
  type Envelope,
  type TestServer,
  checkpointDepsOf,
} from '../helpers/server.ts';
import { appendRows, deleteNewest, rewriteRow } from '../helpers/tamper.ts';

const refusal = (res: Envelope) => [res.ok, res.error?.code, res.error?.reason];

/**
 * What a database administrator with SQL and no shell on the host can no longer do: approve a write,
 * use an approval twice, or rename the log so that its anchors are taken for another log's. Plain SQL
 * as the table owner, as that administrator would type it.
 */
for (const kind of databaseKinds()) {
  describe(`the database is storage, not a trust root, on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chair: User;

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
      chair = await createUser(server.sql, {
        name: 'root-chair',
        roles: ['chair'],
        password: 'root pw 1',
      });
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    const knex = () => server.sql;
    const draft = async (content_text: string) => {
      const args = { target_type: 'contact', target_id: 'ct_david', content_text };
      const res = await call(agent, 'isphere_send_message', args);
      assert.equal(res.ok, true, JSON.stringify(res.error));
      return { args, request: res.approval.approval_request_id as string, res };
    };
    const execute = (
      args: Record<string, unknown>,
      approval_id: string,
      extra: Record<string, unknown> = {},
    ) => call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id, ...extra });
    const sentFor = async (approvalId: string) =>
      Number((await knex()('messages').where({ write_key: approvalId }).count({ n: '*' }).first())?.n);
    const auditedAs = async (res: Envelope) => {
      const row = await knex()('audit_events').where({ seq: res.audit.audit_seq }).first();
      return [row.error_code, detailsOf(row).reason];
    };

    it('refuses (TAMPERED) a request set to approved by SQL, in a preflight and a real run, and sends nothing', async () => {
      const { args, request } = await draft('approved by nobody');
      const approvalId = randomUUID();
      const expires = new Date(Date.now() + 3600_000).toISOString();
      await knex().raw(
        `update approval_requests set status = 'approved', approval_id = ?, decided_at = now(), expires_at = ?
         where id = ?`,
        [approvalId, expires, request],
      );
      const check = await call(agent, 'isphere_send_message', { ...args, approval_id: approvalId });
      assert.deepEqual(
        [check.preflight.would_execute, check.preflight.code, check.preflight.reason],
        [false, 'TAMPERED', 'decision_unsealed'],
      );
      for (const extra of [{}, { idempotency_key: 'forged-approval' }]) {
        const res = await execute(args, approvalId, extra);
        assert.deepEqual(refusal(res), [false, 'TAMPERED', 'decision_unsealed']);
        assert.deepEqual(await auditedAs(res), ['TAMPERED', 'decision_unsealed']);
      }
      assert.equal(await sentFor(approvalId), 0, 'nothing delivered');
      const started = await knex()('audit_events').where({
        approval_request_id: request,
        kind: 'write.started',
      });
      assert.equal(started.length, 0);
    });

    it('refuses an approved request whose expiry or approvers were changed by SQL', async () => {
      const late = await draft('approved, then given a longer life');
      const lateId = await approveAsChair({ approvals: server.services.approvals, user: chair }, late.res);
      await knex().raw(
        `update approval_requests set expires_at = expires_at + interval '30 days' where id = ?`,
        [late.request],
      );
      assert.deepEqual(refusal(await execute(late.args, lateId)), [false, 'TAMPERED', 'decision_forged']);
      assert.equal(await sentFor(lateId), 0);

      const more = await draft('approved, then given another approver');
      const moreId = await approveAsChair({ approvals: server.services.approvals, user: chair }, more.res);
      await knex().raw(
        `insert into approval_decisions (id, approval_request_id, user_name, decision, created_at)
         values (?, ?, 'admin', 'approve', now())`,
        [randomUUID(), more.request],
      );
      assert.deepEqual(refusal(await execute(more.args, moreId)), [false, 'TAMPERED', 'decision_forged']);
      assert.equal(await sentFor(moreId), 0);
    });

    it('executes a chair’s approval once: a status set back to approved by SQL does not execute it again', async () => {
      const { args, request, res } = await draft('sent once, whatever the row says');
      const approvalId = await approveAsChair({ approvals: server.services.approvals, user: chair }, res);
      const first = await execute(args, approvalId);
      assert.equal(first.ok, true, JSON.stringify(first.error));
      assert.equal(first.send_status, 'sent');
      await knex().raw(
        `update approval_requests set status = 'approved', execution_started_at = null,
         execution_finished_at = null, execution_result = null where id = ?`,
        [request],
      );
      for (const extra of [{}, { idempotency_key: 'second-go' }]) {
        const again = await execute(args, approvalId, extra);
        assert.deepEqual(refusal(again), [false, 'TAMPERED', 'consumed']);
      }
      assert.equal(await sentFor(approvalId), 1, 'one message, not two');
    });

    it('opens nothing for a web session inserted by SQL, and still does for a session it made', async () => {
      const page = (cookie: string) =>
        fetch(new URL('/approvals', server.url), {
          headers: { cookie: `cs_session=${cookie}` },
          redirect: 'manual',
        });
      const own = await server.services.sessions.create(chair);
      assert.equal((await page(own.id)).status, 200);
      const planted = randomBytes(32).toString('base64url');
      const now = new Date().toISOString();
      await knex()('web_sessions').insert({
        id_hash: createHash('sha256').update(planted).digest('hex'),
        user_id: chair.id,
        csrf_token: randomBytes(32).toString('base64url'),
        created_at: now,
        last_seen_at: now,
      });
      assert.equal((await page(planted)).status, 303, 'sent to sign in');
    });

    it('never signs a chain whose stored origin was changed after a rewrite, and verify --db says why', async () => {
      const deps = checkpointDepsOf(server);
      await appendRows(server.services.audit, 20);
      await createCheckpoint(deps);
      const target = Number((await knex()('audit_events').max({ m: 'seq' }).first())?.m) - 5;
      // The whole attack: rewrite a row and re-hash, delete every checkpoint, rename the log.
      await rewriteRow(knex(), target, { forged: true });
      await knex()('audit_checkpoints').delete();
      await knex().raw(
        `update server_secrets set value = 'countersign:forged-log' where name = 'audit_origin'`,
      );
      await appendRows(server.services.audit, 1);

      // A start after the change (new checkpoint deps, as a restarted replica makes them).
      const restarted = await checkpointDeps(knex(), server.services.audit, server.services.config);
      assert.equal(restarted.origin, server.services.checkpoints.origin, 'the log keeps the pinned origin');
      assert.equal(restarted.guard?.tampered()?.reason, 'origin_mismatch');
      await assert.rejects(createCheckpoint(restarted), (err) =>
        isAppError(err, 'TAMPERED', 'origin_mismatch'),
      );
      await assert.rejects(createCheckpoint(deps), (err) => isAppError(err, 'TAMPERED', 'origin_mismatch'));
      const report = await verifyDatabase(knex(), [], server.services.config);
      assert.equal(report.ok, false);
      assert.match(report.summary, /origin/);
    });
    it('finds the rows it answered with deleted at its next append, and never signs the shorter chain', async () => {
      // A server of its own: the other attacks leave theirs TAMPERED already.
      const own = await startTestServer(kind);
      const client = await connectHttp(own.url, own.demoToken);
      try {
        const told = await call(client, 'isphere_search_contacts', { query: 'david' });
        const seq = told.audit.audit_seq as number;
        await appendRows(own.services.audit, 3);
        // Rows the server appended and told an agent of, cut from the tail (nothing signed yet).
        await deleteNewest(own.sql, seq - 2);
        const next = await call(client, 'isphere_search_contacts', { query: 'david' });
        assert.equal(next.ok, true);
        const health = (await (await fetch(new URL('/healthz', own.url))).json()) as {
          audit_chain: { state: string; reason?: string };
        };
        assert.deepEqual([health.audit_chain.state, health.audit_chain.reason], ['tampered', 'rows_deleted']);
        await assert.rejects(own.services.checkpoints.checkpoint(), (err) =>
          isAppError(err, 'TAMPERED', 'rows_deleted'),
        );
      } finally {
        await client.close();
        await own.stop();
      }
    });
  });
}
