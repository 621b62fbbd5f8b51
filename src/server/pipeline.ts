import { ProtocolError } from '@modelcontextprotocol/server';
import type { CallToolResult, Tool } from '@modelcontextprotocol/server';
import { isAuditUnavailable } from '../audit/log.ts';
import type { AppError } from '../core/errors.ts';
import type { Agent } from '../core/identity.ts';
import type { Tracer } from '../core/tracing.ts';
import type { Upstream } from '../connectors/mcp/upstream.ts';
import type { Settled } from '../tools/envelope.ts';
import type { AnyToolDef } from '../tools/types.ts';
import type { AnswerHold } from './answer-hold.ts';
import { createCatalogue, type Catalogue } from './catalogue.ts';
import type { Profile } from './profiles.ts';
import { failIfToolError } from './tracing.ts';
import {
  admit,
  asFailure,
  asUnknownTool,
  metricLabelOf,
  beginCall,
  crashed,
  internalError,
  record,
  refuseUnknownTool,
  runHandler,
  takeRate,
  validate,
  type Call,
  type StepDeps,
} from './steps.ts';

export interface PipelineDeps extends StepDeps {
  tools: readonly AnyToolDef[];
  /** Upstream MCP servers whose tools are re-exposed as `<upstream>__<tool>`; their lists change at run time. */
  upstreams?: readonly Upstream[];
}

export interface CallPipeline {
  listTools(agent: Agent): Tool[];
  /**
   * Runs one tools/call. Tool failures come back as `isError` results; protocol errors are thrown. With
   * a `hold` (a transport that can hold the answer), the result may come back before its audit row has
   * committed, the commit then in the hold (AnswerHold); with tracing on, it never does.
   */
  call(
    agent: Agent,
    name: string,
    args: unknown,
    signal: AbortSignal,
    hold?: AnswerHold,
  ): Promise<CallToolResult>;
  /** Calls `listener` whenever the tool list changed (an upstream's tools); returns the unsubscribe. */
  onListChanged(listener: () => void): () => void;
  /** Set when tracing is on: the transport opens each request's span with it. */
  readonly tracer?: Tracer;
}

/** JSON-RPC code of a call that could not be audited because the database is unavailable. */
export const DATABASE_UNAVAILABLE = -32003;

/**
 * The database is unreachable, so the call cannot be audited and gets no tool result: a protocol error
 * whose data carries SOURCE_UNAVAILABLE and when to retry. Nothing was written without its audit row.
 */
export const databaseUnavailable = (trace_id: string) =>
  new ProtocolError(
    DATABASE_UNAVAILABLE,
    'The database is unavailable: the call was not completed; retry shortly',
    {
      code: 'SOURCE_UNAVAILABLE',
      reason: 'database_unavailable',
      retry_after_s: 1,
      trace_id,
    },
  );

/**
 * An execution whose write.started committed, and then the database went away: the write may have been
 * made, so the answer says the outcome is unknown and where to look, never that nothing was done.
 */
export const outcomeUnknownUnaudited = (trace_id: string, failure: AppError) =>
  new ProtocolError(DATABASE_UNAVAILABLE, `The database is unavailable: ${failure.message}`, {
    code: 'OUTCOME_UNKNOWN',
    reason: failure.reason ?? 'database_unavailable',
    ...failure.details,
    retry_after_s: 1,
    trace_id,
  });

/**
 * The one seam every tool call passes through (SPEC §2). Authentication is the transport's; then, in
 * order: rate limit (so every call counts, even of a tool that is unknown or denied) → look the name
 * up in the catalogue → profile → validate → handler (under the call deadline; writes through the
 * approval gate) → audit row → envelope. The audit row is committed before the answer leaves; if it
 * cannot be, the caller gets -32003 instead of an unaudited result.
 */
export function createCallPipeline(deps: PipelineDeps): CallPipeline {
  const catalogue = createCatalogue({ ...deps, upstreams: deps.upstreams ?? [] });
  return {
    listTools: (agent) => catalogue.listFor(deps.profiles.get(agent.profile)),
    // Chosen once: without tracing, a call takes exactly the path it always took.
    call: deps.tracer
      ? tracedCall(deps, catalogue, deps.tracer)
      : (agent, name, args, signal, hold) =>
          runCall(deps, catalogue, beginCall(agent, name, args, signal), hold),
    onListChanged: catalogue.onChanged,
    tracer: deps.tracer,
  };
}

