import { randomBytes } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { AuditUnavailableError } from '../audit/log.ts';
import { isConnectionError } from '../db/knex.ts';
import type { Agent } from './agents.ts';
import { databaseUnavailable, type CallPipeline } from './pipeline.ts';

export const SERVER_NAME = 'countersign';

/**
 * One low-level MCP Server per session, bound to the agent that opened it. Only tools/list and tools/call
 * are handled; every other method gets the SDK's -32601.
 */
export function createMcpServer(opts: {
  /** Resolves the session's agent for each request (auth step of the pipeline); throws McpError if refused. */
  authorize(): Promise<Agent>;
  pipeline: CallPipeline;
  version: string;
}): Server {
  const server = new Server(
    { name: SERVER_NAME, version: opts.version },
    {
      capabilities: { tools: { listChanged: true } },
      instructions:
        'Read tools run freely. Write tools default to dry_run and only execute with an approval_id ' +
        'issued by a human approver for exactly that content; every call is audited.',
    },
  );
  // Upstream tool lists change at run time: tell this session's client to list again.
  const unsubscribe = opts.pipeline.onListChanged(() => {
    server.sendToolListChanged().catch(() => undefined);
  });
  server.onclose = unsubscribe;
  // Authorising needs the database: an outage is answered as such, not as an internal error.
  const authorize = () =>
    opts.authorize().catch((err: unknown) => {
      if (err instanceof AuditUnavailableError || isConnectionError(err)) {
        throw databaseUnavailable(randomBytes(16).toString('hex'));
      }
      throw err;
    });
  server.setRequestHandler(ListToolsRequestSchema, async () => {
    const agent = await authorize();
    return { tools: opts.pipeline.listTools(agent) };
  });
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const agent = await authorize();
    return opts.pipeline.call(agent, request.params.name, request.params.arguments, extra.signal);
  });
  return server;
}
