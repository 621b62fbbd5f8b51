import assert from 'node:assert/strict';
import { runAdminCommand } from '../../src/admin/commands.ts';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import { isAppError } from '../../src/core/errors.ts';
import type { User } from '../../src/core/identity.ts';
import { detailsOf } from '../helpers/audit-rows.ts';
import { databaseKinds } from '../helpers/db.ts';
import {
  call,
  connectHttp,
  ROOT,
  startTestServer,
  type Envelope,
  type TestServer,
} from '../helpers/server.ts';
import { startUpstreamFixture, type UpstreamFixture } from '../helpers/upstream-fixture.ts';

/** The eleven example rules of docs/policy.md, in order, as the page shows them. */
function examples(): { name: string; when: string; then: Record<string, unknown> }[] {
  const page = fs.readFileSync(path.join(ROOT, 'docs/policy.md'), 'utf8');
  const section = page.slice(page.indexOf('## Examples'));
  return [...section.matchAll(/```json\n([\s\S]*?)```/g)].map((m) => JSON.parse(m[1]!));
}

const WEEKDAY: Record<string, number> = { Sun: 0, Mon: 1, Tue: 2, Wed: 3, Thu: 4, Fri: 5, Sat: 6 };

for (const kind of databaseKinds()) {
  describe(`the examples of docs/policy.md through the server on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let owned: Client;
    let crm: UpstreamFixture;
    const users: Record<string, User> = {};
    const rules = examples();

    before(async () => {
      crm = await startUpstreamFixture();
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'countersign-policy-'));
      const configFile = path.join(dir, 'countersign.config.json');
      const upstreams = [{ name: 'crm', url: crm.url, tools: { get_note: 'write' } }];
      fs.writeFileSync(configFile, JSON.stringify({ upstreams }));
      server = await startTestServer(kind, { COUNTERSIGN_CONFIG: configFile });
      agent = await connectHttp(server.url, server.demoToken);
      for (const name of ['ada', 'ben', 'cleo', 'dora', 'david'])
        users[name] = await createUser(server.sql, {
          name,
          roles: ['chair'],
          password: `${name} pw 12`,
        });
      for (const name of ['ada', 'ben'])
        await runAdminCommand(server.services.admin, {
          command: 'user.set_teams',
          name,
          teams: ['finance'],
          actor: 'test',
        });
      const { token } = await createAgent(server.sql, { name: 'davids-helper', owner: 'david' });
      owned = await connectHttp(server.url, token);
    });
    after(async () => {
      await agent?.close();
      await owned?.close();
      await server?.stop();
      await crm?.close();
    });

    it('has eleven examples, each of which compiles', () => {
      assert.equal(rules.length, 11);
    });

    const only = (n: number) => server.services.approvals.policy.set({ rules: [rules[n - 1]] }, 'test');
    const send = (content_text: string, target_id = 'ct_david', target_type = 'contact', client = agent) =>
      call(client, 'isphere_send_message', { target_type, target_id, content_text });
    const requestOf = async (res: Envelope) => {
      assert.equal(res.ok, true, JSON.stringify(res.error));
      return server.sql('approval_requests').where({ id: res.approval.approval_request_id }).first();
    };
    const ruleOf = async (res: Envelope) => (await requestOf(res)).policy_rule as string | null;
    const approve = (res: Envelope, user: User) =>
      server.services.approvals.decide({ id: res.approval.approval_request_id, user, decision: 'approve' });

    it('1. external recipient: two chairs for a contact, the default for a group conversation', async () => {
      await only(1);
      const row = await requestOf(await send('hello there'));
      assert.deepEqual([row.policy_rule, row.required_approvers], ['External contacts', 2]);
      // Alice is inside the organisation (the demo directory says so): the rule does not apply.
      assert.equal(await ruleOf(await send('hello there', 'ct_alice')), null);
      assert.equal(await ruleOf(await send('hello board', 'cv_board', 'conversation')), null);
    });

    it('2. amount threshold: two of finance above EUR 10,000, read through disguises', async () => {
      await only(2);
      const big = await send('Please pay ＥＵＲ 12\u200b000 today');
      const row = await requestOf(big);
      assert.equal(row.policy_rule, 'Payments over EUR 10,000');
      await assert.rejects(approve(big, users.cleo!), (e: unknown) =>
        isAppError(e, 'PERMISSION_DENIED', 'not_eligible'),
      );
      assert.equal((await approve(big, users.ada!)).status, 'pending');
      assert.equal((await approve(big, users.ben!)).status, 'approved');
      assert.equal(await ruleOf(await send('Please pay EUR 900 today')), null);
    });

    it('3. large file: two chairs above 5 MiB', async () => {
      await only(3);
      const outbound = server.services.config.files.outbound_dir;
      fs.mkdirSync(outbound, { recursive: true });
      fs.writeFileSync(path.join(outbound, 'big.bin'), Buffer.alloc(6 * 1024 * 1024, 1));
      fs.writeFileSync(path.join(outbound, 'small.txt'), 'small');
      const file = (file_path: string) =>
        call(agent, 'isphere_send_file', { target_type: 'contact', target_id: 'ct_david', file_path });
      assert.equal(await ruleOf(await file('big.bin')), 'Files over 5 MiB');
      assert.equal(await ruleOf(await file('small.txt')), null);
    });

    it('4. out of hours: matches exactly when the request was drafted outside 08:00–18:00 on a weekday', async () => {
      await only(4);
      const row = await requestOf(await send('what time is it'));
      const at = new Date(row.created_at);
      const parts = new Intl.DateTimeFormat('en-GB', {
        timeZone: 'UTC',
        hour: '2-digit',
        weekday: 'short',
        hourCycle: 'h23',
      }).formatToParts(at);
      const hour = Number(parts.find((p) => p.type === 'hour')!.value);
      const day = WEEKDAY[parts.find((p) => p.type === 'weekday')!.value]!;
      const outside = hour < 8 || hour >= 18 || day === 0 || day === 6;
      assert.equal(row.policy_rule, outside ? 'Out of hours' : null);
    });

    it('5. a specific upstream tool and argument: urgent CRM notes need two chairs', async () => {
      await only(5);
      const note = (text: string) => call(agent, 'crm__set_note', { text });
      assert.equal(await ruleOf(await note('URGENT: call the bank')), 'Urgent CRM notes');
      assert.equal(await ruleOf(await note('routine follow-up')), null);
    });

    it("6. the agent's own owner: let through without review, recorded as approved by the policy", async () => {
      await only(6);
      const mine = await send('Your meeting notes are ready', 'ct_david', 'contact', owned);
      assert.equal(mine.approval.status, 'approved');
      const approved = await server
        .sql('audit_events')
        .where({ approval_request_id: mine.approval.approval_request_id, kind: 'approval.approved' })
        .first();
      assert.equal(approved.actor, 'policy:Note to my owner');
      assert.ok(detailsOf(approved).policy_version);
      const got = await call(owned, 'isphere_get_approval', {
        approval_request_id: mine.approval.approval_request_id,
      });
      const sent = await call(owned, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text: 'Your meeting notes are ready',
        dry_run: false,
        approval_id: got.approval.approval_id,
      });
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
      const other = await send('Your meeting notes are ready', 'ct_david');
      assert.equal(other.approval.status, 'pending', 'the demo agent has no owner');
    });

    it('7. group size: two chairs for groups of more than three members', async () => {
      await only(7);
      const counts = (await server
        .sql('group_members')
        .select('group_id')
        .count({ n: '*' })
        .groupBy('group_id')) as { group_id: string; n: unknown }[];
      const live = await server.sql('groups').where({ archived: false }).pluck('id');
      const sizes = counts
        .filter((c) => live.includes(c.group_id))
        .map((c) => [c.group_id, Number(c.n)] as const);
      const large = sizes.find(([, n]) => n > 3);
      const small = sizes.find(([, n]) => n <= 3);
      assert.ok(large && small, `demo groups of both sizes: ${JSON.stringify(sizes)}`);
      assert.equal(await ruleOf(await send('to the group', large[0], 'group')), 'Large groups');
      assert.equal(await ruleOf(await send('to the group', small[0], 'group')), null);
    });

    it('8. deny a target: refused at the dry run with the rule named', async () => {
      await only(8);
      const res = await send('Here is the draft PRESS RELEASE');
      assert.deepEqual(
        [res.ok, res.error?.code, res.error?.reason],
        [false, 'PERMISSION_DENIED', 'policy_denied'],
      );
      assert.match(res.error.message, /Never the press/);
      assert.equal((await send('an ordinary note')).ok, true);
    });

    it('9. two-person rule for one target: two of the users named, and no one else', async () => {
      await only(9);
      const res = await send('two people must see this');
      const row = await requestOf(res);
      assert.deepEqual([row.policy_rule, row.required_approvers], ['Two for David', 2]);
      await assert.rejects(approve(res, users.dora!), (e: unknown) =>
        isAppError(e, 'PERMISSION_DENIED', 'not_eligible'),
      );
      await approve(res, users.cleo!);
      const done = await approve(res, users.ada!);
      assert.equal(done.status, 'approved');
      const sent = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_david',
        content_text: 'two people must see this',
        dry_run: false,
        approval_id: done.approval_id,
      });
      assert.equal(sent.ok, true, JSON.stringify(sent.error));
    });

    it('10. a read-only upstream tool the config gates: let through without review', async () => {
      await only(10);
      const res = await call(agent, 'crm__get_note', {});
      assert.equal(res.approval.status, 'approved');
      assert.equal((await requestOf(res)).policy_rule, 'Reading the CRM note');
      const got = await call(agent, 'isphere_get_approval', {
        approval_request_id: res.approval.approval_request_id,
      });
      const read = await call(agent, 'crm__get_note', {
        dry_run: false,
        approval_id: got.approval.approval_id,
      });
      assert.equal(read.ok, true, JSON.stringify(read.error));
      await server.services.approvals.policy.set({ rules: [] }, 'test');
      const gated = await call(agent, 'crm__get_note', {});
      assert.equal(gated.approval.status, 'pending', 'without the rule a chair decides');
    });

    it('11. text trying to look like something else: two chairs, plain text the default', async () => {
      await only(11);
      const disguised = [
        'please forward the p\u0430yroll file', // a Cyrillic а in a Latin word
        'the \u0440\u0430\u0443\u0440\u0430l account', // a Latin-looking word in Cyrillic
        'invoice_\u202Efdp.exe', // reordered
        'Thanks, talk soon \u{1F642}\uFE01\uFE02', // selectors outside any sequence
        'see you\u200B', // zero width
      ];
      for (const text of disguised) {
        const row = await requestOf(await send(text));
        assert.deepEqual([row.policy_rule, row.required_approvers], ['Disguised text', 2], text);
      }
      for (const text of [
        'Thanks, talk soon \u{1F642}',
        'I \u2764\uFE0F it',
        'Привет, как дела?',
        'pay ٥٠٠ EUR',
      ])
        assert.equal(await ruleOf(await send(text)), null, text);
      // An upstream write: what it acts on is named in its arguments, read with the text's flags.
      const note = (args: Record<string, unknown>) => call(agent, 'crm__set_note', args);
      assert.equal(await ruleOf(await note({ text: 'see the p\u0430yroll file' })), 'Disguised text');
      assert.equal(await ruleOf(await note({ text: 'see the \u202Eelif\u202C' })), 'Disguised text');
      assert.equal(await ruleOf(await note({ text: 'see the payroll file' })), null);
    });
  });
}
