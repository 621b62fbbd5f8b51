import { AsyncLocalStorage } from 'node:async_hooks';
import {
  createTraceState,
  isSpanContextValid,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type Context,
  type Span,
} from '@opentelemetry/api';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { newTraceId } from '../core/ids.ts';
import type { ActiveSpan, SpanAttributes, TraceCarrier, Tracer } from '../core/tracing.ts';
import { SERVER_NAME } from './mcp.ts';
import { errorTypeOf } from './tracing.ts';

/**
 * The OpenTelemetry side of tracing. Imported only when an OTLP endpoint is configured (src/app/services/tracing.ts),
 * so that a server without one never loads the SDK.
 */
export interface Tracing extends Tracer {
  /** Exports the spans still buffered, then stops. */
  shutdown(): Promise<void>;
}

/**
 * Spans batched and sent as OTLP/HTTP JSON to `url`. Nothing is registered globally: the current span is
 * kept in this instance's own async context, so two servers in one process (the tests) stay apart.
 * The exporter still reads the other standard OTEL_EXPORTER_OTLP_* variables (headers, timeout,
 * compression) from the environment, as the SDK documents.
 */
export function startTracing(opts: { url: string; version: string }): Tracing {
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': SERVER_NAME, 'service.version': opts.version }),
    // Trace ids from the same CSPRNG pool as when tracing is off; the SDK's default uses Math.random.
    idGenerator: { generateTraceId: newTraceId, generateSpanId: () => newTraceId().slice(16) },
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: opts.url }))],
  });
  const tracer = provider.getTracer(SERVER_NAME, opts.version);
  const current = new AsyncLocalStorage<Context>();

  function run<T>(
    name: string,
    attributes: SpanAttributes,
    kind: SpanKind,
    parent: Context,
    fn: (span: ActiveSpan) => Promise<T>,
  ): Promise<T> {
    const span = tracer.startSpan(name, { kind, attributes: defined(attributes) }, parent);
    const handle = activeSpan(span);
    return current.run(trace.setSpan(parent, span), async () => {
      try {
        return await fn(handle);
      } catch (err) {
        handle.fail(errorTypeOf(err));
        throw err;
      } finally {
        span.end();
      }
    });
  }

  return {
    span: (name, attributes, fn) =>
      run(name, attributes, SpanKind.INTERNAL, current.getStore() ?? ROOT_CONTEXT, fn),
    serve: (name, attributes, carrier, fn) =>
      run(name, attributes, SpanKind.SERVER, remoteParent(carrier), fn),
    shutdown: () => provider.shutdown(),
  };
}

function activeSpan(span: Span): ActiveSpan {
  return {
    traceId: span.spanContext().traceId,
    set: (attributes) => span.setAttributes(defined(attributes)),
    // The message is left out on purpose: error messages may quote the agent's arguments.
    fail(errorType) {
      span.setAttribute('error.type', errorType);
      span.setStatus({ code: SpanStatusCode.ERROR });
    },
  };
}

const defined = (attributes: SpanAttributes): Attributes =>
  Object.fromEntries(Object.entries(attributes).filter(([, v]) => v !== undefined)) as Attributes;

/** version-traceid-parentid-flags, lowercase hex (W3C Trace Context, level 1). */
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/**
 * The caller's span as the parent context, when its traceparent is valid; otherwise the root (a new
 * trace). Per W3C: version ff is invalid, version 00 has exactly four fields, all-zero ids are invalid.
 */
function remoteParent(carrier: TraceCarrier): Context {
  const m = carrier.traceparent ? TRACEPARENT.exec(carrier.traceparent.trim()) : null;
  if (!m || m[1] === 'ff' || (m[1] === '00' && m[5] !== undefined)) return ROOT_CONTEXT;
  const spanContext = {
    traceId: m[2]!,
    spanId: m[3]!,
    traceFlags: parseInt(m[4]!, 16) & 1,
    isRemote: true,
    traceState: carrier.tracestate ? createTraceState(carrier.tracestate) : undefined,
  };
  return isSpanContextValid(spanContext) ? trace.setSpanContext(ROOT_CONTEXT, spanContext) : ROOT_CONTEXT;
}
