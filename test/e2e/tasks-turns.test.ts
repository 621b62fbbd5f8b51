import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { databaseKinds } from '../helpers/db.ts';
import { startTestServer, waitFor, type TestServer } from '../helpers/server.ts';
import { rawRequest } from '../helpers/tasks-client.ts';

const VERSION = '2025-11-25';
const IN_FLIGHT = 2;
const WAITING = 3;
const FLOOD = IN_FLIGHT + WAITING + 2;

/** One 2025-11-25 request POSTed as is: its HTTP status and its body. */
async function post(url: string, token: string, method: string, params: Record<string, unknown>) {
  const res = await fetch(new URL('/mcp', url), {
    method: 'POST',
    headers: {
      Authorization: `Bearer ${token}`,
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      'MCP-Protocol-Version': VERSION,
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
  });
  const text = await res.text();
  const data = text.startsWith('{')
    ? text
    : (
        text
          .split('\n')
          .filter((l) => l.startsWith('data:'))
          .at(-1) ?? 'data:{}'
      ).slice(5);
  return { status: res.status, body: JSON.parse(data) as Record<string, unknown> };
}

for (const kind of databaseKinds()) {
  describe(`tasks/result waits take the agent's turns, on ${kind}`, () => {
    let server: TestServer;
    let chair: User;
    before(async () => {
      server = await startTestServer(kind, {
        COUNTERSIGN_MAX_CALLS_IN_FLIGHT_PER_AGENT: String(IN_FLIGHT),
        COUNTERSIGN_MAX_CALLS_WAITING_PER_AGENT: String(WAITING),
      });
      chair = await createUser(server.sql, {
        name: 'turns-chair',
        roles: ['chair'],
        password: 'turns pw 1',
      });
    });
    after(async () => {
      await server?.stop();
    });

    it("holds one agent's many waits to its turns, answers another agent meanwhile, and ends the waits on the decision", async () => {
      const created = await rawRequest(
        server.url,
        server.demoToken,
        {
          method: 'tools/call',
          params: {
            name: 'isphere_send_message',
            arguments: {
              target_type: 'contact',
              target_id: 'ct_david',
              content_text: 'waited on',
              dry_run: false,
            },
            task: { ttl: 60_000 },
          },
        },
        VERSION,
      );
      assert.equal(created.kind, 'result', JSON.stringify(created));
      const taskId = String(
        (created as unknown as { result: { task: { taskId: string } } }).result.task.taskId,
      );

      // The flood: more waits than the agent has turns and places in line.
      const answered: { status: number; body: Record<string, unknown> }[] = [];
      const flood = Array.from({ length: FLOOD }, () =>
        post(server.url, server.demoToken, 'tasks/result', { taskId }).then((a) => (answered.push(a), a)),
      );
      // Past its turns and its places in line, the excess is refused at once: 429, RATE_LIMITED.
      await waitFor('the excess to be refused', async () =>
        answered.length >= FLOOD - IN_FLIGHT - WAITING ? true : undefined,
      );
      const refused = answered.filter((a) => a.status === 429);
      assert.equal(refused.length, FLOOD - IN_FLIGHT - WAITING, JSON.stringify(answered));
      for (const r of refused)
        assert.deepEqual([r.body.code, r.body.reason], ['RATE_LIMITED', 'too_many_in_flight']);

      // Another agent is answered while all of those waits are held.
      const other = (await createAgent(server.sql, { name: 'turns-other' })).token;
      const read = await post(server.url, other, 'tools/call', {
        name: 'isphere_search_contacts',
        arguments: { query: 'david' },
      });
      assert.equal(read.status, 200);
      assert.equal((read.body.result as { structuredContent: { ok: boolean } }).structuredContent.ok, true);
      assert.equal(answered.length, FLOOD - IN_FLIGHT - WAITING, 'the held waits are still waiting');

      // The decision ends them: each held and queued wait answers the completed write.
      const request = (await server.sql('approval_tasks').where({ id: taskId }).first()) as {
        approval_request_id: string;
      };
      await server.services.approvals.decide({
        id: request.approval_request_id,
        user: chair,
        decision: 'approve',
      });
      const all = await Promise.all(flood);
      const results = all.filter((a) => a.status === 200);
      assert.equal(results.length, IN_FLIGHT + WAITING);
      for (const r of results) {
        const result = r.body.result as { structuredContent?: { send_status?: string } } | undefined;
        assert.equal(result?.structuredContent?.send_status, 'sent', JSON.stringify(r.body));
      }
    });
  });
}