/**
 * A call in its `execute_tool {tool}` span (the GenAI conventions' tool execution), a child of the
 * request's span; the envelope's trace_id is the span's trace id, and a failure its error.type.
 */
function tracedCall(deps: StepDeps, catalogue: Catalogue, tracer: Tracer): CallPipeline['call'] {
  return (agent, name, args, signal) =>
    tracer.span(
      `execute_tool ${name}`,
      { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': name },
      async (span) => {
        const call = beginCall(agent, name, args, signal, span.traceId);
        span.set({ 'gen_ai.tool.call.id': call.request_id, 'countersign.agent.id': agent.id });
        const result = await runCall(deps, catalogue, call);
        failIfToolError(span, result);
        return result;
      },
    );
}

async function runCall(
  deps: StepDeps,
  catalogue: Catalogue,
  call: Call,
  hold?: AnswerHold,
): Promise<CallToolResult> {
  // What the call settled as, once it has: an outage that then loses its audit row answers by it.
  let settled: Settled | undefined;
  // A commit the transport awaits fails as the call would have: with the protocol error to answer.
  const held: AnswerHold | undefined = hold && {
    until: (committed) =>
      hold.until(
        committed.catch(async (err: unknown) => {
          throw await heldFailure(deps, call, err, settled);
        }),
      ),
  };
  try {
    // The limiter's own failure (the database gone) is the call's answer, as it was in `settle`.
    const limited = await takeRate(deps, call).catch((err: unknown) => asFailure(deps, call, err));
    const entry = catalogue.lookup(call.name);
    if (entry.kind === 'unknown') call = asUnknownTool(call);
    if (limited) return await record(deps, call, { failure: limited }, held);
    if (entry.kind === 'unknown') return await refuseUnknownTool(deps, call);
    if (entry.kind === 'down')
      return await record(deps, call, { failure: entry.upstream.unavailable() }, held);
    const profile = await admit(deps, call, entry.tool);
    settled = await settle(deps, call, entry.tool, profile);
    return await record(deps, call, settled, held);
  } catch (err) {
    throw outage(deps, call, await crashed(deps, call, err), settled);
  }
}

/**
 * An audit row the database could not take is answered -32003, and counted: with OUTCOME_UNKNOWN when
 * the call was a write that had started, else SOURCE_UNAVAILABLE (nothing was done). Anything else
 * stays as is.
 */
function outage(deps: StepDeps, call: Call, err: unknown, settled?: Settled): unknown {
  if (!isAuditUnavailable(err)) return err;
  const unknown = settled?.failure?.code === 'OUTCOME_UNKNOWN' ? settled.failure : undefined;
  deps.metrics.record(metricLabelOf(call), unknown ? 'OUTCOME_UNKNOWN' : 'SOURCE_UNAVAILABLE', 0);
  return unknown ? outcomeUnknownUnaudited(call.trace_id, unknown) : databaseUnavailable(call.trace_id);
}

/**
 * A held commit's failure as the protocol error the transport answers with: an outage as -32003, and
 * anything else (a database error, a bug) as -32603 with the trace id, logged and audited (crashed) —
 * the transport answers it without the SDK.
 */
async function heldFailure(
  deps: StepDeps,
  call: Call,
  err: unknown,
  settled?: Settled,
): Promise<ProtocolError> {
  const failure = outage(deps, call, await crashed(deps, call, err), settled);
  if (failure instanceof ProtocolError) return failure;
  const { rpc, message, data } = internalError(call.trace_id);
  return new ProtocolError(rpc, message, { ...data, trace_id: call.trace_id });
}

/** The steps whose failures are the tool's answer (INVALID_ARGUMENT, the handler's own). */
async function settle(deps: StepDeps, call: Call, tool: AnyToolDef, profile: Profile): Promise<Settled> {
  try {
    const args = validate(tool, call);
    return { outcome: await runHandler(deps, call, tool, profile, args) };
  } catch (err) {
    return { failure: await asFailure(deps, call, err) };
  }
}
