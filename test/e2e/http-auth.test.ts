import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { runAdminCommand } from '../../src/admin/commands.ts';
import { databaseKinds } from '../helpers/db.ts';
import { call, connectHttp, startTestServer, type TestServer } from '../helpers/server.ts';

const INIT = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
};

/** The per-request envelope of the 2026-07-28 revision. */
const META = {
  'io.modelcontextprotocol/protocolVersion': '2026-07-28',
  'io.modelcontextprotocol/clientCapabilities': {},
  'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
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
      (await server.sql('audit_events').where('kind', 'auth.denied').orderBy('seq')) as {
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
      assert.deepEqual([problem.code, problem.reason], ['NOT_LOGGED_IN', 'missing_token']);
      assert.ok(typeof problem.title === 'string' && typeof problem.type === 'string');
      assert.ok((await reasons()).includes('missing_token'));
    });

    it('without OAuth configured, challenges as before and serves no protected-resource metadata', async () => {
      const { res } = await post(server.url, INIT, { authorization: 'Bearer cs_not-a-real-token' });
      assert.equal(res.status, 401);
      assert.equal(res.headers.get('www-authenticate'), 'Bearer realm="countersign"');
      // A JWT-shaped token is just an unknown static token when no issuer is configured.
      const jwtShaped = await post(server.url, INIT, { authorization: 'Bearer aaa.bbb.ccc' });
      assert.deepEqual([jwtShaped.res.status, jwtShaped.json().reason], [401, 'unknown_token']);
      const metadata = await fetch(new URL('/.well-known/oauth-protected-resource/mcp', server.url));
      assert.equal(metadata.status, 404);
    });

    it('refuses an unknown token', async () => {
      const { res, json } = await post(server.url, INIT, { authorization: 'Bearer cs_not-a-real-token' });
      assert.equal(res.status, 401);
      assert.deepEqual([json().code, json().reason], ['NOT_LOGGED_IN', 'unknown_token']);
    });

    it('refuses a revoked token at once, to a client that was connected', async () => {
      const token = await server.addAgent('soon-revoked');
      const client = await connectHttp(server.url, token);
      const ok = await call(client, 'isphere_search_contacts', { query: 'alice' });
      assert.equal(ok.ok, true);
      // Through the operator's command, as the CLI, the web page and the endpoint revoke: it holds on
      // this replica from the next call, without waiting for PostgreSQL's notification.
      await runAdminCommand(server.services.admin, {
        command: 'agent.revoke',
        name: 'soon-revoked',
        actor: 'test',
      });
      await assert.rejects(
        client.callTool({ name: 'isphere_search_contacts', arguments: { query: 'alice' } }),
        /401/,
      );
      const fresh = await post(server.url, INIT, { authorization: `Bearer ${token}` });
      assert.equal(fresh.res.status, 401);
      assert.deepEqual([fresh.json().code, fresh.json().reason], ['NOT_LOGGED_IN', 'revoked_token']);
      await client.close().catch(() => undefined);
    });

    it('keeps no session: no Mcp-Session-Id is issued, and any request stands on its own', async () => {
      const auth = { authorization: `Bearer ${server.demoToken}` };
      const init = await post(server.url, INIT, auth);
      assert.equal(init.res.status, 200);
      assert.equal(init.res.headers.get('mcp-session-id'), null);
      // A 2025-era request without initialize first, and one with a session id nobody issued: both answered.
      for (const headers of [auth, { ...auth, 'mcp-session-id': 'no-such-session' }]) {
        const list = await post(
          server.url,
          { jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} },
          headers,
        );
        assert.equal(list.res.status, 200);
        assert.match(list.text, /isphere_search_contacts/);
      }
    });

    it('serves 2026-07-28 requests and refuses those whose Mcp-Method or Mcp-Name disagree with the body', async () => {
      const modern = {
        authorization: `Bearer ${server.demoToken}`,
        'mcp-protocol-version': '2026-07-28',
      };
      const params = { _meta: META };
      const list = await post(
        server.url,
        { jsonrpc: '2.0', id: 1, method: 'tools/list', params },
        { ...modern, 'mcp-method': 'tools/list' },
      );
      assert.equal(list.res.status, 200);
      assert.match(list.text, /isphere_search_contacts/);
      const wrongMethod = await post(
        server.url,
        { jsonrpc: '2.0', id: 2, method: 'tools/list', params },
        { ...modern, 'mcp-method': 'tools/call' },
      );
      assert.equal(wrongMethod.res.status, 400);
      const call = {
        jsonrpc: '2.0',
        id: 3,
        method: 'tools/call',
        params: { ...params, name: 'isphere_search_groups', arguments: { query: 'board' } },
      };
      const wrongName = await post(server.url, call, {
        ...modern,
        'mcp-method': 'tools/call',
        'mcp-name': 'isphere_search_contacts',
      });
      assert.equal(wrongName.res.status, 400);
      const right = await post(server.url, call, {
        ...modern,
        'mcp-method': 'tools/call',
        'mcp-name': 'isphere_search_groups',
      });
      assert.equal(right.res.status, 200);
      assert.match(right.text, /"audit_seq"/);
    });

    it('refuses a foreign Host or Origin (DNS rebinding)', async () => {
      const auth = { authorization: `Bearer ${server.demoToken}` };
      const origin = await post(server.url, INIT, { ...auth, origin: 'http://evil.example' });
      assert.equal(origin.res.status, 403);
      assert.deepEqual(
        [origin.json().code, origin.json().reason],
        ['PERMISSION_DENIED', 'origin_not_allowed'],
      );
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
      assert.deepEqual([big.json().code, big.json().reason], ['INVALID_ARGUMENT', 'body_too_large']);
      const malformed = await post(server.url, '{"jsonrpc":', auth);
      assert.equal(malformed.res.status, 400);
      assert.deepEqual(
        [malformed.json().code, malformed.json().reason],
        ['INVALID_ARGUMENT', 'malformed_json'],
      );
    });

    it('never puts a token in the audit log', async () => {
      const rows = await server.sql('audit_events').select('*');
      const dump = JSON.stringify(rows);
      assert.ok(!dump.includes(server.demoToken));
      assert.ok(!dump.includes('cs_not-a-real-token'));
    });
  });
}
