import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { gunzipSync } from 'node:zlib';
import { after, before, describe, it } from 'node:test';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createAgent } from '../../src/accounts/agents.ts';
import { createUser } from '../../src/accounts/users.ts';
import type { User } from '../../src/core/identity.ts';
import { VERSION } from '../../src/core/version.ts';
import { approveAsChair } from '../helpers/approvals.ts';
import { spawnServer, stopChild } from '../helpers/cli.ts';
import { createTestDatabase, databaseKinds, openMigratedDatabase } from '../helpers/db.ts';
import {
  call,
  connectStdio,
  newClient,
  startTestServer,
  testEnv,
  waitFor,
  type Era,
  type TestServer,
} from '../helpers/server.ts';

// The SDK's batch processor waits 5 s before sending by default; the standard variable shortens it here.
process.env.OTEL_BSP_SCHEDULE_DELAY = '50';

/** One span as received, its attributes flattened from OTLP/JSON's typed values. */
interface ReceivedSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  attributes: Record<string, unknown>;
  status: { code?: number };
  resource: Record<string, unknown>;
}

const SERVER_KIND = 2;
const INTERNAL_KIND = 1;
const STATUS_ERROR = 2;

interface OtlpValue {
  stringValue?: string;
  intValue?: string | number;
  boolValue?: boolean;
  doubleValue?: number;
}
type OtlpAttributes = { key: string; value: OtlpValue }[] | undefined;
interface OtlpRequest {
  resourceSpans: {
    resource?: { attributes?: OtlpAttributes };
    scopeSpans: {
      spans: (Omit<ReceivedSpan, 'attributes' | 'resource'> & { attributes?: OtlpAttributes })[];
    }[];
  }[];
}

const flat = (attributes: OtlpAttributes) =>
  Object.fromEntries(
    (attributes ?? []).map(({ key, value }) => [
      key,
      value.stringValue ?? value.boolValue ?? value.doubleValue ?? value.intValue,
    ]),
  );

/**
 * A collector stand-in: a plain HTTP server that takes OTLP/HTTP exports at /v1/traces. The exporter
 * (0.223.1, exporter-trace-otlp-http) sends JSON; gzip only if OTEL_EXPORTER_OTLP_COMPRESSION asks.
 */
