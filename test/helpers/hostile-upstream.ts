import { randomUUID } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { NodeStreamableHTTPServerTransport } from '@modelcontextprotocol/node';
import { McpServer } from '@modelcontextprotocol/server';
import { StdioServerTransport } from '@modelcontextprotocol/server/stdio';

/**
 * An upstream MCP server that is hostile by schema and by size: `match` takes a string under the
 * pattern `^(a+)+$` (catastrophic on a backtracking engine), `digits` one under `^[0-9]+$`, `big` and `big_write` answer as many
 * bytes as asked, `ping` answers at once. Served over Streamable HTTP (SSE or JSON answers), or over
 * stdio when this file is run with the argument `stdio`.
 */
export interface HostileUpstream {
  url: string;
  /** Every big_write the upstream performed. */
  writes: number[];
  close(): Promise<void>;
}

/** A schema announced as `schema` that lets anything through on this side (the upstream's own check). */
const announced = <T>(schema: Record<string, unknown>) => ({
  '~standard': {
    version: 1 as const,
    vendor: 'countersign-fixture',
    validate: (value: unknown) => ({ value: value as T }),
    types: undefined as unknown as { input: T; output: T },
    jsonSchema: { input: () => schema, output: () => schema },
  },
});

const sized = announced<{ bytes: number }>({
  type: 'object',
  properties: { bytes: { type: 'integer', minimum: 0 } },
  required: ['bytes'],
});

function hostileServer(writes: number[]) {
  const server = new McpServer({ name: 'fixture-hostile', version: '1.0.0' });
  server.registerTool(
    'match',
    {
      description: 'Echoes a string of a-s.',
      inputSchema: announced<{ s: string }>({
        type: 'object',
        properties: { s: { type: 'string', pattern: '^(a+)+$' } },
        required: ['s'],
      }),
      annotations: { readOnlyHint: true },
    },
    async ({ s }) => ({ content: [{ type: 'text', text: s }] }),
  );
  server.registerTool(
    'digits',
    {
      description: 'Echoes a string of digits.',
      inputSchema: announced<{ s: string }>({
        type: 'object',
        properties: { s: { type: 'string', pattern: '^[0-9]+$' } },
        required: ['s'],
      }),
      annotations: { readOnlyHint: true },
    },
    async ({ s }) => ({ content: [{ type: 'text', text: s }] }),
  );
  server.registerTool(
    'ping',
    {
      description: 'Answers pong.',
      inputSchema: announced<object>({ type: 'object' }),
      annotations: { readOnlyHint: true },
    },
    async () => ({ content: [{ type: 'text', text: 'pong' }] }),
  );
  server.registerTool(
    'big',
    { description: 'Answers `bytes` bytes.', inputSchema: sized, annotations: { readOnlyHint: true } },
    async (args: { bytes?: unknown }) => ({
      content: [{ type: 'text', text: 'x'.repeat(Number(args.bytes)) }],
    }),
  );
  server.registerTool(
    'big_write',
    { description: 'Writes, then answers `bytes` bytes.', inputSchema: sized },
    async ({ bytes }) => {
      writes.push(bytes);
      return { content: [{ type: 'text', text: 'y'.repeat(bytes) }] };
    },
  );
  return server;
}

export async function startHostileUpstream(opts: { json?: boolean } = {}): Promise<HostileUpstream> {
  const writes: number[] = [];
  const transports = new Map<string, NodeStreamableHTTPServerTransport>();
  const httpServer = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    const sessionId = req.headers['mcp-session-id'];
    let transport = typeof sessionId === 'string' ? transports.get(sessionId) : undefined;
    if (!transport) {
      const created: NodeStreamableHTTPServerTransport = new NodeStreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: opts.json ?? false,
        onsessioninitialized: (id) => void transports.set(id, created),
      });
      created.onclose = () => {
        if (created.sessionId) transports.delete(created.sessionId);
      };
      await hostileServer(writes).connect(created);
      transport = created;
    }
    await transport.handleRequest(req, res, body);
  });
  await new Promise<void>((resolve) => httpServer.listen(0, '127.0.0.1', resolve));
  const { port } = httpServer.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/mcp`,
    writes,
    async close() {
      await Promise.allSettled([...transports.values()].map((t) => t.close()));
      httpServer.closeAllConnections();
      await new Promise<void>((resolve) => httpServer.close(() => resolve()));
    },
  };
}

if (process.argv[2] === 'stdio') {
  await hostileServer([]).connect(new StdioServerTransport());
}

// Run as its own process over HTTP (the abuse drill: its answers cost this process, not the drill's).
if (process.argv[2] === 'http') {
  const { url } = await startHostileUpstream({ json: process.argv[3] === 'json' });
  process.stderr.write(`${JSON.stringify({ url })}\n`);
}
