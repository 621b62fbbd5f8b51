import { Server } from '@modelcontextprotocol/server';
import { newTraceId } from '../core/ids.ts';
import type { ActiveSpan } from '../core/tracing.ts';
import { outageOf } from '../db/outage.ts';
import { nothingDone } from './answer.ts';
import type { CallPipeline } from './call.ts';
import type { TaskWaits } from './task-waits.ts';
import type { RequestContext } from './call-context.ts';
import { asCoreTaskResult, handleTasks, taskAsk, tasksCapability } from './tasks.ts';
import { inRequestSpan } from './tracing.ts';

export const SERVER_NAME = 'countersign';

const INSTRUCTIONS =
  'Read tools run freely. Write tools default to dry_run and only execute with an approval_id ' +
  'issued by a human approver for exactly that content; every call is audited.';

/**
 * A low-level MCP Server for a serving unit: an HTTP request (any protocol revision), a run of plain
 * 2025-era HTTP requests one at a time (json-exchange.ts), or a stdio connection. Only tools/list and
 * tools/call are handled; every other method gets the SDK's -32601. Each request's context (its caller,
 * its answer hold) comes from `context`, asked once per request, and the instance holds nothing a later
 * request needs, so any replica can answer any request.
 */
export function createMcpServer(opts: {
  /**
   * The context of the request being answered: who calls (authenticated by the transport, or here for
   * stdio, where the token is checked again at each request) and the answer hold, if the transport has
   * one. Throws ProtocolError if the caller is refused.
   */
  context(): RequestContext | Promise<RequestContext>;
  pipeline: CallPipeline;
  version: string;
  /** What tasks/result waits on (task-waits.ts); without it, a timer. */
  taskWaits?: TaskWaits;
}): Server {
  const server = new Server(
    { name: SERVER_NAME, version: opts.version },
    { capabilities: { tools: { listChanged: true }, ...tasksCapability }, instructions: INSTRUCTIONS },
  );
  // Authenticating may need the database: an outage is answered as such, not as an internal error.
  const context = async (span?: ActiveSpan) => {
    try {
      return await opts.context();
    } catch (err) {
      if (outageOf(err)) throw nothingDone(span?.traceId ?? newTraceId());
      throw err;
    }
  };
  // With tracing on, each request runs in its span (server/tracing.ts); without, as it is.
  const tracer = opts.pipeline.tracer;
  server.setRequestHandler('tools/list', async (_request, ctx) => {
    const list = async (span?: ActiveSpan) => ({
      tools: opts.pipeline.listTools((await context(span)).agent),
    });
    return tracer ? inRequestSpan(tracer, server, ctx, undefined, list) : list();
  });
  server.setRequestHandler('tools/call', async (request, ctx) => {
    const run = async (span?: ActiveSpan) => {
      const { agent, hold } = await context(span);
      const { name, arguments: args } = request.params;
      const ask = taskAsk(ctx.mcpReq.envelope, request.params);
      const result = await opts.pipeline.call(agent, name, args, ctx.mcpReq.signal, hold, {
        asTask: ask !== undefined,
      });
      return ask === 'core' ? asCoreTaskResult(result) : result;
    };
    return tracer ? inRequestSpan(tracer, server, ctx, request.params.name, run) : run();
  });
  handleTasks(server, opts.pipeline, async () => (await context()).agent, opts.taskWaits);
  return server;
}
