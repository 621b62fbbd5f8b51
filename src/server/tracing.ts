import {
  PROTOCOL_VERSION_META_KEY,
  ProtocolError,
  TRACEPARENT_META_KEY,
  TRACESTATE_META_KEY,
  type CallToolResult,
  type Server,
  type ServerContext,
} from '@modelcontextprotocol/server';
import { AppError } from '../core/errors.ts';
import type { ActiveSpan, TraceCarrier, Tracer } from '../core/tracing.ts';

/**
 * The span of one MCP request, after the OpenTelemetry MCP semantic conventions: named
 * `{mcp.method.name} {target}` (`tools/call isphere_search_contacts`, or just `tools/list`), kind SERVER,
 * continuing the caller's trace. This file holds no OpenTelemetry code: that is src/server/otel.ts,
 * loaded only when tracing is on.
 */
export function inRequestSpan<R>(
  tracer: Tracer,
  server: Server,
  ctx: ServerContext,
  tool: string | undefined,
  fn: (span: ActiveSpan) => Promise<R>,
): Promise<R> {
  const method = ctx.mcpReq.method;
  const attributes = {
    'mcp.method.name': method,
    'jsonrpc.request.id': String(ctx.mcpReq.id),
    'mcp.protocol.version': protocolVersion(server, ctx),
    'gen_ai.tool.name': tool,
    'gen_ai.operation.name': tool === undefined ? undefined : 'execute_tool',
    'network.transport': ctx.http ? 'tcp' : 'pipe',
  };
  return tracer.serve(tool ? `${method} ${tool}` : method, attributes, carrierOf(ctx), async (span) => {
    try {
      const result = await fn(span);
      failIfToolError(span, result);
      return result;
    } catch (err) {
      // A JSON-RPC error answer: its code is the response's status code (error.type is set by the span).
      if (err instanceof ProtocolError) span.set({ 'rpc.response.status_code': String(err.code) });
      throw err;
    }
  });
}

/** A tool failure is an answer (`isError`), not a throw: its envelope code is the span's error.type. */
export function failIfToolError(span: ActiveSpan, result: unknown): void {
  const r = result as Partial<CallToolResult> | undefined;
  if (!r?.isError) return;
  const code = (r.structuredContent as { error?: { code?: unknown } } | undefined)?.error?.code;
  span.fail(typeof code === 'string' ? code : 'tool_error');
}

/**
 * The caller's W3C trace context: `params._meta.traceparent` (the per-message place the conventions
 * recommend, and the only one a 2026-07-28 client over any transport has), else the HTTP request's
 * `traceparent` header.
 */
function carrierOf(ctx: ServerContext): TraceCarrier {
  const meta = ctx.mcpReq._meta as Record<string, unknown> | undefined;
  const fromMeta = meta?.[TRACEPARENT_META_KEY];
  if (typeof fromMeta === 'string') {
    const state = meta?.[TRACESTATE_META_KEY];
    return { traceparent: fromMeta, tracestate: typeof state === 'string' ? state : undefined };
  }
  const headers = ctx.http?.req?.headers;
  return {
    traceparent: headers?.get('traceparent') ?? undefined,
    tracestate: headers?.get('tracestate') ?? undefined,
  };
}

/** The revision the request speaks: its 2026-07-28 envelope, else the HTTP header, else the handshake's. */
function protocolVersion(server: Server, ctx: ServerContext): string | undefined {
  const fromEnvelope = (ctx.mcpReq.envelope as Record<string, unknown> | undefined)?.[
    PROTOCOL_VERSION_META_KEY
  ];
  if (typeof fromEnvelope === 'string') return fromEnvelope;
  const fromHeader = ctx.http?.req?.headers.get('mcp-protocol-version');
  // Deprecated for 2026-07-28 requests, which the envelope above already answered; a 2025-era stdio
  // connection has only its handshake to say which revision it speaks.
  return fromHeader ?? server.getNegotiatedProtocolVersion();
}

/**
 * A thrown error's `error.type`: an AppError's code, the code a protocol error carries in its data
 * (UNKNOWN_TOOL, TOOL_DENIED, CALL_TIMEOUT …) or else its JSON-RPC code, and the class name of anything else.
 */
export function errorTypeOf(err: unknown): string {
  if (err instanceof AppError) return err.code;
  if (err instanceof ProtocolError) {
    const code = (err.data as { code?: unknown } | undefined)?.code;
    return typeof code === 'string' ? code : String(err.code);
  }
  return err instanceof Error ? err.name : '_OTHER';
}

/**
 * Where spans are sent, by the OTLP/HTTP rules: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as given, else
 * OTEL_EXPORTER_OTLP_ENDPOINT with `/v1/traces` appended; neither set means tracing is off.
 */
export function tracesUrl(settings: { otlp_endpoint?: string; otlp_traces_endpoint?: string }) {
  if (settings.otlp_traces_endpoint) return settings.otlp_traces_endpoint;
  return settings.otlp_endpoint && `${settings.otlp_endpoint.replace(/\/+$/, '')}/v1/traces`;
}
