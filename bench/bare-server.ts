/**
 * The baseline of figure (a): a bare MCP SDK server served as countersign serves (the SDK's stateless
 * createMcpHandler, both protocol revisions, a fresh instance per request), with one tool that runs the
 * same search_contacts query (the local connector's own SQL) on the same database — no auth, no
 * profile, no rate limit, no envelope, no audit.
 *
 *   DATABASE_URL=postgres://… node --import tsx bench/bare-server.ts
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { toNodeHandler } from '@modelcontextprotocol/node';
import { createMcpHandler, McpServer } from '@modelcontextprotocol/server';
import { z } from 'zod';
import { createBlobStore } from '../src/connectors/local/blobs.ts';
import { WRITE_FENCE } from '../src/approval/index.ts';
import { createLocalConnector } from '../src/connectors/local/store.ts';
import { openDatabase } from '../src/db/knex.ts';

const db = await openDatabase({ url: process.env.DATABASE_URL!, pgliteDir: '', command: 'bare server' });
const local = createLocalConnector(db.knex, createBlobStore('/nonexistent'), WRITE_FENCE);

function newServer(): McpServer {
  const server = new McpServer({ name: 'bare', version: '1.0.0' });
  server.registerTool(
    'search_contacts',
    {
      description: 'Search contacts',
      inputSchema: z.object({ query: z.string(), limit: z.number().int().min(1).max(100).default(20) }),
    },
    async ({ query, limit }) => {
      const page = await local.searchContacts({ query, includeInactive: false, limit, after: undefined });
      const data = { contacts: page.items.map((c) => ({ ...c, source: 'local' })) };
      return { structuredContent: data, content: [{ type: 'text', text: JSON.stringify(data) }] };
    },
  );
  return server;
}

const serve = toNodeHandler(createMcpHandler(newServer));
const listener = http.createServer((req, res) => void serve(req, res));
listener.listen(0, '127.0.0.1', () => {
  const { port } = listener.address() as AddressInfo;
  process.stderr.write(`${JSON.stringify({ url: `http://127.0.0.1:${port}/mcp` })}\n`);
});
process.once('SIGTERM', () => {
  listener.closeAllConnections();
  listener.close(() => void db.close().then(() => process.exit(0)));
});
