import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  classifyInboundRequest,
  PROTOCOL_VERSION_META_KEY,
  SUPPORTED_PROTOCOL_VERSIONS,
} from '@modelcontextprotocol/server';
import fc from 'fast-check';
import { legacyWithoutClaim } from '../../src/server/json-exchange.ts';
import { databaseKinds } from '../helpers/db.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';

/**
 * A 2025-era POST of one JSON-RPC request is answered by countersign's own exchange
 * (src/server/json-exchange.ts); the same request inside a batch still goes to the SDK's stateless
 * transport. Each pair below must get the same JSON-RPC answer both ways (a batch of one is answered
 * with its one answer).
 */

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };

async function post(server: TestServer, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(new URL('/mcp', server.url), {
    method: 'POST',
    headers: { ...HEADERS, authorization: `Bearer ${server.demoToken}`, ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, type: res.headers.get('content-type'), res, text };
}

/** The fields of a tool result that differ from call to call (ids, sequence, times). */
const VOLATILE = new Set(['request_id', 'trace_id', 'audit_seq', 'started_at', 'finished_at']);
function stable(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(stable);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(
    Object.entries(value).map(([k, v]) => [
      k,
      VOLATILE.has(k) ? '…' : k === 'text' ? stableText(v) : stable(v),
    ]),
  );
}
/** A text block that holds JSON (the envelope, as text for older clients), with its volatile fields masked. */
function stableText(text: unknown): unknown {
  try {
    return JSON.stringify(stable(JSON.parse(String(text))));
  } catch {
    return text;
  }
}

const request = (id: number, method: string, params?: unknown) => ({
  jsonrpc: '2.0',
  id,
  method,
  ...(params === undefined ? {} : { params }),
});

const CASES: [string, ReturnType<typeof request>][] = [
  ['a read tool', request(1, 'tools/call', { name: 'isphere_search_contacts', arguments: { query: 'mar' } })],
  [
    'a write tool in dry run',
    request(2, 'tools/call', {
      name: 'isphere_send_message',
      arguments: { target_type: 'contact', target_id: 'ct_david', content_text: 'hello' },
    }),
  ],
  ['an unknown tool', request(3, 'tools/call', { name: 'no_such_tool', arguments: {} })],
  [
    'arguments that do not validate',
    request(4, 'tools/call', { name: 'isphere_search_contacts', arguments: { limit: 'x' } }),
  ],
  ['params that are not a tool call', request(5, 'tools/call', { arguments: {} })],
  ['the tool list', request(6, 'tools/list')],
  ['a ping', request(7, 'ping')],
  ['a method nobody serves', request(8, 'resources/list')],
  ['a string id', { ...request(9, 'ping'), id: 'ping-9' } as unknown as ReturnType<typeof request>],
];

for (const kind of databaseKinds()) {
  describe(`one 2025-era request over HTTP on ${kind}`, () => {
    let server: TestServer;
    before(async () => {
      server = await startTestServer(kind);
    });
    after(async () => server?.stop());

    for (const [what, message] of CASES) {
      it(`answers ${what} as the SDK's transport answers it`, async () => {
        const alone = await post(server, message);
        const batched = await post(server, [message]);
        assert.equal(alone.status, 200, alone.text);
        assert.equal(alone.type, 'application/json');
        assert.equal(batched.status, 200, batched.text);
        const answer = JSON.parse(alone.text) as Record<string, unknown>;
        // A batch of one is answered with the one answer, not an array of one.
        const reference = JSON.parse(batched.text) as Record<string, unknown>;
        assert.equal(answer.id, message.id);
        assert.deepEqual(stable(answer), stable(reference));
        // The one-body answer is written whole (its length known); the SDK's streams its body.
        assert.equal(alone.res.headers.get('content-length'), String(Buffer.byteLength(alone.text)));
      });
    }

    it('audits a tool call answered this way like any other', async () => {
      const before = (await server.sql('audit_events').max({ seq: 'seq' }).first())!.seq as number;
      const { text } = await post(server, CASES[0]![1]);
      const seq = (JSON.parse(text) as { result: { structuredContent: { audit: { audit_seq: number } } } })
        .result.structuredContent.audit.audit_seq;
      const row = await server.sql('audit_events').where({ seq }).first();
      assert.ok(seq > Number(before));
      assert.equal(row.kind, 'tool.call');
      assert.equal(row.tool, 'isphere_search_contacts');
    });

    it('answers each request as its own caller, on servers kept from one request to the next', async () => {
      const other = await server.addAgent('json-exchange-other');
      const callers = [server.demoToken, other, server.demoToken, other];
      const asCaller = async (token: string) => {
        const { text } = await post(server, CASES[0]![1], { authorization: `Bearer ${token}` });
        const result = (JSON.parse(text) as { result: { structuredContent: Record<string, unknown> } })
          .result;
        const audit = result.structuredContent.audit as { audit_seq: number; operator_id: string };
        const row = await server.sql('audit_events').where({ seq: audit.audit_seq }).first();
        return { agent: row.agent_id as string, operator: audit.operator_id };
      };
      // One after another (the same kept server answers each), then all at once (several servers).
      const sequential: { agent: string; operator: unknown }[] = [];
      for (const token of callers) sequential.push(await asCaller(token));
      const concurrent = await Promise.all([...callers, ...callers].map(asCaller));
      const ids = [...sequential, ...concurrent];
      for (const { agent, operator } of ids) assert.equal(operator, agent);
      const [demo, second] = [ids[0]!.agent, ids[1]!.agent];
      assert.notEqual(demo, second);
      assert.deepEqual(
        ids.map((i) => i.agent),
        [...callers, ...callers, ...callers].map((t) => (t === other ? second : demo)),
      );
    });

    it("leaves to the SDK's transport what it refuses or treats apart", async () => {
      const ping = request(20, 'ping');
      const notAcceptable = await post(server, ping, { accept: 'application/json' });
      assert.equal(notAcceptable.status, 406);
      const badVersion = await post(server, ping, { 'mcp-protocol-version': '1999-01-01' });
      assert.equal(badVersion.status, 400);
      assert.match(badVersion.text, /Unsupported protocol version/);
      const notification = await post(server, { jsonrpc: '2.0', method: 'notifications/initialized' });
      assert.equal(notification.status, 202);
      const init = await post(
        server,
        request(21, 'initialize', {
          protocolVersion: '2025-06-18',
          capabilities: {},
          clientInfo: { name: 'raw', version: '1' },
        }),
      );
      assert.equal(init.status, 200);
      assert.equal(
        (JSON.parse(init.text.replace(/^[\s\S]*?data: /, '')) as { result: { serverInfo: { name: string } } })
          .result.serverInfo.name,
        'countersign',
      );
    });
  });
}

describe('which requests the exchange answers itself', () => {
  /** What the SDK says of the same request: a 2025-era request without the envelope claim, not initialize. */
  const sdkSays = (body: Record<string, unknown>, version?: string) => {
    const route = classifyInboundRequest({ httpMethod: 'POST', protocolVersionHeader: version, body });
    return route.kind === 'legacy' && route.reason === 'no-claim';
  };
  const MODERN = '2026-07-28';
  const claim = { [PROTOCOL_VERSION_META_KEY]: MODERN };

  it('agrees with the SDK on requests, responses, notifications, claims and headers', () => {
    const bodies: Record<string, unknown>[] = [
      { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'x', arguments: {} } },
      { jsonrpc: '2.0', id: 'a', method: 'tools/list' },
      { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18' } },
      { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { _meta: claim } },
      { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { _meta: { progressToken: 1 } } },
      { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { _meta: [] } },
      { jsonrpc: '2.0', id: 1, method: 'tools/call', params: [] },
      { jsonrpc: '2.0', method: 'notifications/initialized' },
      { jsonrpc: '2.0', id: 1, result: {} },
      { jsonrpc: '2.0', id: 1, error: { code: -1, message: 'no' } },
      { jsonrpc: '2.0', id: 1, method: 'tools/call', result: {} },
      { jsonrpc: '1.0', id: 1, method: 'tools/call' },
      { jsonrpc: '2.0', id: null, method: 'tools/call' },
      { jsonrpc: '2.0', id: 1, method: 7 },
      {},
    ];
    const versions = [undefined, ...SUPPORTED_PROTOCOL_VERSIONS, MODERN];
    for (const body of bodies)
      for (const version of versions)
        assert.equal(
          legacyWithoutClaim(body, { version }),
          sdkSays(body, version),
          JSON.stringify({ body, version }),
        );
    assert.ok(bodies.some((b) => sdkSays(b, undefined)) && bodies.some((b) => !sdkSays(b, undefined)));
  });

  it('agrees with the SDK on arbitrary JSON objects', () => {
    const key = fc.constantFrom('jsonrpc', 'id', 'method', 'params', 'result', 'error', '_meta', 'x');
    const leaf = fc.oneof(
      fc.constantFrom('2.0', 'tools/call', 'initialize', null, 1, PROTOCOL_VERSION_META_KEY),
      fc.jsonValue({ maxDepth: 1 }),
    );
    const value = fc.letrec<{ obj: Record<string, unknown>; v: unknown }>((tie) => ({
      obj: fc.dictionary(key, tie('v'), { maxKeys: 5 }),
      v: fc.oneof({ depthSize: 'small' }, leaf, tie('obj'), fc.constant(claim)),
    })).obj;
    const version = fc.constantFrom(undefined, ...SUPPORTED_PROTOCOL_VERSIONS, MODERN);
    fc.assert(
      fc.property(value, version, (body, v) => legacyWithoutClaim(body, { version: v }) === sdkSays(body, v)),
      { numRuns: 3000 },
    );
  });
});
