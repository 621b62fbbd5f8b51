import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { revokeAgent } from '../src/server/agents.ts';
import { databaseKinds } from './helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from './helpers/server.ts';

const INIT = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
};

async function post(url: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(new URL('/mcp', url), {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...headers,
    },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  return { res, text, json: () => JSON.parse(text) as Record<string, unknown> };
}

for (const kind of databaseKinds()) {
  describe(`HTTP transport and agent auth on ${kind}`, () => {
    let server: TestServer;
    before(async () => {
      server = await startTestServer(kind);
    });
    after(async () => server?.stop());

    const deniedRows = async () =>
      (await server.services.knex('audit_events').where('kind', 'auth.denied').orderBy('seq')) as {
        details: { reason: string } | string;
        agent_id: string | null;
      }[];
    const reasons = async () =>
      (await deniedRows()).map(
        (r) => (typeof r.details === 'string' ? JSON.parse(r.details) : r.details).reason,
      );

    it('refuses a request without a token with 401 problem JSON, and audits it', async () => {
      const { res, json } = await post(server.url, INIT);
      assert.equal(res.status, 401);
      assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/);
      assert.match(res.headers.get('www-authenticate') ?? '', /^Bearer/);
      const problem = json();
      assert.equal(problem.status, 401);
      assert.equal(problem.code, 'missing_token');
      assert.ok(typeof problem.title === 'string' && typeof problem.type === 'string');
      assert.ok((await reasons()).includes('missing_token'));
    });

    it('refuses an unknown token', async () => {
      const { res, json } = await post(server.url, INIT, { authorization: 'Bearer cs_not-a-real-token' });
      assert.equal(res.status, 401);
      assert.equal(json().code, 'unknown_token');
    });

    it('refuses a revoked token, at once, even inside an open session', async () => {
      const token = await server.addAgent('soon-revoked');
      const client = await connectHttp(server.url, token);
      const ok = await call(client, 'isphere_search_contacts', { query: 'alice' });
      assert.equal(ok.ok, true);
      await revokeAgent(server.services.knex, 'soon-revoked');
      await assert.rejects(
        client.callTool({ name: 'isphere_search_contacts', arguments: { query: 'alice' } }),
        /401/,
      );
      const fresh = await post(server.url, INIT, { authorization: `Bearer ${token}` });
      assert.equal(fresh.res.status, 401);
      assert.equal(fresh.json().code, 'revoked_token');
      await client.close().catch(() => undefined);
    });

    it("refuses another agent's session id with 403", async () => {
      const victim = await connectHttp(server.url, server.demoToken);
      const sessionId = (victim.transport as { sessionId?: string }).sessionId!;
      const intruderToken = await server.addAgent('intruder');
      const { res, json } = await post(
        server.url,
        { jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} },
        { authorization: `Bearer ${intruderToken}`, 'mcp-session-id': sessionId },
      );
      assert.equal(res.status, 403);
      assert.equal(json().code, 'session_of_other_agent');
      assert.ok((await reasons()).includes('session_of_other_agent'));
      // The owner's session still works.
      assert.equal((await call(victim, 'isphere_search_groups', { query: 'board' })).ok, true);
      await victim.close();
    });

    it('answers 404 for an unknown session and 400 for a non-initialize request without one', async () => {
      const auth = { authorization: `Bearer ${server.demoToken}` };
      const unknown = await post(
        server.url,
        { jsonrpc: '2.0', id: 2, method: 'tools/list' },
        {
          ...auth,
          'mcp-session-id': 'no-such-session',
        },
      );
      assert.equal(unknown.res.status, 404);
      const noSession = await post(server.url, { jsonrpc: '2.0', id: 2, method: 'tools/list' }, auth);
      assert.equal(noSession.res.status, 400);
    });

    it('refuses a foreign Host or Origin (DNS rebinding)', async () => {
      const auth = { authorization: `Bearer ${server.demoToken}` };
      const origin = await post(server.url, INIT, { ...auth, origin: 'http://evil.example' });
      assert.equal(origin.res.status, 403);
      assert.equal(origin.json().code, 'origin_not_allowed');
      const localOrigin = await post(server.url, INIT, { ...auth, origin: 'http://localhost:3000' });
      assert.equal(localOrigin.res.status, 200);
      // fetch will not let us forge Host, so use a raw request.
      const { request } = await import('node:http');
      const status = await new Promise<number>((resolve, reject) => {
        const u = new URL('/mcp', server.url);
        const req = request(
          {
            host: u.hostname,
            port: u.port,
            path: u.pathname,
            method: 'POST',
            headers: { host: 'evil.example', ...auth },
          },
          (res) => {
            res.resume();
            resolve(res.statusCode ?? 0);
          },
        );
        req.on('error', reject);
        req.end('{}');
      });
      assert.equal(status, 403);
    });

    it('refuses an oversize body with 413 and malformed JSON with 400', async () => {
      const auth = { authorization: `Bearer ${server.demoToken}` };
      const big = await post(server.url, { ...INIT, padding: 'x'.repeat(1024 * 1024 + 10) }, auth);
      assert.equal(big.res.status, 413);
      assert.equal(big.json().code, 'body_too_large');
      const malformed = await post(server.url, '{"jsonrpc":', auth);
      assert.equal(malformed.res.status, 400);
      assert.equal(malformed.json().code, 'malformed_json');
    });

    it('never puts a token in the audit log', async () => {
      const rows = await server.services.knex('audit_events').select('*');
      const dump = JSON.stringify(rows);
      assert.ok(!dump.includes(server.demoToken));
      assert.ok(!dump.includes('cs_not-a-real-token'));
    });
  });
}
