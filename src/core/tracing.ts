/**
 * The tracing seam every floor may use, without OpenTelemetry: the SDK lives in src/server/otel.ts and is
 * imported only when an OTLP endpoint is configured. Without one there is no Tracer at all (`undefined`),
 * and `traced` runs the step as it is, so the serving path pays nothing for tracing it does not do.
 */

/** Span attribute values; undefined ones are left out. */
export type SpanAttributes = Readonly<Record<string, string | number | boolean | undefined>>;

/** The span a step runs in. */
export interface ActiveSpan {
  /** 32 lowercase hex characters: the W3C trace id, also the envelope's trace_id. */
  readonly traceId: string;
  set(attributes: SpanAttributes): void;
  /** Marks the span failed: `error.type` and an error status. */
  fail(errorType: string, message?: string): void;
}

/** A W3C trace context handed in by the caller (the `traceparent` HTTP header, or `params._meta`). */
export interface TraceCarrier {
  traceparent?: string;
  tracestate?: string;
}

export interface Tracer {
  /**
   * Runs `fn` in a span that is a child of the current one (a root span when there is none) and current
   * while `fn` runs; ends it when `fn` settles. A throw marks it failed with the error's code.
   */
  span<T>(name: string, attributes: SpanAttributes, fn: (span: ActiveSpan) => Promise<T>): Promise<T>;
  /**
   * A SERVER span for one request received: it continues the caller's trace when `carrier` holds a valid
   * traceparent (same trace id, parent = the caller's span), else it starts a new trace.
   */
  serve<T>(
    name: string,
    attributes: SpanAttributes,
    carrier: TraceCarrier,
    fn: (span: ActiveSpan) => Promise<T>,
  ): Promise<T>;
}

/** `fn` in a child span when tracing is on; otherwise just `fn()`. */
export function traced<T>(
  tracer: Tracer | undefined,
  name: string,
  attributes: SpanAttributes,
  fn: () => Promise<T>,
): Promise<T> {
  return tracer ? tracer.span(name, attributes, fn) : fn();
}

type AsyncMethod = (...args: never[]) => Promise<unknown>;

/**
 * A copy of `target` whose named methods each run in a span of the given name. For objects of closures
 * (factories' results, such as the approval module's face): the wrapped ones are called unbound.
 */
export function withSpans<O extends object>(
  target: O,
  tracer: Tracer,
  spans: Partial<Record<keyof O, string>>,
  attributes: SpanAttributes = {},
): O {
  const copy: Record<PropertyKey, unknown> = { ...(target as Record<PropertyKey, unknown>) };
  for (const [key, name] of Object.entries(spans) as [keyof O & string, string][]) {
    const method = target[key] as AsyncMethod;
    copy[key] = (...args: never[]) => tracer.span(name, attributes, () => method(...args));
  }
  return copy as O;
}
