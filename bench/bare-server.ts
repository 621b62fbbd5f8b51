/**
 * The baseline of figure (a): a bare MCP SDK server over Streamable HTTP, one session per client, with
 * one tool that runs the same search_contacts query (the local connector's own SQL) on the same
 * database — no auth, no profile, no rate limit, no envelope, no audit.
 *
 *   DATABASE_URL=postgres://… node --import tsx bench/bare-server.ts
 */
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { createBlobStore } from '../src/connectors/local/blobs.ts';
import { createLocalConnector } from '../src/connectors/local/store.ts';
import { openDatabase } from '../src/db/knex.ts';

const db = await openDatabase({ url: process.env.DATABASE_URL!, pgliteDir: '', command: 'bare server' });
const local = createLocalConnector(db.knex, createBlobStore('/nonexistent'));

function newServer(): McpServer {
  const server = new McpServer({ name: 'bare', version: '1.0.0' });
  server.registerTool(
    'search_contacts',
    {
      description: 'Search contacts',
      inputSchema: { query: z.string(), limit: z.number().int().min(1).max(100).default(20) },
    },
    async ({ query, limit }) => {
      const page = await local.searchContacts({ query, includeInactive: false, limit, after: undefined });
      const data = { contacts: page.items.map((c) => ({ ...c, source: 'local' })) };
      return { structuredContent: data, content: [{ type: 'text', text: JSON.stringify(data) }] };
    },
  );
  return server;
}

const sessions = new Map<string, StreamableHTTPServerTransport>();
const app = createMcpExpressApp();
app.all('/mcp', async (req, res) => {
  const id = req.get('mcp-session-id');
  const known = id ? sessions.get(id) : undefined;
  if (known) return known.handleRequest(req, res, req.body);
  if (req.method !== 'POST' || !isInitializeRequest(req.body)) return res.status(400).end();
  const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    onsessioninitialized: (sid) => void sessions.set(sid, transport),
  });
  transport.onclose = () => void (transport.sessionId && sessions.delete(transport.sessionId));
  await newServer().connect(transport);
  await transport.handleRequest(req, res, req.body);
});

const listener = app.listen(0, '127.0.0.1', () => {
  const { port } = listener.address() as AddressInfo;
  process.stderr.write(`${JSON.stringify({ url: `http://127.0.0.1:${port}/mcp` })}\n`);
});
process.once('SIGTERM', () => {
  listener.closeAllConnections();
  listener.close(() => void db.close().then(() => process.exit(0)));
});
