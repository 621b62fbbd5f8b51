import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';
import type { Client } from '@modelcontextprotocol/client';

for (const kind of databaseKinds()) {
  describe(`countersign user and approvals commands on ${kind}`, () => {
    let server: TestServer;
    let client: Client;
    // PGlite: the in-process server holds the database, so the CLI goes through its admin endpoint.
    const as = (_user: string, password: string) => ({ ...server.env, COUNTERSIGN_PASSWORD: password });

    before(async () => {
      server = await startTestServer(kind);
      client = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await client?.close();
      await server?.stop();
    });

    it('adds users with a password from stdin, refusing short passwords and unknown roles', async () => {
      const ok = await runCli(['user', 'add', 'nadia', '--role', 'chair'], server.env, {
        input: 'a long enough password\n',
      });
      assert.equal(ok.code, 0, ok.stderr);
      assert.match(ok.stdout, /user "nadia" created with roles chair/);
      const audit = await runCli(['user', 'add', 'omar', '--role', 'compliance,admin'], server.env, {
        input: 'another password\n',
      });
      assert.equal(audit.code, 0, audit.stderr);
      const short = await runCli(['user', 'add', 'pia', '--role', 'chair'], server.env, { input: 'short\n' });
      assert.equal(short.code, 1);
      assert.match(short.stderr, /password: at least 8 characters/);
      const role = await runCli(['user', 'add', 'quinn', '--role', 'king'], server.env, {
        input: 'a long enough password\n',
      });
      assert.equal(role.code, 2);
      assert.match(role.stderr, /--role/);
      const dup = await runCli(['user', 'add', 'nadia', '--role', 'chair'], server.env, {
        input: 'a long enough password\n',
      });
      assert.equal(dup.code, 1);
      assert.match(dup.stderr, /already exists/);
      const stored = await server.sql('users').where({ name: 'nadia' }).first();
      assert.match(stored.password_hash, /^scrypt\$/);
      assert.ok(!JSON.stringify(stored).includes('a long enough password'));
    });

    it('lists, shows, rejects and approves as a chair; refuses wrong passwords, non-chairs and agent tokens', async () => {
      const draft = await call(client, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_wang',
        content_text: '王伟你好 — approve me from the CLI',
      });
      const id: string = draft.approval.approval_request_id;
      const chair = as('nadia', 'a long enough password');

      const list = await runCli(['approvals', 'list', '--as', 'nadia'], chair);
      assert.equal(list.code, 0, list.stderr);
      assert.match(
        list.stdout,
        new RegExp(`^${id}\\tpending\\tisphere_send_message\\tdemo\\tcontact:ct_wang`, 'm'),
      );
      const show = await runCli(['approvals', 'show', id, '--as', 'nadia'], chair);
      assert.match(show.stdout, /王伟你好 — approve me from the CLI/);

      const wrong = await runCli(
        ['approvals', 'approve', id, '--as', 'nadia'],
        as('nadia', 'not the password'),
      );
      assert.equal(wrong.code, 1);
      assert.match(wrong.stderr, /wrong user name or password/);
      const token = await runCli(['approvals', 'approve', id, '--as', 'demo'], as('demo', server.demoToken));
      assert.equal(token.code, 1, 'an agent token can never decide');
      const auditor = await runCli(
        ['approvals', 'approve', id, '--as', 'omar'],
        as('omar', 'another password'),
      );
      assert.equal(auditor.code, 1);
      assert.match(auditor.stderr, /not_chair/);
      const noNote = await runCli(['approvals', 'reject', id, '--as', 'nadia'], chair);
      assert.equal(noNote.code, 2);
      assert.match(noNote.stderr, /reject needs --note/);

      const approve = await runCli(['approvals', 'approve', id, '--as', 'nadia', '--note', 'ok'], chair);
      assert.equal(approve.code, 0, approve.stderr);
      const approvalId = approve.stdout.trim().split('\n').at(-1)!;
      assert.match(approvalId, /^[0-9a-f-]{36}$/);
      const got = await call(client, 'isphere_get_approval', { approval_request_id: id });
      assert.equal(got.approval.approval_id, approvalId);
      assert.deepEqual(got.approval.approvers, ['nadia']);

      const draft2 = await call(client, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_wang',
        content_text: 'no',
      });
      const reject = await runCli(
        ['approvals', 'reject', draft2.approval.approval_request_id, '--as', 'nadia', '--note', 'not now'],
        chair,
      );
      assert.equal(reject.code, 0, reject.stderr);
      assert.match(reject.stdout, /is rejected/);
      const rejected = await runCli(['approvals', 'list', '--as', 'nadia', '--status', 'rejected'], chair);
      assert.match(rejected.stdout, new RegExp(draft2.approval.approval_request_id));
    });

    it('counts wrong passwords at the CLI like the web form: audited, then locked out, the right one included', async () => {
      const made = await runCli(['user', 'add', 'lena', '--role', 'chair'], server.env, {
        input: 'lena-right-password\n',
      });
      assert.equal(made.code, 0, made.stderr);
      const list = (password: string) => runCli(['approvals', 'list', '--as', 'lena'], as('lena', password));
      // The default limit: 5 failures in 15 minutes per user name.
      for (let i = 0; i < 5; i++) {
        const wrong = await list(`wrong-${i}`);
        assert.equal(wrong.code, 1);
        assert.match(wrong.stderr, /wrong user name or password/);
      }
      const locked = await list('lena-right-password');
      assert.equal(locked.code, 1, 'the right password is refused while locked out');
      assert.match(locked.stderr, /too many failed sign-ins/);
      const rows = await server.sql('audit_events').where({ kind: 'user.login_failed', actor: 'lena' });
      assert.equal(rows.length, 5);
      for (const row of rows) {
        const details = typeof row.details === 'string' ? JSON.parse(row.details) : row.details;
        assert.equal(details.via, 'cli');
        assert.match(details.ip, /^cli@/);
      }
    });
  });
}
