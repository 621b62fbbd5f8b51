import { Server } from '@modelcontextprotocol/server';
import { isAuditUnavailable } from '../audit/log.ts';
import { isConnectionError } from '../db/knex.ts';
import type { Agent } from '../core/identity.ts';
import { databaseUnavailable, type CallPipeline } from './pipeline.ts';
import { newTraceId } from '../core/ids.ts';
import type { ActiveSpan } from '../core/tracing.ts';
import { inRequestSpan } from './tracing.ts';
import { ANSWER_HOLD, type AnswerHold } from './answer-hold.ts';

export const SERVER_NAME = 'countersign';

const INSTRUCTIONS =
  'Read tools run freely. Write tools default to dry_run and only execute with an approval_id ' +
  'issued by a human approver for exactly that content; every call is audited.';

/**
 * One low-level MCP Server for one serving unit: an HTTP request (any protocol revision) or a stdio
 * connection. Only tools/list and tools/call are handled; every other method gets the SDK's -32601.
 * The instance holds nothing a later request needs, so any replica can answer any request.
 */
export function createMcpServer(opts: {
  /** Resolves the caller for each request (auth step of the pipeline); throws ProtocolError if refused. */
  authorize(): Promise<Agent>;
  pipeline: CallPipeline;
  version: string;
}): Server {
  const server = new Server(
    { name: SERVER_NAME, version: opts.version },
    { capabilities: { tools: { listChanged: true } }, instructions: INSTRUCTIONS },
  );
  // Authorising needs the database: an outage is answered as such, not as an internal error.
  const authorize = (span?: ActiveSpan) =>
    opts.authorize().catch((err: unknown) => {
      if (isAuditUnavailable(err) || isConnectionError(err)) {
        throw databaseUnavailable(span?.traceId ?? newTraceId());
      }
      throw err;
    });
  // With tracing on, each request runs in its span (server/tracing.ts); without, as it is.
  const tracer = opts.pipeline.tracer;
  server.setRequestHandler('tools/list', async (_request, ctx) => {
    const list = async (span?: ActiveSpan) => ({ tools: opts.pipeline.listTools(await authorize(span)) });
    return tracer ? inRequestSpan(tracer, server, ctx, undefined, list) : list();
  });
  server.setRequestHandler('tools/call', async (request, ctx) => {
    const run = async (span?: ActiveSpan) => {
      const agent = await authorize(span);
      return opts.pipeline.call(
        agent,
        request.params.name,
        request.params.arguments,
        ctx.mcpReq.signal,
        ctx.http?.authInfo?.extra?.[ANSWER_HOLD] as AnswerHold | undefined,
      );
    };
    return tracer ? inRequestSpan(tracer, server, ctx, request.params.name, run) : run();
  });
  return server;
}
