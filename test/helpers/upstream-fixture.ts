import { randomUUID } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { NodeStreamableHTTPServerTransport } from '@modelcontextprotocol/node';
import { McpServer } from '@modelcontextprotocol/server';
import type { RegisteredTool } from '@modelcontextprotocol/server';
import { z } from 'zod';

/**
 * A small real MCP server over Streamable HTTP, standing in for an operator's upstream: a note it keeps,
 * a tool that always fails, a slow one, one whose annotation lies, one that breaks its own output schema
 * on request, and a way to change a tool's input schema at run time (which the SDK announces with
 * notifications/tools/list_changed).
 */
export interface UpstreamFixture {
  url: string;
  port: number;
  /** Every set_note the fixture performed, in order. */
  notes: string[];
  /**
   * Adds a required `priority` parameter to set_note, on every open session; with `notify: 'first'` only
   * the first session's client is told (as when one replica of a cluster hears of a change).
   */
  reshape(opts?: { notify?: 'all' | 'first' }): void;
  close(): Promise<void>;
}

/**
 * An output schema announced to clients as `schema` that lets anything through on the server's side:
 * what an upstream that breaks its own promise looks like to countersign.
 */
const announcedOnly = (schema: Record<string, unknown>) => ({
  '~standard': {
    version: 1 as const,
    vendor: 'countersign-fixture',
    validate: (value: unknown) => ({ value }),
    jsonSchema: { input: () => schema, output: () => schema },
  },
});

export async function startUpstreamFixture(port = 0): Promise<UpstreamFixture> {
  const notes: string[] = [];
  const setNoteTools: { server: McpServer; tool: RegisteredTool }[] = [];
  const reshapedInput = z.object({ text: z.string().min(1), priority: z.number().int() });
  let reshaped = false;

  function newServer() {
    const server = new McpServer({ name: 'fixture-crm', version: '1.0.0' });
    server.registerTool(
      'get_note',
      { description: 'The last note.', inputSchema: z.object({}), annotations: { readOnlyHint: true } },
      async () => ({ content: [{ type: 'text', text: notes.at(-1) ?? '' }] }),
    );
    const setNote = server.registerTool(
      'set_note',
      { description: 'Replace the note.', inputSchema: z.object({ text: z.string().min(1) }) },
      async (args: { text: string; priority?: number }) => {
        notes.push(args.text);
        return { content: [{ type: 'text', text: `noted #${notes.length}` }] };
      },
    );
    if (reshaped) setNote.update({ paramsSchema: reshapedInput });
    setNoteTools.push({ server, tool: setNote });
    server.registerTool(
      'broken',
      { description: 'Always fails.', inputSchema: z.object({}), annotations: { readOnlyHint: true } },
      async () => ({ isError: true, content: [{ type: 'text', text: 'disk on fire' }] }),
    );
    server.registerTool(
      'slow',
      {
        description: 'Answers after `ms` milliseconds.',
        inputSchema: z.object({ ms: z.number().int().min(0).max(60_000) }),
        annotations: { readOnlyHint: true },
      },
      async ({ ms }) => {
        await new Promise((r) => setTimeout(r, ms));
        return { content: [{ type: 'text', text: 'finally' }] };
      },
    );
    server.registerTool(
      'count_notes',
      {
        description: 'How many notes there are, as structured content of the shape asked for.',
        inputSchema: z.object({ shape: z.enum(['valid', 'invalid', 'error']) }),
        outputSchema: announcedOnly({
          type: 'object',
          properties: { count: { type: 'integer' } },
          required: ['count'],
        }),
        annotations: { readOnlyHint: true },
      },
      async ({ shape }) => {
        const text = { type: 'text' as const, text: String(notes.length) };
        if (shape === 'error') return { isError: true, content: [{ type: 'text', text: 'cannot count' }] };
        return { content: [text], structuredContent: { count: shape === 'valid' ? notes.length : 'many' } };
      },
    );
    server.registerTool(
      'wipe',
      // The annotation claims a read; countersign's config says otherwise.
      { description: 'Clears every note.', inputSchema: z.object({}), annotations: { readOnlyHint: true } },
      async () => {
        notes.push('(wiped)');
        return { content: [{ type: 'text', text: 'wiped' }] };
      },
    );
    return server;
  }

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
        onsessioninitialized: (id) => void transports.set(id, created),
      });
      created.onclose = () => {
        if (created.sessionId) transports.delete(created.sessionId);
      };
      await newServer().connect(created);
      transport = created;
    }
    await transport.handleRequest(req, res, body);
  });
  await new Promise<void>((resolve) => httpServer.listen(port, '127.0.0.1', resolve));
  const bound = (httpServer.address() as AddressInfo).port;

  return {
    url: `http://127.0.0.1:${bound}/mcp`,
    port: bound,
    notes,
    reshape(opts = {}) {
      reshaped = true;
      for (const [i, { server, tool }] of setNoteTools.entries()) {
        if (opts.notify === 'first' && i > 0) {
          // Changed for this session too, but it is not told: only the first session's client hears of it.
          const notify = server.sendToolListChanged.bind(server);
          server.sendToolListChanged = () => undefined;
          tool.update({ paramsSchema: reshapedInput });
          server.sendToolListChanged = notify;
        } else {
          tool.update({ paramsSchema: reshapedInput });
        }
      }
    },
    async close() {
      await Promise.allSettled([...transports.values()].map((t) => t.close()));
      httpServer.closeAllConnections();
      await new Promise<void>((resolve) => httpServer.close(() => resolve()));
    },
  };
}

/** A port nothing listens on (yet). */
export async function freePort(): Promise<number> {
  const probe = http.createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address() as AddressInfo;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return port;
}
