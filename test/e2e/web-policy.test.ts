import assert from 'node:assert/strict';
import { runAdminCommand } from '../../src/admin/commands.ts';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import { WebClient } from '../helpers/browser-less.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

const POLICY = {
  rules: [
    {
      name: 'Payments over EUR 10,000',
      when: 'content.text.find("EUR ([0-9]+)") != "" && int(content.text.find("EUR ([0-9]+)")) > 10000',
      then: { require: { approvers: 2, roles: ['finance'] } },
    },
  ],
};

for (const kind of databaseKinds()) {
  describe(`approval rules in the web pages on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let id: string;
    const signedIn = async (name: string) => {
      const web = new WebClient(server.url);
      const res = await web.login(name, `${name} password`);
      assert.equal(res.res.status, 303);
      return web;
    };

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
      for (const name of ['fin-one', 'fin-two', 'outsider'])
        await createUser(server.sql, { name, roles: ['chair'], password: `${name} password` });
      await createUser(server.sql, {
        name: 'auditor',
        roles: ['compliance'],
        password: 'auditor password',
      });
      for (const name of ['fin-one', 'fin-two'])
        await runAdminCommand(server.services.admin, {
          command: 'user.set_teams',
          name,
          teams: ['finance'],
          actor: 'test',
        });
      await server.services.approvals.policy.set(POLICY, 'test');
      const draft = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text: 'pay EUR 40000 to the supplier',
      });
      id = draft.approval.approval_request_id;
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    it('names the rule and the progress on the review page, with the form for a chair it names', async () => {
      const web = await signedIn('fin-one');
      const page = await web.get(`/approvals/${id}`);
      assert.match(page.html, /Payments over EUR 10,000: 2 of finance/);
      assert.match(page.html, /0 of 2 from finance/);
      assert.match(page.html, /value="approve"/);
      const form = { _csrf: WebClient.field(page.html, '_csrf'), decision: 'approve', note: '' };
      assert.equal((await web.post(`/approvals/${id}/decision`, form)).res.status, 303);
      assert.match((await web.get(`/approvals/${id}`)).html, /1 of 2 from finance/);
    });

    it('shows a chair outside the rule the request read-only with the reason, and refuses a forged decision', async () => {
      const web = await signedIn('outsider');
      const page = await web.get(`/approvals/${id}`);
      assert.match(
        page.html,
        /read-only: approval rule &quot;Payments over EUR 10,000&quot; asks for holders of finance/,
      );
      assert.doesNotMatch(page.html, /value="approve"/);
      const forged = await web.post(`/approvals/${id}/decision`, {
        _csrf: WebClient.field(page.html, '_csrf'),
        decision: 'approve',
        note: '',
      });
      assert.equal(forged.res.status, 403);
      const decisions = await server.sql('approval_decisions').where({ approval_request_id: id });
      assert.deepEqual(
        decisions.map((d) => d.user_name),
        ['fin-one'],
      );
    });

    it('filters the queue to what waits for me', async () => {
      const mine = async (name: string) =>
        (await (await signedIn(name)).get('/approvals?status=pending&mine=1')).html;
      assert.match(await mine('fin-two'), new RegExp(id));
      assert.doesNotMatch(await mine('fin-one'), new RegExp(id), 'already decided');
      assert.doesNotMatch(await mine('outsider'), new RegExp(id), 'not in finance');
      assert.match(
        (await (await signedIn('outsider')).get('/approvals?status=pending')).html,
        new RegExp(id),
      );
    });

    it('shows the policy in force and its version to admin and compliance users only', async () => {
      const version = (await server.services.approvals.policy.current()).version;
      const page = await (await signedIn('auditor')).get('/admin/policy');
      assert.equal(page.res.status, 200);
      assert.match(page.html, new RegExp(version));
      assert.match(page.html, /Payments over EUR 10,000/);
      assert.match(page.html, /the database/);
      assert.equal((await (await signedIn('outsider')).get('/admin/policy')).res.status, 403);
    });
  });
}
