import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import { closestName } from '../../src/core/closest.ts';
import type { User } from '../../src/core/identity.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type Envelope, type TestServer } from '../helpers/server.ts';

const GET = 'isphere_get_approval';

describe('the closest name, for a "did you mean"', () => {
  const tools = ['isphere_send_message', 'isphere_send_file', 'isphere_get_approval', 'crm__set_note'];
  it('suggests a near name, a name without its prefix, and nothing for one that is far from all', () => {
    assert.equal(closestName('isphere_send_mesage', tools), 'isphere_send_message');
    assert.equal(closestName('isphere_send_messages', tools), 'isphere_send_message');
    assert.equal(closestName('send_message', tools), 'isphere_send_message');
    assert.equal(closestName('get_approval', tools), 'isphere_get_approval');
    assert.equal(closestName('delete_everything', tools), undefined);
    assert.equal(closestName('', tools), undefined);
    assert.equal(closestName('x'.repeat(5000), tools), undefined);
  });
});

for (const kind of databaseKinds()) {
  describe(`refusals that say what to do next, on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chair: User;
    let text = 0;
    /** A message no other test drafted (an open request for the same content would be answered instead). */
    const message = () => ({
      target_type: 'contact',
      target_id: 'ct_david',
      content_text: `next steps ${++text}`,
    });
    const approvedFor = async (args: Record<string, unknown>) =>
      approveAsChair(
        { approvals: server.services.approvals, user: chair },
        await call(agent, 'isphere_send_message', args),
      );
    const run = (args: Record<string, unknown>, approval_id: string) =>
      call(agent, 'isphere_send_message', { ...args, dry_run: false, approval_id });
    const refusal = (res: Envelope) => [res.ok, res.error?.code, res.error?.reason];

    before(async () => {
      server = await startTestServer(kind);
      chair = await createUser(server.sql, {
        name: 'steps-chair',
        roles: ['chair'],
        password: 'steps chair pw 1',
      });
      agent = await connectHttp(server.url, server.demoToken);
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    it("a draft's next_step says who must approve, and names get_approval as the agent calls it", async () => {
      const res = await call(agent, 'isphere_send_message', message());
      assert.equal(res.ok, true);
      assert.match(
        res.approval.next_step,
        new RegExp(
          `^This request needs one approval from a chair, given in the web form at ${res.approval.review_url}; ` +
            `then ${GET} gives its approval_id; repeat this call with dry_run: false`,
        ),
      );

      await server.services.approvals.policy.set(
        {
          rules: [
            {
              name: 'finance pays',
              when: 'content.text.contains("invoice")',
              then: { require: { approvers: 2, roles: ['finance'] } },
            },
          ],
        },
        'test-admin',
      );
      try {
        const ruled = await call(agent, 'isphere_send_message', { ...message(), content_text: 'invoice 42' });
        assert.match(
          ruled.approval.next_step,
          /^This request needs 2 approvals from finance \(rule "finance pays"\), given/,
        );
      } finally {
        await server.services.approvals.policy.set({ rules: [] }, 'test-admin');
      }
    });

    it('consumed: says that an approval executes once, where to see what happened, and to draft again', async () => {
      const args = message();
      const id = await approvedFor(args);
      assert.equal((await run(args, id)).ok, true);
      const again = await run(args, id);
      assert.deepEqual(refusal(again), [false, 'APPROVAL_REQUIRED', 'consumed']);
      assert.match(
        again.error.message,
        new RegExp(`next: .*${GET} with this approval_id shows what happened`),
      );
      assert.match(again.error.message, /draft it again with dry_run: true for a new approval/);
      assert.deepEqual(again.error.details.next_step, { tool: GET, arguments: { approval_id: id } });

      // A dry run carrying the approval_id (preflight) says the same.
      const check = await call(agent, 'isphere_send_message', { ...args, approval_id: id });
      assert.equal(check.preflight.would_execute, false);
      assert.match(check.preflight.message, new RegExp(`next: .*${GET} with this approval_id`));
    });

    it('mismatch: says which binding differs and to repeat exactly the approved arguments or draft anew', async () => {
      const args = message();
      const id = await approvedFor(args);
      const other = await run({ ...args, content_text: `${args.content_text} (edited)` }, id);
      assert.deepEqual(refusal(other), [false, 'APPROVAL_REQUIRED', 'mismatch']);
      assert.equal(other.error.details.differs, 'content');
      assert.match(
        other.error.message,
        new RegExp(`repeat the call with exactly the approved arguments \\(${GET} shows`),
      );
      assert.match(other.error.message, /or draft these arguments with dry_run: true for a new approval/);
      assert.deepEqual(other.error.details.next_step, { tool: GET, arguments: { approval_id: id } });
    });

    it('unknown: says how to find the approval_id, without pointing at the id given', async () => {
      const res = await run(message(), randomUUID());
      assert.deepEqual(refusal(res), [false, 'APPROVAL_REQUIRED', 'unknown']);
      assert.match(
        res.error.message,
        new RegExp(`${GET} with your approval_request_id shows the approval_id`),
      );
      assert.equal(res.error.details?.next_step, undefined);
    });

    it('an unknown tool suggests the closest tool this agent may call', async () => {
      const refusedWith = async (name: string) => {
        try {
          await agent.callTool({ name, arguments: {} });
        } catch (err) {
          return err as Error & { data?: Record<string, unknown> };
        }
        assert.fail(`${name} was accepted`);
      };
      const typo = await refusedWith('isphere_send_mesage');
      assert.match(typo.message, /Unknown tool: isphere_send_mesage; did you mean isphere_send_message\?/);
      assert.equal(typo.data?.code, 'UNKNOWN_TOOL');
      assert.equal(typo.data?.did_you_mean, 'isphere_send_message');
      const bare = await refusedWith('get_approval');
      assert.equal(bare.data?.did_you_mean, GET);
      const far = await refusedWith('format_the_disk');
      assert.match(far.message, /tools\/list shows the tools this agent may call/);
      assert.equal(far.data?.did_you_mean, undefined);
    });

    it('tells a malformed Authorization header from a missing or an unknown token, each with the fix', async () => {
      const post = async (authorization?: string) => {
        const res = await fetch(new URL('/mcp', server.url), {
          method: 'POST',
          headers: {
            'Content-Type': 'application/json',
            Accept: 'application/json, text/event-stream',
            ...(authorization === undefined ? {} : { Authorization: authorization }),
          },
          body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
        });
        return { status: res.status, problem: (await res.json()) as { reason: string; detail: string } };
      };
      for (const header of [server.demoToken, `Token ${server.demoToken}`, 'Bearer', `Bearer a b`]) {
        const { status, problem } = await post(header);
        assert.equal(status, 401);
        assert.equal(problem.reason, 'malformed_authorization', header);
        assert.match(problem.detail, /send Authorization: Bearer <agent token>/);
      }
      const missing = await post();
      assert.equal(missing.problem.reason, 'missing_token');
      assert.match(missing.problem.detail, /countersign agent add NAME/);
      const unknown = await post('Bearer cs_not-a-real-token');
      assert.equal(unknown.problem.reason, 'unknown_token');
      assert.match(unknown.problem.detail, /countersign agent add NAME.*countersign agent rotate NAME/);
      const row = await server
        .sql('audit_events')
        .where({ kind: 'auth.denied' })
        .whereRaw("details->>'reason' = 'malformed_authorization'")
        .first();
      assert.ok(row, 'the malformed header is audited under its own reason');
    });
  });
}
