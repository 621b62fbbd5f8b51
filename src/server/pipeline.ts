import { createHash, randomBytes, randomUUID } from 'node:crypto';
import canonicalize from 'canonicalize';
import { ProtocolError, ProtocolErrorCode } from '@modelcontextprotocol/server';
import type { CallToolResult, Tool } from '@modelcontextprotocol/server';
import { z } from 'zod';
import type { Approvals } from '../approval/index.ts';
import { runWrite, type WriteControls } from '../approval/gate.ts';
import { AuditUnavailableError, type AuditLog } from '../audit/log.ts';
import type { Config } from '../config.ts';
import { isConnectionError } from '../db/knex.ts';
import type { ConnectorSet } from '../connectors/index.ts';
import type { BlobStore } from '../connectors/local/blobs.ts';
import type { Upstream } from '../connectors/mcp/upstream.ts';
import type { Logger } from '../log.ts';
import type { CursorCodec } from '../tools/cursor.ts';
import { envelopeSchema, type AuditBlock, type ErrorBlock } from '../tools/envelope.ts';
import { ToolError } from '../tools/errors.ts';
import type { AnyToolDef, ToolContext, ToolOutcome } from '../tools/types.ts';
import { upstreamToolDefs } from '../tools/upstream.ts';
import type { Agent } from './agents.ts';
import { Overrun, withDeadline } from './deadline.ts';
import type { MemoryStore } from './memory.ts';
import type { Metrics } from './metrics.ts';
import type { Profile } from './profiles.ts';
import type { RateLimiter } from './rate-limit.ts';

export interface PipelineDeps {
  tools: readonly AnyToolDef[];
  /** Upstream MCP servers whose tools are re-exposed as `<upstream>__<tool>`; their lists change at run time. */
  upstreams?: readonly Upstream[];
  audit: AuditLog;
  connectors: ConnectorSet;
  cursors: CursorCodec;
  approvals: Approvals;
  blobs: BlobStore;
  memory: MemoryStore;
  /** Calls per agent per minute, counted across the cluster. */
  limiter: RateLimiter;
  profiles: ReadonlyMap<string, Profile>;
  metrics: Metrics;
  config: Config;
  log: Logger;
}

export interface CallPipeline {
  listTools(agent: Agent): Tool[];
  /** Runs one tools/call. Tool failures come back as `isError` results; protocol errors are thrown as McpError. */
  call(agent: Agent, name: string, args: unknown, signal: AbortSignal): Promise<CallToolResult>;
  /** Calls `listener` whenever the tool list changed (an upstream's tools); returns the unsubscribe. */
  onListChanged(listener: () => void): () => void;
}

/** The tools on offer right now, by exposed name, in list order. */
interface Catalog {
  byName: Map<string, AnyToolDef>;
  listing: Map<string, Tool>;
}

/** Annotations follow from a tool's kind, never set by hand (STYLE §3). */
function annotationsFor(tool: AnyToolDef): Tool['annotations'] {
  if (tool.kind === 'internal') {
    return {
      title: tool.title,
      readOnlyHint: false,
      destructiveHint: false,
      idempotentHint: true,
      openWorldHint: false,
    };
  }
  return tool.kind === 'read'
    ? { title: tool.title, readOnlyHint: true, openWorldHint: true }
    : {
        title: tool.title,
        readOnlyHint: false,
        destructiveHint: false,
        idempotentHint: true,
        openWorldHint: true,
      };
}

function listingOf(tool: AnyToolDef, exposed: string): Tool {
  return {
    name: exposed,
    title: tool.title,
    description: tool.description,
    inputSchema: tool.listing?.inputSchema ?? jsonSchema(tool.input, 'input'),
    outputSchema: jsonSchema(envelopeSchema(tool.output), 'output') as Tool['outputSchema'],
    annotations: tool.listing?.annotations ?? annotationsFor(tool),
  };
}

function jsonSchema(schema: z.ZodType, io: 'input' | 'output'): Tool['inputSchema'] {
  const { $schema: _drop, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: 'any' }) as Record<
    string,
    unknown
  >;
  return rest as Tool['inputSchema'];
}

