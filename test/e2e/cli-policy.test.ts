import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { runCli } from '../helpers/cli.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

const FINANCE = {
  timezone: 'Europe/Berlin',
  rules: [
    {
      name: 'Payments over EUR 10,000',
      when: 'content.text.find("EUR ([0-9]+)") != "" && int(content.text.find("EUR ([0-9]+)")) > 10000',
      then: { require: { approvers: 2, roles: ['finance'] } },
    },
  ],
};

for (const kind of databaseKinds()) {
  describe(`countersign policy commands on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let dir: string;
    const file = (name: string, doc: unknown) => {
      const p = path.join(dir, name);
      fs.writeFileSync(p, typeof doc === 'string' ? doc : JSON.stringify(doc));
      return p;
    };

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
      dir = fs.mkdtempSync(path.join(server.db.dataDir, 'policy-'));
      for (const name of ['fin-a', 'fin-b', 'plain-c'])
        await createUser(server.sql, { name, roles: ['chair'], password: `${name} password` });
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    it('checks a policy file: its version when every rule compiles, the failing rule named when not', async () => {
      const ok = await runCli(['policy', 'check', file('ok.json', FINANCE)], server.env);
      assert.equal(ok.code, 0, ok.stderr);
      assert.match(ok.stdout, /1 rule\(s\) compile; version [0-9a-f]{64}/);
      // Nobody holds the team yet: the rule compiles, and check says that no request could pass it.
      assert.match(
        ok.stderr,
        /warning: rule "Payments over EUR 10,000" asks 2 approval\(s\) from finance, but no active chair qualifies: .*countersign user set NAME --team TEAM/,
      );
      // A bare rule, or a list of rules, is not a policy: the refusal says how to wrap it.
      const bare = await runCli(['policy', 'check', file('bare.json', FINANCE.rules[0])], server.env);
      assert.equal(bare.code, 1);
      assert.match(bare.stderr, /this is one rule, not a policy: wrap it as \{"rules": \[/);
      const list = await runCli(['policy', 'check', file('list.json', FINANCE.rules)], server.env);
      assert.equal(list.code, 1);
      assert.match(list.stderr, /wrap the list as \{"rules": \[/);
      const bad = {
        rules: [{ name: 'After hours', when: 'time.hour > "18"', then: { require: { approvers: 2 } } }],
      };
      const no = await runCli(['policy', 'check', file('bad.json', bad)], server.env);
      assert.equal(no.code, 1);
      assert.match(no.stderr, /approval rule "After hours": no such overload/);
      const broken = await runCli(['policy', 'check', file('broken.json', '{ not json')], server.env);
      assert.equal(broken.code, 1);
      assert.match(broken.stderr, /not valid JSON/);
      // A pattern RE2 cannot run (a back-reference) is refused by check and by set, naming its rule.
      const backtracking = {
        rules: [
          {
            name: 'Repeated word',
            when: 'content.text.matches("(\\\\w+) \\\\1")',
            then: { deny: { reason: 'r' } },
          },
        ],
      };
      for (const command of ['check', 'set']) {
        const refused = await runCli(['policy', command, file('re2.json', backtracking)], server.env);
        assert.equal(refused.code, 1, command);
        assert.match(refused.stderr, /approval rule "Repeated word": matches\(\) pattern: RE2/, command);
      }
    });

    it('stores a policy (audited), shows it, and explains which rule a call meets without drafting', async () => {
      const set = await runCli(['policy', 'set', file('finance.json', FINANCE)], server.env);
      assert.equal(set.code, 0, set.stderr);
      assert.match(set.stderr, /warning: rule "Payments over EUR 10,000" asks 2 approval\(s\) from finance/);
      const version = /version ([0-9a-f]{64})/.exec(set.stdout)![1];
      const row = await server
        .sql('audit_events')
        .where({ kind: 'policy.changed' })
        .orderBy('seq', 'desc')
        .first();
      assert.equal(detailsOf(row).version_after, version);
      assert.match(row.actor, /^cli:/);
      const shown = await runCli(['policy', 'show'], server.env);
      assert.match(shown.stdout, new RegExp(`version ${version} \\(from the database\\)`));
      const before = await server.sql('approval_requests').count({ n: '*' }).first();
      const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'pay EUR 12000' };
      const explained = await runCli(
        [
          'policy',
          'explain',
          '--tool',
          'isphere_send_message',
          '--args',
          JSON.stringify(args),
          '--agent',
          'demo',
        ],
        server.env,
      );
      assert.equal(explained.code, 0, explained.stderr);
      assert.match(explained.stdout, /rule {5}Payments over EUR 10,000/);
      assert.match(explained.stdout, /asks {5}2 of finance/);
      const small = await runCli(
        [
          'policy',
          'explain',
          '--tool',
          'send_message',
          '--args',
          JSON.stringify({ ...args, content_text: 'hi' }),
        ],
        server.env,
      );
      assert.match(small.stdout, /none matches/);
      assert.match(small.stdout, /asks {5}1 chair/);
      // A file not yet applied: explained as it would decide, the policy in force unchanged.
      const draftPolicy = file('draft.json', {
        rules: [
          {
            name: 'No agent named',
            when: 'agent.name == "" && content.text == "hi"',
            then: { require: { approvers: 1, users: ['fin-a'] } },
          },
        ],
      });
      const fromFile = await runCli(
        [
          'policy',
          'explain',
          '--file',
          draftPolicy,
          '--tool',
          'send_message',
          '--args',
          JSON.stringify({ ...args, content_text: 'hi' }),
        ],
        server.env,
      );
      assert.equal(fromFile.code, 0, fromFile.stderr);
      assert.match(fromFile.stdout, /policy {3}.*draft\.json \(not applied\)/);
      assert.match(fromFile.stdout, /rule {5}No agent named/);
      assert.match(fromFile.stdout, /asks {5}1 of users fin-a/);
      assert.match((await runCli(['policy', 'show'], server.env)).stdout, new RegExp(`version ${version} `));
      const after = await server.sql('approval_requests').count({ n: '*' }).first();
      assert.deepEqual(after, before, 'nothing drafted');
      const badArgs = await runCli(
        ['policy', 'explain', '--tool', 'send_message', '--args', '[1'],
        server.env,
      );
      assert.equal(badArgs.code, 2);
    });

    it('shows chairs the rule and the progress, read-only to a chair outside it, and filters what waits for me', async () => {
      for (const name of ['fin-a', 'fin-b']) {
        const res = await runCli(['user', 'set', name, '--team', 'finance'], server.env);
        assert.equal(res.code, 0, res.stderr);
      }
      const draft = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text: 'pay EUR 20000 to the supplier',
      });
      const id = draft.approval.approval_request_id;
      const env = (name: string) => ({ ...server.env, COUNTERSIGN_PASSWORD: `${name} password` });
      const approved = await runCli(['approvals', 'approve', id, '--as', 'fin-a'], env('fin-a'));
      assert.equal(approved.code, 0, approved.stderr);
      assert.match(approved.stdout, new RegExp(`^${id} is pending \\(1 of 2 approvals\\)$`, 'm'));
      const shown = await runCli(['approvals', 'show', id, '--as', 'fin-b'], env('fin-b'));
      assert.match(shown.stdout, /rule {8}Payments over EUR 10,000: 2 of finance/);
      assert.match(shown.stdout, /\(1 of 2 from finance\)/);
      assert.doesNotMatch(shown.stdout, /read-only/);
      const outsider = await runCli(['approvals', 'show', id, '--as', 'plain-c'], env('plain-c'));
      assert.match(
        outsider.stdout,
        /read-only {3}approval rule "Payments over EUR 10,000" asks for holders of finance/,
      );
      const refused = await runCli(['approvals', 'approve', id, '--as', 'plain-c'], env('plain-c'));
      assert.equal(refused.code, 1);
      assert.match(refused.stderr, /not among/);
      const mine = (name: string) =>
        runCli(['approvals', 'list', '--as', name, '--waiting-for-me'], env(name)).then((r) => r.stdout);
      assert.match(await mine('fin-b'), new RegExp(id));
      assert.doesNotMatch(await mine('fin-a'), new RegExp(id), 'already decided by fin-a');
      assert.doesNotMatch(await mine('plain-c'), new RegExp(id), 'not in finance');
    });
  });
}