async function startReceiver() {
  const spans: ReceivedSpan[] = [];
  const paths: string[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      paths.push(req.url ?? '');
      const raw = Buffer.concat(chunks);
      const body = req.headers['content-encoding'] === 'gzip' ? gunzipSync(raw) : raw;
      assert.equal(req.headers['content-type'], 'application/json');
      const payload = JSON.parse(body.toString('utf8')) as OtlpRequest;
      for (const rs of payload.resourceSpans) {
        const resource = flat(rs.resource?.attributes);
        for (const ss of rs.scopeSpans) {
          for (const s of ss.spans) spans.push({ ...s, attributes: flat(s.attributes), resource });
        }
      }
      res.writeHead(200, { 'Content-Type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    paths,
    /** The spans of one trace, once `count` of them have arrived. */
    trace: (traceId: string, count: number) =>
      waitFor(`${count} spans of trace ${traceId}`, async () => {
        const found = spans.filter((s) => s.traceId === traceId);
        return found.length >= count ? found : undefined;
      }),
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

const hex = (bytes: number) => randomBytes(bytes).toString('hex');

/** An SDK client whose every HTTP request carries `headers`. */
async function connectWith(url: string, token: string, headers: Record<string, string>, era: Era) {
  const client: Client = newClient(era);
  await client.connect(
    new StreamableHTTPClientTransport(new URL('/mcp', url), {
      requestInit: { headers: { Authorization: `Bearer ${token}`, ...headers } },
    }),
  );
  return client;
}

const one = (spans: ReceivedSpan[], name: string) => {
  const found = spans.filter((s) => s.name === name);
  assert.equal(found.length, 1, `one span named ${name} in ${spans.map((s) => s.name).join(', ')}`);
  return found[0]!;
};

for (const kind of databaseKinds()) {
  describe(`traces on ${kind}`, () => {
    let receiver: Awaited<ReturnType<typeof startReceiver>>;
    let server: TestServer;
    let chair: User;

    before(async () => {
      receiver = await startReceiver();
      server = await startTestServer(kind, { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url });
      chair = await createUser(server.sql, {
        name: 'chair-tracy',
        roles: ['chair'],
        password: 'correct horse 1',
      });
    });
    after(async () => {
      await server.stop();
      await receiver.close();
    });

    it("continues the caller's traceparent header: request span, tool-call span, and their steps", async () => {
      const [traceId, parentId] = [hex(16), hex(8)];
      const client = await connectWith(
        server.url,
        server.demoToken,
        { traceparent: `00-${traceId}-${parentId}-01` },
        'legacy',
      );
      const env = await call(client, 'isphere_search_contacts', { query: 'David' });
      await client.close();
      assert.equal(env.ok, true);
      assert.equal(env.audit.trace_id, traceId, "the envelope's trace_id is the caller's trace");

      const spans = await receiver.trace(traceId, 5);
      const request = one(spans, 'tools/call isphere_search_contacts');
      assert.equal(request.kind, SERVER_KIND);
      assert.equal(request.parentSpanId, parentId, "the request span's parent is the caller's span");
      assert.equal(request.attributes['mcp.method.name'], 'tools/call');
      assert.equal(request.attributes['gen_ai.tool.name'], 'isphere_search_contacts');
      assert.equal(request.attributes['gen_ai.operation.name'], 'execute_tool');
      assert.match(String(request.attributes['jsonrpc.request.id']), /^\S+$/);
      assert.match(String(request.attributes['mcp.protocol.version']), /^2025-\d\d-\d\d$/);
      assert.equal(request.attributes['network.transport'], 'tcp');
      assert.equal(request.attributes['error.type'], undefined);
      assert.deepEqual(
        [request.resource['service.name'], request.resource['service.version']],
        ['countersign', VERSION],
      );

      const tool = one(spans, 'execute_tool isphere_search_contacts');
      assert.equal(tool.kind, INTERNAL_KIND);
      assert.equal(tool.parentSpanId, request.spanId);
      assert.equal(tool.attributes['gen_ai.operation.name'], 'execute_tool');
      assert.equal(tool.attributes['gen_ai.tool.call.id'], env.audit.request_id);

      for (const step of ['rate_limit.take', 'connector.searchContacts', 'audit.append']) {
        assert.equal(one(spans, step).parentSpanId, tool.spanId, `${step} is a step of the tool call`);
      }
      assert.equal(
        one(spans, 'connector.searchContacts').attributes['countersign.connector.source'],
        'local',
      );
      assert.equal(one(spans, 'audit.append').attributes['countersign.audit.kind'], 'tool.call');
      assert.ok(receiver.paths.every((p) => p === '/v1/traces'));
    });

    it('continues a traceparent sent in params._meta on 2026-07-28', async () => {
      const [traceId, parentId] = [hex(16), hex(8)];
      const client = await connectWith(server.url, server.demoToken, {}, 'modern');
      const result = await client.callTool({
        name: 'isphere_search_groups',
        arguments: { query: 'a' },
        _meta: { traceparent: `00-${traceId}-${parentId}-01` },
      });
      await client.close();
      assert.equal((result.structuredContent as { audit: { trace_id: string } }).audit.trace_id, traceId);

      const spans = await receiver.trace(traceId, 2);
      const request = one(spans, 'tools/call isphere_search_groups');
      assert.equal(request.parentSpanId, parentId);
      assert.equal(request.attributes['mcp.protocol.version'], '2026-07-28');
      assert.equal(one(spans, 'execute_tool isphere_search_groups').parentSpanId, request.spanId);
    });

    it('starts a new trace without a traceparent (or with a malformed one), its id in the envelope', async () => {
      const client = await connectWith(
        server.url,
        server.demoToken,
        { traceparent: '00-zz-nonsense-01' },
        'legacy',
      );
      const env = await call(client, 'isphere_search_contacts', { query: 'Ada' });
      await client.close();
      assert.match(env.audit.trace_id, /^[0-9a-f]{32}$/);
      const spans = await receiver.trace(env.audit.trace_id, 2);
      const request = one(spans, 'tools/call isphere_search_contacts');
      assert.ok(!request.parentSpanId, 'a root span');
    });

    it("marks a failed tool call with error.type, the envelope's error code", async () => {
      const client = await connectWith(server.url, server.demoToken, {}, 'legacy');
      const env = await call(client, 'isphere_send_message', {
        target_type: 'contact',
        target_id: 'nobody-by-that-name',
        content_text: 'hello',
      });
      assert.equal(env.ok, false);
      assert.equal(env.error.code, 'TARGET_NOT_FOUND');
      const spans = await receiver.trace(env.audit.trace_id, 2);
      for (const name of ['tools/call isphere_send_message', 'execute_tool isphere_send_message']) {
        const span = one(spans, name);
        assert.equal(span.attributes['error.type'], 'TARGET_NOT_FOUND', name);
        assert.equal(span.status.code, STATUS_ERROR, name);
      }
      assert.equal(one(spans, 'connector.resolveTarget').attributes['error.type'], 'TARGET_NOT_FOUND');

      // A protocol error (an unknown tool): its data code and the JSON-RPC code.
      const traceId = hex(16);
      const traced = await connectWith(
        server.url,
        server.demoToken,
        { traceparent: `00-${traceId}-${hex(8)}-01` },
        'legacy',
      );
      await assert.rejects(traced.callTool({ name: 'isphere_no_such_tool', arguments: {} }));
      await traced.close();
      await client.close();
      const refused = one(await receiver.trace(traceId, 2), 'tools/call isphere_no_such_tool');
      assert.equal(refused.attributes['error.type'], 'UNKNOWN_TOOL');
      assert.equal(refused.attributes['rpc.response.status_code'], '-32602');
      assert.equal(refused.status.code, STATUS_ERROR);
    });

    it('traces the approval steps and the connector write of an approved send', async () => {
      const client = await connectWith(server.url, server.demoToken, {}, 'legacy');
      const args = { target_type: 'contact', target_id: 'ct_david', content_text: 'traced hello' };
      const draft = await call(client, 'isphere_send_message', args);
      const approvalId = await approveAsChair({ approvals: server.services.approvals, user: chair }, draft);
      const sent = await call(client, 'isphere_send_message', {
        ...args,
        dry_run: false,
        approval_id: approvalId,
      });
      await client.close();
      assert.equal(sent.ok, true, JSON.stringify(sent.error));

      const drafted = await receiver.trace(draft.audit.trace_id, 4);
      const draftTool = one(drafted, 'execute_tool isphere_send_message');
      assert.equal(one(drafted, 'approval.request').parentSpanId, draftTool.spanId);
      assert.equal(one(drafted, 'connector.resolveTarget').parentSpanId, draftTool.spanId);

      const executed = await receiver.trace(sent.audit.trace_id, 6);
      const tool = one(executed, 'execute_tool isphere_send_message');
      for (const step of ['approval.execute', 'connector.sendMessage', 'approval.finish']) {
        assert.equal(one(executed, step).parentSpanId, tool.spanId, step);
      }
      // The chair's decision is not part of an agent's call: a trace of its own.
      const decided = await waitFor('the decision span', async () =>
        receiver.spans.find((s) => s.name === 'approval.decide'),
      );
      assert.ok(decided.traceId !== draft.audit.trace_id && decided.traceId !== sent.audit.trace_id);
    });
  });
}

/**
 * `countersign serve` in a child process of its own, with a preload that reports on exit how many
 * OpenTelemetry SDK modules the process loaded (CommonJS modules, which all of the SDK's are, stay listed in
 * require.cache even when imported from ESM). The environment reaches the config the way an operator's does.
 */
async function serveInChild(extraEnv: Record<string, string>) {
  const db = await createTestDatabase(databaseKinds()[0]!);
  const probe = path.join(db.dataDir, 'otel-probe.mjs');
  fs.mkdirSync(db.dataDir, { recursive: true });
  fs.writeFileSync(
    probe,
    [
      "import { createRequire } from 'node:module';",
      'const cache = createRequire(import.meta.url).cache;',
      // The API package alone does not count: prom-client (metrics) loads it whatever tracing does.
      "const sdk = (p) => p.includes('/@opentelemetry/') && !p.includes('/@opentelemetry/api/');",
      "process.on('exit', () => process.stderr.write(`otel-modules: ${Object.keys(cache).filter(sdk).length}\\n`));",
    ].join('\n'),
  );
  const { child, url, stderr } = await spawnServer(
    testEnv(db, { NODE_OPTIONS: `--import=${probe}`, ...extraEnv }),
  );
  try {
    const token = await waitFor(
      'the demo token',
      async () => /demo agent token \(shown once\): (cs_\S+)/.exec(stderr())?.[1],
    );
    const traceId = hex(16);
    const client = await connectWith(url, token, { traceparent: `00-${traceId}-${hex(8)}-01` }, 'legacy');
    const env = await call(client, 'isphere_search_contacts', { query: 'David' });
    await client.close();
    assert.equal(env.ok, true);
    await stopChild(child);
    // stderr may still be draining when the exit is seen.
    const loaded = await waitFor('the probe', async () => /otel-modules: (\d+)/.exec(stderr())?.[1]);
    return { loaded: Number(loaded), sentTraceId: traceId, envelopeTraceId: env.audit.trace_id as string };
  } finally {
    await stopChild(child);
    await db.drop();
  }
}

describe('the environment decides, in a real countersign process', () => {
  it('without OTEL_EXPORTER_OTLP_ENDPOINT loads no OpenTelemetry SDK module and keeps its own trace ids', async () => {
    const run = await serveInChild({});
    assert.equal(run.loaded, 0);
    assert.match(run.envelopeTraceId, /^[0-9a-f]{32}$/);
    assert.notEqual(
      run.envelopeTraceId,
      run.sentTraceId,
      'a traceparent is not continued when tracing is off',
    );
  });

  it('traces a stdio server too: the pipe transport, _meta.traceparent, spans flushed when stdin closes', async () => {
    const receiver = await startReceiver();
    const { testDb, db } = await openMigratedDatabase(databaseKinds()[0]!);
    try {
      const { token } = await createAgent(db.knex, { name: 'desktop' });
      await db.close();
      const env = testEnv(testDb, {
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_BSP_SCHEDULE_DELAY: '600000',
        COUNTERSIGN_AGENT_TOKEN: token,
      });
      const { client, exited } = await connectStdio(env, 'modern');
      const [traceId, parentId] = [hex(16), hex(8)];
      await client.callTool({
        name: 'isphere_search_contacts',
        arguments: { query: 'David' },
        _meta: { traceparent: `00-${traceId}-${parentId}-01` },
      });
      await client.close();
      await exited();
      const request = one(
        receiver.spans.filter((s) => s.traceId === traceId),
        'tools/call isphere_search_contacts',
      );
      assert.equal(request.parentSpanId, parentId);
      assert.equal(request.attributes['network.transport'], 'pipe');
      assert.equal(request.attributes['mcp.protocol.version'], '2026-07-28');
    } finally {
      await receiver.close();
      await testDb.drop();
    }
  });

  it('with it, exports the spans, flushed when the server stops', async () => {
    const receiver = await startReceiver();
    try {
      // The batch delay is long: the spans can only have arrived through the flush at shutdown.
      const run = await serveInChild({
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_BSP_SCHEDULE_DELAY: '600000',
      });
      assert.ok(run.loaded > 0);
      assert.equal(run.envelopeTraceId, run.sentTraceId);
      assert.ok(
        receiver.spans.some(
          (s) => s.name === 'tools/call isphere_search_contacts' && s.traceId === run.sentTraceId,
        ),
      );
    } finally {
      await receiver.close();
    }
  });
});