function describeIssue(issue: z.core.$ZodIssue): string {
  const where = issue.path.length > 0 ? issue.path.join('.') : 'arguments';
  return `${where}: ${issue.message}`;
}

const newTraceId = () => randomBytes(16).toString('hex');

/** The path of the first string (or key) holding a NUL byte, which no PostgreSQL text can store. */
function nulPath(value: unknown, path: string): string | undefined {
  if (typeof value === 'string') return value.includes('\0') ? path : undefined;
  if (Array.isArray(value)) {
    for (const [i, v] of value.entries()) {
      const found = nulPath(v, `${path}.${i}`);
      if (found) return found;
    }
  } else if (value && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      const found = k.includes('\0') ? `${path}.${k}` : nulPath(v, `${path}.${k}`);
      if (found) return found;
    }
  }
  return undefined;
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
 * The one seam every tool call passes through: (auth, done by the transport) → profile → rate limit →
 * validate → handler (under the call deadline) → envelope → audit. The audit row is committed before
 * the response leaves; if it cannot be, the caller gets an internal error instead of an unaudited result.
 */
export function createCallPipeline(deps: PipelineDeps): CallPipeline {
  const prefix = deps.config.tools.prefix;
  const upstreams = deps.upstreams ?? [];
  const builtins = deps.tools.map((t) => [prefix + t.name, t, listingOf(t, prefix + t.name)] as const);

  /** Built-ins first, then each upstream's tools; an upstream tool never shadows a built-in. */
  function buildCatalog(): Catalog {
    const byName = new Map<string, AnyToolDef>(builtins.map(([n, t]) => [n, t]));
    const listing = new Map<string, Tool>(builtins.map(([n, , l]) => [n, l]));
    for (const upstream of upstreams) {
      const overrides = deps.config.upstreams.find((u) => u.name === upstream.name)?.tools ?? {};
      for (const def of upstreamToolDefs(upstream, overrides, deps.log)) {
        if (byName.has(def.name)) {
          deps.log.error({ tool: def.name }, 'upstream tool not exposed: a built-in tool has its name');
          continue;
        }
        byName.set(def.name, def);
        listing.set(def.name, listingOf(def, def.name));
      }
    }
    return { byName, listing };
  }
  let catalog = buildCatalog();
  const listeners = new Set<() => void>();
  for (const upstream of upstreams) {
    upstream.onToolsChanged(() => {
      catalog = buildCatalog();
      for (const listener of listeners) listener();
    });
  }
  /** The upstream a name belongs to when that upstream is not connected (its tools answer SOURCE_UNAVAILABLE). */
  const downUpstreamOf = (name: string) =>
    upstreams.find((u) => name.startsWith(`${u.name}__`) && u.status().state !== 'up');

  const profileOf = (agent: Agent) => deps.profiles.get(agent.profile);

  async function call(
    agent: Agent,
    name: string,
    args: unknown,
    signal: AbortSignal,
  ): Promise<CallToolResult> {
    const trace_id = newTraceId();
    try {
      return await audited(agent, name, args, signal, trace_id);
    } catch (err) {
      if (err instanceof AuditUnavailableError) {
        deps.metrics.record(name.slice(0, 64), 'SOURCE_UNAVAILABLE', 0);
        throw databaseUnavailable(trace_id);
      }
      throw err;
    }
  }

  async function audited(
    agent: Agent,
    name: string,
    args: unknown,
    signal: AbortSignal,
    trace_id: string,
  ): Promise<CallToolResult> {
    const started = new Date();
    const request_id = randomUUID();
    const tool = catalog.byName.get(name);
    const argsSha256 = createHash('sha256')
      .update(canonicalize(args ?? {}) ?? '')
      .digest('hex');
    const base = { kind: 'tool.call' as const, request_id, trace_id, agent_id: agent.id, tool: name };
    const seconds = () => (Date.now() - started.getTime()) / 1000;

    const down = tool ? undefined : downUpstreamOf(name);
    if (down) {
      const failure = down.unavailable();
      return respond({
        name,
        agent,
        started,
        request_id,
        trace_id,
        argsSha256,
        base,
        outcome: undefined,
        failure,
      });
    }
    if (!tool) {
      await deps.audit.append({
        ...base,
        result: 'error',
        error_code: 'UNKNOWN_TOOL',
        details: { args_sha256: argsSha256 },
      });
      deps.metrics.record(name.slice(0, 64), 'UNKNOWN_TOOL', seconds());
      throw new ProtocolError(ProtocolErrorCode.InvalidParams, `Unknown tool: ${name}`);
    }

    const profile = profileOf(agent);
    if (!profile || !profile.allowed.has(tool.facet)) {
      const reason = profile
        ? (profile.deny[tool.facet] ?? `the ${tool.facet} facet is not allowed`)
        : `this agent's profile "${agent.profile}" is not installed on this server`;
      await deps.audit.append({
        kind: 'auth.denied',
        request_id,
        trace_id,
        agent_id: agent.id,
        tool: name,
        result: 'error',
        error_code: 'TOOL_DENIED',
        details: { facet: tool.facet, profile: agent.profile, reason },
      });
      deps.metrics.denied();
      // SPEC §4 says -32002; SDK v2 answers any handler's -32002 as -32602 on every revision (2026-07-28
      // reserves -32002), so it is said as it will be sent. data.code TOOL_DENIED tells it apart.
      throw new ProtocolError(
        ProtocolErrorCode.InvalidParams,
        `Tool ${name} is not available to this agent: ${reason}`,
        {
          code: 'TOOL_DENIED',
          reason,
          trace_id,
        },
      );
    }

    let outcome: ToolOutcome<Record<string, unknown>> | undefined;
    let failure: ToolError | undefined;
    try {
      const wait = await deps.limiter.take(
        agent.id,
        agent.rate_limit_per_min ?? deps.config.policy.rate_limit_per_min,
      );
      if (wait > 0) {
        throw new ToolError('RATE_LIMITED', `too many calls: retry in ${wait} s`, 'rate_limited', {
          details: { retry_after_s: wait },
        });
      }
      const nul = nulPath(args ?? {}, 'arguments');
      if (nul)
        throw new ToolError(
          'INVALID_ARGUMENT',
          `${nul.replace(/^arguments\./, '')}: contains a NUL byte`,
          'nul_byte',
        );
      const parsed = tool.input.safeParse(args ?? {});
      if (!parsed.success) {
        const first = parsed.error.issues[0]!;
        throw new ToolError('INVALID_ARGUMENT', describeIssue(first), 'invalid_argument', {
          details: { issues: parsed.error.issues.map(describeIssue) },
        });
      }
      // A result that arrives after the deadline is thrown away, and counted.
      outcome = await withDeadline(
        signal,
        deps.config.limits.call_timeout_ms,
        async (callSignal) => {
          if (deps.config.testing.delay_ms)
            await new Promise((r) => setTimeout(r, deps.config.testing.delay_ms));
          const ctx: ToolContext = {
            agent,
            request_id,
            trace_id,
            connectors: deps.connectors,
            cursors: deps.cursors,
            config: deps.config,
            approvals: deps.approvals,
            blobs: deps.blobs,
            memory: deps.memory,
            dryRunOnly: profile.dry_run_only.includes(tool.facet),
            signal: callSignal,
          };
          return tool.kind === 'write'
            ? runWrite(tool, parsed.data as WriteControls & Record<string, unknown>, ctx)
            : tool.handler(parsed.data, ctx);
        },
        () => deps.metrics.lateResult(),
      );
    } catch (err) {
      // Protocol errors: audited with their code, counted, and answered as JSON-RPC errors.
      const protocolError = async (errorCode: string, rpcCode: number, message: string, dataCode: string) => {
        await deps.audit.append({
          ...base,
          result: 'error',
          error_code: errorCode,
          details: { args_sha256: argsSha256 },
        });
        deps.metrics.record(name, errorCode, seconds());
        return new ProtocolError(rpcCode, message, { code: dataCode, trace_id });
      };
      if (err instanceof Overrun) {
        deps.metrics.overrun();
        // A write past write.started stays `executing` until reconciliation settles it: never "not sent".
        const limit = deps.config.limits.call_timeout_ms;
        throw await protocolError(
          'CALL_TIMEOUT',
          -32001,
          `Call exceeded its deadline of ${limit} ms`,
          'CALL_TIMEOUT',
        );
      }
      // The database went away under the handler: said as such, and audited if it is back in time.
      const known =
        err instanceof AuditUnavailableError || isConnectionError(err)
          ? new ToolError(
              'SOURCE_UNAVAILABLE',
              'the database is unavailable; retry shortly',
              'database_unavailable',
              {
                details: { retry_after_s: 1 },
              },
            )
          : err;
      if (!(known instanceof ToolError)) {
        deps.log.error({ err, trace_id, tool: name, agent: agent.name }, 'tool handler crashed');
        throw await protocolError(
          'INTERNAL_ERROR',
          ProtocolErrorCode.InternalError,
          `Internal error (trace_id ${trace_id})`,
          'INTERNAL',
        );
      }
      failure = known;
    }
    return respond({ name, agent, started, request_id, trace_id, argsSha256, base, outcome, failure });
  }

  async function respond(c: {
    name: string;
    agent: Agent;
    started: Date;
    request_id: string;
    trace_id: string;
    argsSha256: string;
    base: { kind: 'tool.call'; request_id: string; trace_id: string; agent_id: string; tool: string };
    outcome: ToolOutcome<Record<string, unknown>> | undefined;
    failure: ToolError | undefined;
  }): Promise<CallToolResult> {
    const { outcome, failure } = c;
    const facts = outcome?.audit ?? {};
    const dryRun = facts.dry_run ?? false;
    const row = await deps.audit.append({
      ...c.base,
      source: facts.source ?? null,
      target_type: facts.target_type ?? null,
      target_ref: facts.target_ref ?? null,
      approval_id: facts.approval_id ?? null,
      dry_run: dryRun,
      content_sha256: facts.content_sha256 ?? null,
      file_sha256: facts.file_sha256 ?? null,
      result: failure ? 'error' : 'ok',
      error_code: failure?.code ?? null,
      details: {
        args_sha256: c.argsSha256,
        duration_ms: Date.now() - c.started.getTime(),
        ...(failure ? { reason: failure.reason ?? null } : {}),
        ...facts.details,
      },
    });
    deps.metrics.record(c.name, failure?.code ?? null, (Date.now() - c.started.getTime()) / 1000);

    const audit: AuditBlock = {
      tool: c.name,
      request_id: c.request_id,
      trace_id: c.trace_id,
      source: facts.source ?? null,
      operator_id: c.agent.id,
      approval_id: facts.approval_id ?? null,
      dry_run: dryRun,
      target_ref: facts.target_ref ?? null,
      content_sha256: facts.content_sha256 ?? null,
      file_sha256: facts.file_sha256 ?? null,
      started_at: c.started.toISOString(),
      finished_at: new Date().toISOString(),
      result: failure ? 'error' : 'ok',
      audit_seq: row.seq,
    };

    let envelope: Record<string, unknown>;
    if (failure) {
      const error: ErrorBlock = {
        code: failure.code,
        message: failure.message,
        reason: failure.reason ?? null,
        trace_id: c.trace_id,
        ...(failure.details ? { details: failure.details } : {}),
        ...(typeof failure.details?.retry_after_s === 'number'
          ? { retry_after_s: failure.details.retry_after_s }
          : {}),
      };
      envelope = { ok: false, status: 'error', next_cursor: null, error, audit };
    } else {
      envelope = {
        ok: true,
        status: outcome!.empty ? 'empty' : 'ok',
        ...outcome!.data,
        next_cursor: outcome!.next_cursor ?? null,
        audit,
      };
    }
    return {
      structuredContent: envelope,
      content: [{ type: 'text', text: JSON.stringify(envelope) }],
      ...(failure ? { isError: true } : {}),
    };
  }

  return {
    listTools: (agent) => {
      const profile = profileOf(agent);
      const { byName, listing } = catalog;
      return [...byName.entries()]
        .filter(([, t]) => profile?.allowed.has(t.facet))
        .map(([n]) => listing.get(n)!);
    },
    call,
    onListChanged(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
  };
}
