import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { ProtocolError } from '@modelcontextprotocol/client';
import type { Client } from '@modelcontextprotocol/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

/** The error code a call ended with: the envelope's, or the protocol error's data.code. */
async function outcomeOf(client: Client, name: string, args: Record<string, unknown>): Promise<string> {
  try {
    const env = await call(client, name, args);
    return env.ok ? 'ok' : String(env.error.code);
  } catch (err) {
    assert.ok(err instanceof ProtocolError, String(err));
    return String((err.data as { code?: string }).code);
  }
}

for (const kind of databaseKinds()) {
  describe(`every call counts against the rate limit, on ${kind}`, () => {
    let server: TestServer;
    const clients: Client[] = [];
    const agentWith = async (name: string, opts: { profile?: string; rate_limit_per_min?: number } = {}) => {
      const { token } = await createAgent(server.sql, { name, ...opts });
      const client = await connectHttp(server.url, token);
      clients.push(client);
      return client;
    };

    before(async () => {
      // What is counted, not how fast refusals are answered (policy.test.ts holds the pace).
      server = await startTestServer(kind, { COUNTERSIGN_RATE_LIMITED_PER_SECOND: '0' });
    });
    after(async () => {
      await Promise.allSettled(clients.map((c) => c.close()));
      await server?.stop();
    });

    it('refuses calls of unknown tools RATE_LIMITED once the agent is over its limit', async () => {
      const client = await agentWith('prober', { rate_limit_per_min: 60 });
      const outcomes: string[] = [];
      for (let i = 0; i < 300; i++) outcomes.push(await outcomeOf(client, `no_such_tool_${i}`, {}));
      // Within its limit each call is answered for what it is; past it, every call counts and is refused.
      assert.deepEqual(outcomes.slice(0, 60), Array<string>(60).fill('UNKNOWN_TOOL'));
      // The sliding minute lets a few more through as the window moves on; most of the rest are refused.
      const limited = outcomes.filter((o) => o === 'RATE_LIMITED').length;
      assert.ok(limited >= 230, `${limited} of 300 refused RATE_LIMITED`);
      assert.equal(limited + outcomes.filter((o) => o === 'UNKNOWN_TOOL').length, 300);
    });

    it("refuses calls of tools the agent's profile denies RATE_LIMITED once over its limit", async () => {
      const reader = await agentWith('denied-prober', { profile: 'readonly', rate_limit_per_min: 60 });
      const args = { target_type: 'contact', target_id: 'ct_alice', content_text: 'hi' };
      const outcomes: string[] = [];
      for (let i = 0; i < 150; i++) outcomes.push(await outcomeOf(reader, 'isphere_send_message', args));
      assert.deepEqual(outcomes.slice(0, 60), Array<string>(60).fill('TOOL_DENIED'));
      const limited = outcomes.filter((o) => o === 'RATE_LIMITED').length;
      assert.ok(limited >= 80, `${limited} of 150 refused RATE_LIMITED`);
      assert.equal(limited + outcomes.filter((o) => o === 'TOOL_DENIED').length, 150);
    });

    it('stores and echoes an unknown tool name cut to 200 characters, with the SHA-256 of all of it', async () => {
      const client = await agentWith('long-namer');
      const name = 'x'.repeat(1_000_000);
      await assert.rejects(client.callTool({ name, arguments: {} }), (err: unknown) => {
        assert.ok(err instanceof ProtocolError);
        assert.equal((err.data as { code?: string }).code, 'UNKNOWN_TOOL');
        assert.ok(err.message.length < 300, `message of ${err.message.length} characters`);
        return true;
      });
      const row = await server
        .sql('audit_events')
        .where({ kind: 'tool.call', error_code: 'UNKNOWN_TOOL' })
        .whereRaw("details->>'agent_name' = ?", ['long-namer'])
        .first();
      assert.ok(row, 'the refusal is audited');
      assert.equal(row.tool, 'x'.repeat(200));
      const details = typeof row.details === 'string' ? JSON.parse(row.details) : row.details;
      assert.equal(details.tool_sha256, createHash('sha256').update(name).digest('hex'));
    });

    it('counts every unknown tool name under one metrics label', async () => {
      const client = await agentWith('many-namer');
      for (let i = 0; i < 50; i++) await outcomeOf(client, `made_up_${i}_${'y'.repeat(100)}`, {});
      const metrics = await (await fetch(new URL('/metrics', server.url))).text();
      assert.equal(metrics.match(/made_up_/g), null, 'no unknown name appears in /metrics');
      assert.match(
        metrics,
        /countersign_tool_calls_total\{tool="\(unknown\)",result="error",error_code="UNKNOWN_TOOL"\} \d+/,
      );
    });
  });
}
