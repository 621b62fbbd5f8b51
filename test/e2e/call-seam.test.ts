import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@modelcontextprotocol/client';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { MAX_ARGUMENT_DEPTH } from '../../src/server/call.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type Envelope, type TestServer } from '../helpers/server.ts';

/** An object nested `depth` levels deep: {"a":{"a":…{}}}. */
function nested(depth: number): Record<string, unknown> {
  let value: Record<string, unknown> = {};
  for (let i = 1; i < depth; i++) value = { a: value };
  return value;
}

/**
 * tools/call with arguments given as raw JSON text: the SDK client cannot serialise 5,000 levels itself
 * (its JSON.stringify overflows first), but a hostile client can send them.
 */
async function rawCall(server: TestServer, argumentsJson: string) {
  const res = await fetch(new URL('/mcp', server.url), {
    method: 'POST',
    headers: {
      Authorization: `Bearer ${server.demoToken}`,
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      'MCP-Protocol-Version': '2025-11-25',
    },
    body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"isphere_search_contacts","arguments":${argumentsJson}}}`,
  });
  const text = await res.text();
  const json = text.startsWith('{') ? text : /^data: (.*)$/m.exec(text)?.[1];
  assert.ok(json, `${res.status}: ${text.slice(0, 200)}`);
  const message = JSON.parse(json) as { result?: { structuredContent: Envelope }; error?: unknown };
  assert.ok(message.result, JSON.stringify(message.error));
  return message.result.structuredContent;
}

for (const kind of databaseKinds()) {
  describe(`the call seam on ${kind}`, () => {
    let server: TestServer;
    let agent: Client;
    let chair: User;

    before(async () => {
      server = await startTestServer(kind);
      agent = await connectHttp(server.url, server.demoToken);
      chair = await createUser(server.sql, {
        name: 'seam-chair',
        roles: ['chair'],
        password: 'seam-password',
      });
    });
    after(async () => {
      await agent?.close();
      await server?.stop();
    });

    it(`refuses arguments nested deeper than ${MAX_ARGUMENT_DEPTH} levels before walking them, and audits the refusal`, async () => {
      // One level past the limit through the SDK client; 5,000 levels as raw JSON text.
      const past = await call(agent, 'isphere_search_contacts', {
        query: 'a',
        extra: nested(MAX_ARGUMENT_DEPTH),
      });
      const abyss = await rawCall(
        server,
        `{"query":"a","extra":${'{"a":'.repeat(5_000)}{}${'}'.repeat(5_000)}}`,
      );
      for (const res of [past, abyss]) {
        assert.deepEqual([res.ok, res.error.code, res.error.reason], [false, 'INVALID_ARGUMENT', 'too_deep']);
        const row = await server.sql('audit_events').where({ seq: res.audit.audit_seq }).first();
        assert.deepEqual([row.error_code, row.result], ['INVALID_ARGUMENT', 'error']);
      }
      // At the limit the arguments reach the schema, which names the unknown key.
      const within = await call(agent, 'isphere_search_contacts', {
        query: 'a',
        extra: nested(MAX_ARGUMENT_DEPTH - 1),
      });
      assert.deepEqual([within.error.code, within.error.reason], ['INVALID_ARGUMENT', 'invalid_argument']);
    });

    it('refuses an idempotency_key spent on other content, in a dry run as in a real one', async () => {
      const target = { target_type: 'contact', target_id: 'ct_alice' };
      const send = (content_text: string, extra: Record<string, unknown> = {}) =>
        call(agent, 'isphere_send_message', {
          ...target,
          content_text,
          idempotency_key: 'seam-key-1',
          ...extra,
        });

      const draft = await send('the approved words');
      const { approval_id } = await server.services.approvals.decide({
        id: draft.approval.approval_request_id,
        user: chair,
        decision: 'approve',
      });
      const sent = await send('the approved words', { dry_run: false, approval_id });
      assert.equal(sent.send_status, 'sent');

      const otherDraft = await send('other words');
      assert.deepEqual([otherDraft.ok, otherDraft.error?.code], [false, 'IDEMPOTENCY_CONFLICT']);
      const otherReal = await send('other words', { dry_run: false, approval_id });
      assert.equal(otherReal.error?.code, 'IDEMPOTENCY_CONFLICT');
      // The same content under the same key is still a plain dry run: planned, not refused.
      const sameDraft = await send('the approved words');
      assert.deepEqual([sameDraft.ok, sameDraft.send_status], [true, 'planned']);
    });

    it('forgets idempotency keys after the retention (7 days by default), and only those', async () => {
      const knex = server.sql;
      const [used] = await knex('idempotency_keys').where({ key: 'seam-key-1' });
      assert.ok(used, 'the key of the test before');
      const day = 24 * 3600 * 1000;
      const aged = (key: string, ageMs: number) => ({
        ...used,
        key,
        created_at: new Date(Date.now() - ageMs).toISOString(),
      });
      await knex('idempotency_keys').insert([
        aged('seam-old', 7 * day + 60_000),
        aged('seam-young', 6 * day),
      ]);
      await server.services.maintain();
      const left = (await knex('idempotency_keys').whereLike('key', 'seam-%').pluck('key')) as string[];
      assert.deepEqual(left.sort(), ['seam-key-1', 'seam-young']);
      // The approval behind a forgotten key stays spent: a retry is refused, never written twice.
      const retry = await call(agent, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'ct_alice',
        content_text: 'the approved words',
        idempotency_key: 'seam-old',
        dry_run: false,
        approval_id: (await knex('approval_requests').where({ id: used.approval_request_id }).first())
          .approval_id,
      });
      assert.deepEqual([retry.error?.code, retry.error?.reason], ['APPROVAL_REQUIRED', 'consumed']);
    });
  });
}
