import { Server, type AuthInfo } from '@modelcontextprotocol/server';
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
 * A low-level MCP Server for a serving unit: an HTTP request (any protocol revision), a run of plain
 * 2025-era HTTP requests one at a time (json-exchange.ts), or a stdio connection. Only tools/list and
 * tools/call are handled; every other method gets the SDK's -32601. Each request is authorised from
 * what came with it, and the instance holds nothing a later request needs, so any replica can answer
 * any request.
 */
export function createMcpServer(opts: {
  /**
   * Resolves the caller of each request (auth step of the pipeline) from what the transport handed
   * on with it, if anything; throws ProtocolError if refused.
   */
  authorize(authInfo: AuthInfo | undefined): Promise<Agent>;
  pipeline: CallPipeline;
  version: string;
}): Server {
  const server = new Server(
    { name: SERVER_NAME, version: opts.version },
    { capabilities: { tools: { listChanged: true } }, instructions: INSTRUCTIONS },
  );
  // Authorising needs the database: an outage is answered as such, not as an internal error.
  const authorize = (authInfo: AuthInfo | undefined, span?: ActiveSpan) =>
    opts.authorize(authInfo).catch((err: unknown) => {
      if (isAuditUnavailable(err) || isConnectionError(err)) {
        throw databaseUnavailable(span?.traceId ?? newTraceId());
      }
      throw err;
    });
  // With tracing on, each request runs in its span (server/tracing.ts); without, as it is.
  const tracer = opts.pipeline.tracer;
  server.setRequestHandler('tools/list', async (_request, ctx) => {
    const list = async (span?: ActiveSpan) => ({
      tools: opts.pipeline.listTools(await authorize(ctx.http?.authInfo, span)),
    });
    return tracer ? inRequestSpan(tracer, server, ctx, undefined, list) : list();
  });
  server.setRequestHandler('tools/call', async (request, ctx) => {
    const run = async (span?: ActiveSpan) => {
      const agent = await authorize(ctx.http?.authInfo, span);
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
