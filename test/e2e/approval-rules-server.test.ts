import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import { loadConfig } from '../../src/config.ts';
import { isAppError } from '../../src/core/errors.ts';
import type { User } from '../../src/core/identity.ts';
import { startHttpServer } from '../../src/app/serve-http.ts';
import { createLogger } from '../../src/log.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { runCli } from '../helpers/cli.ts';
import type { Notice } from '../../src/approval/outbox.ts';
import { bodyOf } from '../../src/notify/email.ts';
import { requestBlocks } from '../../src/notify/slack-blocks.ts';
import { createTestDatabase, databaseKinds } from '../helpers/db.ts';
import {
  call,
  connectHttp,
  startTestServer,
  testEnv,
  type Envelope,
  type TestServer,
} from '../helpers/server.ts';

const refusal = (res: Envelope) => [res.ok, res.error?.code, res.error?.reason];

const rule = (name: string, when: string, then: unknown) => ({ name, when, then });

for (const kind of databaseKinds()) {
  describe(`approval rules through the server on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chairs: User[];

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
      chairs = [];
      for (const name of ['rule-chair-a', 'rule-chair-b', 'rule-chair-c']) {
        chairs.push(await createUser(server.sql, { name, roles: ['chair'], password: `${name} pw 1` }));
      }
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    const setPolicy = (rules: unknown[]) => server.services.approvals.policy.set({ rules }, 'test-admin');
    const approve = (id: string, user: User) =>
      server.services.approvals.decide({ id, user, decision: 'approve' });
    const draft = (content_text: string) =>
      call(agent, 'isphere_send_message', { target_type: 'contact', target_id: 'ct_david', content_text });
    const execute = (content_text: string, approval_id: string) =>
      call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text,
        dry_run: false,
        approval_id,
      });
    const requestRow = (id: string) => server.sql('approval_requests').where({ id }).first();

    it('refuses a write a rule denies at the dry run, with the rule and reason, and audits it', async () => {
      await setPolicy([
        rule('No payroll', 'content.normalized.contains("payroll")', {
          deny: { reason: 'payroll goes by the HR system' },
        }),
      ]);
      const res = await draft('Here is the PAY\u200bROLL file');
      assert.deepEqual(refusal(res), [false, 'PERMISSION_DENIED', 'policy_denied']);
      assert.match(res.error.message, /No payroll/);
      const row = await server.sql('audit_events').where({ seq: res.audit.audit_seq }).first();
      assert.equal(row.error_code, 'PERMISSION_DENIED');
      assert.equal(detailsOf(row).reason, 'policy_denied');
      const ok = await draft('nothing about pay');
      assert.equal(ok.ok, true);
    });

    it('records the rule and asks its number of approvers', async () => {
      await setPolicy([
        rule(
          'Payments over EUR 10,000',
          'content.text.find("EUR ([0-9]+)") != "" && int(content.text.find("EUR ([0-9]+)")) > 10000',
          { require: { approvers: 2 } },
        ),
      ]);
      const res = await draft('Please pay EUR 25000 today');
      assert.equal(res.ok, true);
      const id = res.approval.approval_request_id;
      const row = await requestRow(id);
      assert.equal(row.policy_rule, 'Payments over EUR 10,000');
      assert.equal(row.required_approvers, 2);
      assert.equal(
        row.policy_version,
        server.services.approvals.policy && (await server.services.approvals.policy.current()).version,
      );
      assert.equal((await approve(id, chairs[0]!)).status, 'pending');
      const done = await approve(id, chairs[1]!);
      assert.equal(done.status, 'approved');
      const sent = await execute('Please pay EUR 25000 today', done.approval_id!);
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
      const small = await draft('Please pay EUR 50 today');
      assert.equal((await requestRow(small.approval.approval_request_id)).required_approvers, 1);
    });

    it('lets a write through without review as approved by policy:<rule>, audited', async () => {
      await setPolicy([
        rule('Greetings', 'content.normalized == "good morning"', {
          allow_without_review: { reason: 'a greeting' },
        }),
      ]);
      const res = await draft('Good morning');
      assert.equal(res.ok, true);
      assert.equal(res.approval.status, 'approved');
      const id = res.approval.approval_request_id;
      const got = await call(agent, 'isphere_get_approval', { approval_request_id: id });
      const sent = await execute('Good morning', got.approval.approval_id);
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
      const approved = await server
        .sql('audit_events')
        .where({ approval_request_id: id, kind: 'approval.approved' })
        .first();
      assert.equal(approved.actor, 'policy:Greetings');
      assert.equal(detailsOf(approved).policy_version, (await requestRow(id)).policy_version);
    });

    it('refuses an execution the policy now asks more of, and the request waits again', async () => {
      await setPolicy([]);
      const text = 'stricter after approval';
      const res = await draft(text);
      const id = res.approval.approval_request_id;
      const approvalId = (await approve(id, chairs[0]!)).approval_id!;
      await setPolicy([rule('Two for david', 'target.id == "ct_david"', { require: { approvers: 2 } })]);
      const refused = await execute(text, approvalId);
      assert.deepEqual(refusal(refused), [false, 'APPROVAL_REQUIRED', 'policy_changed']);
      const row = await requestRow(id);
      assert.equal(row.status, 'pending');
      assert.equal(row.required_approvers, 2);
      assert.equal(row.policy_rule, 'Two for david');
      const reopened = await server
        .sql('audit_events')
        .where({ approval_request_id: id, kind: 'approval.reopened' })
        .first();
      assert.equal(detailsOf(reopened).reason, 'policy_changed');
      const again = await approve(id, chairs[1]!);
      assert.equal(again.status, 'approved');
      const sent = await execute(text, again.approval_id!);
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
    });

    it('lets an execution through when the changed policy asks the same or less', async () => {
      await setPolicy([rule('Two for david', 'target.id == "ct_david"', { require: { approvers: 2 } })]);
      const text = 'looser after approval';
      const id = (await draft(text)).approval.approval_request_id;
      await approve(id, chairs[0]!);
      const approvalId = (await approve(id, chairs[1]!)).approval_id!;
      await setPolicy([]);
      const sent = await execute(text, approvalId);
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
    });

    it('does not apply a policy edited by hand in the database: it is TAMPERED (docs/policy.md)', async () => {
      await setPolicy([]);
      const text = 'approved, then the stored policy edited by hand';
      const id = (await draft(text)).approval.approval_request_id;
      const approvalId = (await approve(id, chairs[0]!)).approval_id!;
      const knex = server.sql;
      const stored = await knex('settings').where({ name: 'approval_policy' }).first();
      const value = typeof stored.value === 'string' ? JSON.parse(stored.value) : stored.value;
      // The document changes; the version and the seal written beside it stay as they were.
      value.doc.rules = [rule('Edited in SQL', 'true', { require: { approvers: 3 } })];
      await knex('settings')
        .where({ name: 'approval_policy' })
        .update({ value: JSON.stringify(value) });
      // What applies instead asks a human's review of every write, no more than the approval had.
      const sent = await execute(text, approvalId);
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
      const next = await draft('drafted under the edited policy');
      const row = await requestRow(next.approval.approval_request_id);
      assert.deepEqual([row.status, row.required_approvers, row.policy_rule], ['pending', 1, null]);
      const tampered = await knex('audit_events').where({ kind: 'policy.tampered' }).first();
      assert.equal(tampered.error_code, 'TAMPERED');
      await setPolicy([]);
    });

    it('counts only approvers holding a role the rule asks for; others are refused', async () => {
      for (const name of ['rule-chair-a', 'rule-chair-b']) {
        const res = await runCli(['user', 'set', name, '--team', 'finance'], server.env);
        assert.equal(res.code, 0, res.stderr);
      }
      await setPolicy([
        rule('Finance pays', 'content.normalized.contains("invoice")', {
          require: { approvers: 2, roles: ['finance'] },
        }),
      ]);
      const text = 'Invoice 42 to be paid';
      const id = (await draft(text)).approval.approval_request_id;
      await assert.rejects(approve(id, chairs[2]!), (err: unknown) =>
        isAppError(err, 'PERMISSION_DENIED', 'not_eligible'),
      );
      assert.equal((await approve(id, chairs[0]!)).status, 'pending');
      const done = await approve(id, chairs[1]!);
      assert.equal(done.status, 'approved');
      assert.equal((await execute(text, done.approval_id!)).ok, true);
      const changed = await server
        .sql('audit_events')
        .where({ kind: 'user.teams_changed' })
        .orderBy('seq', 'desc')
        .first();
      assert.deepEqual(detailsOf(changed).teams_after, ['finance']);
    });

    it('counts again only the eligible approvals of a request the policy sent back', async () => {
      await setPolicy([]);
      const text = 'approved by anyone, then finance only';
      const id = (await draft(text)).approval.approval_request_id;
      const approvalId = (await approve(id, chairs[2]!)).approval_id!;
      await setPolicy([
        rule('Finance only', 'content.text.contains("finance only")', {
          require: { approvers: 1, roles: ['finance'] },
        }),
      ]);
      assert.deepEqual(refusal(await execute(text, approvalId)), [
        false,
        'APPROVAL_REQUIRED',
        'policy_changed',
      ]);
      const again = await approve(id, chairs[0]!);
      assert.equal(again.status, 'approved');
      assert.equal((await execute(text, again.approval_id!)).ok, true);
    });

    it('refuses an execution whose approver left the team the rule asks for', async () => {
      const setTeams = async (name: string, teams: string[]) => {
        const res = await runCli(['user', 'set', name, '--team', teams.join(',') || 'none'], server.env);
        assert.equal(res.code, 0, res.stderr);
      };
      await setTeams('rule-chair-c', ['treasury']);
      await setPolicy([
        rule('Treasury pays', 'content.normalized.contains("treasury transfer")', {
          require: { approvers: 1, roles: ['treasury'] },
        }),
      ]);
      const text = 'Treasury transfer 77';
      const id = (await draft(text)).approval.approval_request_id;
      const approvalId = (await approve(id, chairs[2]!)).approval_id!;
      const preflightOk = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text: text,
        approval_id: approvalId,
      });
      assert.equal(preflightOk.preflight.would_execute, true, JSON.stringify(preflightOk));
      await setTeams('rule-chair-c', []);
      // The dry run with the approval_id, and the real run, both say why.
      const preflight = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text: text,
        approval_id: approvalId,
      });
      const check = preflight.preflight;
      assert.deepEqual(
        [check.would_execute, check.code, check.reason],
        [false, 'APPROVAL_REQUIRED', 'approver_not_eligible'],
      );
      const refused = await execute(text, approvalId);
      assert.deepEqual(refusal(refused), [false, 'APPROVAL_REQUIRED', 'approver_not_eligible']);
      assert.equal((await requestRow(id)).status, 'approved');
      const sent = await server.sql('audit_events').where({ approval_request_id: id, kind: 'write.started' });
      assert.equal(sent.length, 0);
      // Drafting it again replaces the void request with a fresh one, for a chair of the team.
      const fresh = await draft(text);
      assert.notEqual(fresh.approval.approval_request_id, id);
      const expired = await server
        .sql('audit_events')
        .where({ approval_request_id: id, kind: 'approval.expired' })
        .first();
      assert.equal(detailsOf(expired).reason, 'approver_not_eligible');
      // Back on the team, the fresh request's approval executes.
      await setTeams('rule-chair-c', ['treasury']);
      const done = await approve(fresh.approval.approval_request_id, chairs[2]!);
      assert.equal((await execute(text, done.approval_id!)).ok, true);
    });

    it('lets no disguised write through a rule that allows everything without a word', async () => {
      await setPolicy([
        rule(
          'Small talk',
          '!content.skeleton.contains(skeleton("password")) && size(content.flags) == 0 && content.normalized.find("([0-9]{5,})") == ""',
          { allow_without_review: { reason: 'small talk' } },
        ),
      ]);
      assert.equal((await draft('see you soon at the cafe')).approval.status, 'approved');
      const dodges = [
        'my pass\uFE0Fword is hunter2', // a variation selector inside the word
        'my p\u0430ssword is hunter2', // a Cyrillic а
        'my \u202Edrowssap\u202C is hunter2', // reversed, and shown the right way round
        'pay \u0665\u0660\u0660\u0660\u0660 now', // Arabic-Indic 50000
        'my ｐａｓｓｗｏｒｄ is hunter2', // full-width
      ];
      for (const text of dodges) {
        const res = await draft(text);
        assert.equal(res.ok, true, JSON.stringify(res.error));
        assert.equal(res.approval.status, 'pending', text);
        assert.equal((await requestRow(res.approval.approval_request_id)).policy_rule, null, text);
      }
    });

    it('answers a catastrophic pattern on a long hostile text while another agent is served', async () => {
      const other = await createAgent(server.sql, { name: 'rule-bystander' });
      const bystander = await connectHttp(server.url, other.token);
      try {
        // On a backtracking engine this pattern takes seconds for 30 characters (×4 per two more).
        await setPolicy([
          rule('Plain words pass', 'content.text.matches("^(\\\\w+\\\\s?)*$")', {
            allow_without_review: { reason: 'plain words' },
          }),
        ]);
        const plain = await draft('plain words only');
        assert.equal(plain.approval.status, 'approved');
        const hostile = 'a'.repeat(60_000) + '!';
        const [res, read] = await Promise.all([
          draft(hostile),
          call(bystander, 'isphere_search_contacts', { query: 'david' }),
        ]);
        assert.equal(read.ok, true, JSON.stringify(read.error));
        // Answered by RE2 (no match) or, past the rule's budget, failing safe: either way a chair reviews.
        assert.equal(res.ok, true, JSON.stringify(res.error));
        assert.equal(res.approval.status, 'pending');
        assert.equal((await requestRow(res.approval.approval_request_id)).policy_rule, null);
      } finally {
        await bystander.close();
      }
    });

    it('refuses a rule whose pattern RE2 cannot run, naming the rule', async () => {
      for (const when of ['content.text.matches("(?=pay)")', 'content.text.find("(a)\\\\1") != ""']) {
        await assert.rejects(
          setPolicy([rule('Look-around', when, { deny: { reason: 'x' } })]),
          (err: unknown) =>
            isAppError(err, 'CONFIG_INVALID', 'rule_invalid') && /Look-around/.test(err.message),
        );
      }
    });

    it('approves a reopened request at once when the approvals it keeps meet the new rule ("1 of finance")', async () => {
      const res = await runCli(['user', 'set', 'rule-chair-a', '--team', 'finance'], server.env);
      assert.equal(res.code, 0, res.stderr);
      await setPolicy([]);
      const text = 'approved by finance, then 1 of finance';
      const id = (await draft(text)).approval.approval_request_id;
      const approvalId = (await approve(id, chairs[0]!)).approval_id!;
      await setPolicy([
        rule('One of finance', 'content.text.contains("1 of finance")', {
          require: { approvers: 1, roles: ['finance'] },
        }),
      ]);
      const refused = await execute(text, approvalId);
      assert.deepEqual(refusal(refused), [false, 'APPROVAL_REQUIRED', 'policy_changed']);
      // Counted again in the transaction that reopened it: the finance chair's approval is enough.
      assert.equal(refused.error.details.status, 'approved');
      const row = await requestRow(id);
      assert.deepEqual([row.status, row.policy_rule], ['approved', 'One of finance']);
      assert.equal(refused.error.details.approval_id, row.approval_id);
      assert.notEqual(row.approval_id, approvalId);
      const reapproved = await server
        .sql('audit_events')
        .where({ approval_request_id: id, kind: 'approval.approved', approval_id: row.approval_id })
        .first();
      assert.equal(detailsOf(reapproved).reevaluated, 'policy_changed');
      const sent = await execute(text, row.approval_id);
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
    });

    it('answers a repeated approval of a request short of nothing by approving it, audited as repeated', async () => {
      await setPolicy([]);
      const text = 'left pending with its approval';
      const id = (await draft(text)).approval.approval_request_id;
      assert.equal((await approve(id, chairs[1]!)).status, 'approved');
      // The state a request was left in when reopening did not count again: pending, its approval kept.
      await server.sql('approval_requests').where({ id }).update({ status: 'pending', approval_id: null });
      const again = await approve(id, chairs[1]!);
      assert.equal(again.status, 'approved');
      assert.ok(again.approval_id);
      const rows = await server
        .sql('audit_events')
        .where({ approval_request_id: id, kind: 'approval.approved' })
        .orderBy('seq');
      assert.equal(rows.length, 2);
      assert.equal(detailsOf(rows[1]).repeated, true);
      assert.equal(rows[1].approval_id, again.approval_id);
      assert.equal((await execute(text, again.approval_id!)).ok, true);
    });

    it('refuses a policy edit whose rule does not compile, naming it, and audits each change', async () => {
      const before = (await server.services.approvals.policy.current()).version;
      await assert.rejects(
        setPolicy([rule('Broken one', 'content.length > "ten"', { deny: { reason: 'x' } })]),
        (err: unknown) => isAppError(err, 'CONFIG_INVALID', 'rule_invalid') && /Broken one/.test(err.message),
      );
      assert.equal((await server.services.approvals.policy.current()).version, before);
      const { after: next } = await setPolicy([rule('r', 'false', { deny: { reason: 'x' } })]);
      const row = await server
        .sql('audit_events')
        .where({ kind: 'policy.changed' })
        .orderBy('seq', 'desc')
        .first();
      assert.equal(row.actor, 'test-admin');
      assert.deepEqual([detailsOf(row).version_before, detailsOf(row).version_after], [before, next]);
    });
  });

  describe(`notices of a request under an approval rule on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    before(async () => {
      // Nothing listens on port 9: the notices are queued (what is checked) and their delivery fails.
      server = await startTestServer(kind, {
        COUNTERSIGN_SMTP_HOST: '127.0.0.1',
        COUNTERSIGN_SMTP_PORT: '9',
        COUNTERSIGN_EMAIL_FROM: 'countersign@example.org',
        COUNTERSIGN_EMAIL_TO: 'chairs@example.org',
      });
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    it('names the rule and the progress in the e-mail and the Slack message', async () => {
      await server.services.approvals.policy.set(
        {
          rules: [
            rule('Payments over EUR 10,000', 'content.text.contains("EUR")', {
              require: { approvers: 2, roles: ['finance'] },
            }),
          ],
        },
        'test-admin',
      );
      const res = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text: 'pay EUR 20000',
      });
      const queued = await server
        .sql('notification_outbox')
        .where({ approval_request_id: res.approval.approval_request_id, channel: 'email' })
        .first();
      const notice = (
        typeof queued.payload === 'string' ? JSON.parse(queued.payload) : queued.payload
      ) as Notice;
      assert.match(bodyOf(notice), /Rule: {4}Payments over EUR 10,000: 2 of finance \(0 of 2 from finance\)/);
      assert.match(
        JSON.stringify(requestBlocks(notice)),
        /Who approves.*Payments over EUR 10,000: 2 of finance \(0 of 2 from finance\)/,
      );
    });
  });

  describe(`a config whose approval rule does not compile on ${kind}`, () => {
    it('stops start-up, naming the rule', async () => {
      const db = await createTestDatabase(kind);
      try {
        const file = path.join(db.dataDir, 'countersign.config.json');
        fs.mkdirSync(db.dataDir, { recursive: true });
        fs.writeFileSync(
          file,
          JSON.stringify({
            approval: {
              rules: { rules: [rule('Out of hours', 'time.hour > "18"', { require: { approvers: 2 } })] },
            },
          }),
        );
        const config = loadConfig({ ...testEnv(db), COUNTERSIGN_CONFIG: file }, db.dataDir);
        await assert.rejects(
          startHttpServer(config, createLogger('silent')),
          (err: unknown) =>
            isAppError(err, 'CONFIG_INVALID', 'rule_invalid') && /"Out of hours"/.test(err.message),
        );
      } finally {
        await db.drop();
      }
    });
  });
}
