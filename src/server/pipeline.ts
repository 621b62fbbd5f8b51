import { ProtocolError } from '@modelcontextprotocol/server';
import type { CallToolResult, Tool } from '@modelcontextprotocol/server';
import { isAuditUnavailable } from '../audit/log.ts';
import type { Agent } from '../core/identity.ts';
import type { Upstream } from '../connectors/mcp/upstream.ts';
import type { Settled } from '../tools/envelope.ts';
import type { AnyToolDef } from '../tools/types.ts';
import { createCatalogue, type Catalogue } from './catalogue.ts';
import type { Profile } from './profiles.ts';
import {
  admit,
  asFailure,
  beginCall,
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
  /** Runs one tools/call. Tool failures come back as `isError` results; protocol errors are thrown. */
  call(agent: Agent, name: string, args: unknown, signal: AbortSignal): Promise<CallToolResult>;
  /** Calls `listener` whenever the tool list changed (an upstream's tools); returns the unsubscribe. */
  onListChanged(listener: () => void): () => void;
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
 * The one seam every tool call passes through (SPEC §2). Authentication is the transport's; then, in
 * order: look the name up in the catalogue → profile → rate limit → validate → handler (under the call
 * deadline; writes through the approval gate) → audit row → envelope. The audit row is committed before
 * the answer leaves; if it cannot be, the caller gets -32003 instead of an unaudited result.
 */
export function createCallPipeline(deps: PipelineDeps): CallPipeline {
  const catalogue = createCatalogue({ ...deps, upstreams: deps.upstreams ?? [] });
  return {
    listTools: (agent) => catalogue.listFor(deps.profiles.get(agent.profile)),
    call: (agent, name, args, signal) => runCall(deps, catalogue, beginCall(agent, name, args, signal)),
    onListChanged: catalogue.onChanged,
  };
}

async function runCall(deps: StepDeps, catalogue: Catalogue, call: Call): Promise<CallToolResult> {
  try {
    const entry = catalogue.lookup(call.name);
    if (entry.kind === 'unknown') return await refuseUnknownTool(deps, call);
    if (entry.kind === 'down') return await record(deps, call, { failure: entry.upstream.unavailable() });
    const profile = await admit(deps, call, entry.tool);
    return await record(deps, call, await settle(deps, call, entry.tool, profile));
  } catch (err) {
    if (isAuditUnavailable(err)) {
      deps.metrics.record(call.name.slice(0, 64), 'SOURCE_UNAVAILABLE', 0);
      throw databaseUnavailable(call.trace_id);
    }
    throw err;
  }
}

/** The steps whose failures are the tool's answer (RATE_LIMITED, INVALID_ARGUMENT, the handler's own). */
async function settle(deps: StepDeps, call: Call, tool: AnyToolDef, profile: Profile): Promise<Settled> {
  try {
    await takeRate(deps, call);
    const args = validate(tool, call);
    return { outcome: await runHandler(deps, call, tool, profile, args) };
  } catch (err) {
    return { failure: await asFailure(deps, call, err) };
  }
}
