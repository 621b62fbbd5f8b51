import { ProtocolError, SdkError, SdkErrorCode, SdkHttpError } from '@modelcontextprotocol/client';
import { BAD_GATEWAY_CODE } from './balancer.ts';

/**
 * How one request ended, from the client's side:
 * - ok: a successful envelope
 * - refused: an envelope with ok:false and an error code (a structured business failure)
 * - protocol: a JSON-RPC error carrying data.code
 * - http_problem: an HTTP error answered as problem JSON with a code
 * - lost: no answer at all — the connection was refused or reset, the stream ended (the server died),
 *   or the balancer answered 502 `bad_gateway` (the replica that had the request went away)
 * - timeout: nothing came within the client's own timeout (the request may still be in flight)
 * - unstructured: anything else: an error without a code, a 500 page, a malformed result
 */
export type Outcome = 'ok' | 'refused' | 'protocol' | 'http_problem' | 'lost' | 'timeout' | 'unstructured';

export interface Classified {
  outcome: Outcome;
  /** The error code when there is one (envelope error.code, data.code, problem code). */
  code?: string;
  /** A protocol error's data.trace_id: the call's rows carry the same (write.started among them). */
  trace_id?: string;
  detail?: string;
}

const LOST =
  /ECONNREFUSED|ECONNRESET|EPIPE|socket hang up|fetch failed|terminated|other side closed|Connection closed|SSE stream disconnected|aborted/i;

export function classifyResult(result: unknown): Classified {
  const env = (result as { structuredContent?: Record<string, unknown> } | undefined)?.structuredContent;
  if (!env || typeof env.ok !== 'boolean')
    return { outcome: 'unstructured', detail: JSON.stringify(result).slice(0, 300) };
  if (env.ok) return { outcome: 'ok' };
  const code = (env.error as { code?: unknown } | undefined)?.code;
  return typeof code === 'string'
    ? { outcome: 'refused', code }
    : { outcome: 'unstructured', detail: JSON.stringify(env).slice(0, 300) };
}

/** An error's message and those of its causes, for the LOST test. */
function describe(err: unknown): string {
  const parts: string[] = [];
  for (let e = err, depth = 0; e && depth < 5; depth++) {
    const x = e as { code?: unknown; message?: unknown; cause?: unknown };
    parts.push(
      `${typeof x.message === 'string' ? x.message : String(e)} ${typeof x.code === 'string' ? x.code : ''}`,
    );
    e = x.cause;
  }
  return parts.join(' | ');
}

/** What a problem JSON body says went wrong, if the body is one: its `reason` (the precise one), else its `code`. */
function problemCode(text: unknown): string | undefined {
  if (typeof text !== 'string') return undefined;
  try {
    const { code, reason } = JSON.parse(text) as { code?: unknown; reason?: unknown };
    if (typeof reason === 'string') return reason;
    return typeof code === 'string' ? code : undefined;
  } catch {
    return undefined;
  }
}

export function classifyError(err: unknown): Classified {
  // A JSON-RPC error the server answered with.
  if (err instanceof ProtocolError) {
    const data = err.data as { code?: unknown; trace_id?: unknown } | undefined;
    const code = data?.code;
    const trace_id = typeof data?.trace_id === 'string' ? data.trace_id : undefined;
    if (typeof code === 'string') return { outcome: 'protocol', code, ...(trace_id ? { trace_id } : {}) };
    return { outcome: 'unstructured', detail: `${err.code} ${err.message}`.slice(0, 300) };
  }
  // An HTTP error status (a request's, or the version negotiation probe's).
  if (err instanceof SdkHttpError) {
    const data = err.data as { status?: number; text?: unknown } | undefined;
    const code = problemCode(data?.text);
    if (code === BAD_GATEWAY_CODE)
      return { outcome: 'lost', detail: `${data?.status} ${String(data?.text)}` };
    if (code) return { outcome: 'http_problem', code };
    return { outcome: 'unstructured', detail: `${data?.status} ${err.message}`.slice(0, 300) };
  }
  const text = describe(err);
  if (err instanceof SdkError && err.code === SdkErrorCode.RequestTimeout)
    return { outcome: 'timeout', detail: text.slice(0, 200) };
  if (err instanceof SdkError && err.code === SdkErrorCode.ConnectionClosed)
    return { outcome: 'lost', detail: text.slice(0, 200) };
  if (LOST.test(text)) return { outcome: 'lost', detail: text.slice(0, 200) };
  return { outcome: 'unstructured', detail: text.slice(0, 300) };
}

/** Counts of outcomes and codes, with the first few unstructured answers kept for the report. */
export class Tally {
  readonly counts: Record<Outcome, number> = {
    ok: 0,
    refused: 0,
    protocol: 0,
    http_problem: 0,
    lost: 0,
    timeout: 0,
    unstructured: 0,
  };
  readonly codes: Record<string, number> = {};
  readonly unstructuredExamples: string[] = [];

  add(c: Classified): void {
    this.counts[c.outcome]++;
    if (c.code) this.codes[c.code] = (this.codes[c.code] ?? 0) + 1;
    if (c.outcome !== 'unstructured' || this.unstructuredExamples.length >= 8) return;
    // One example of each kind: the same text up to its first digit.
    const detail = c.detail ?? '';
    const kind = detail.replace(/\d.*$/s, '');
    if (!this.unstructuredExamples.some((e) => e.replace(/\d.*$/s, '') === kind))
      this.unstructuredExamples.push(detail);
  }

  get total(): number {
    return Object.values(this.counts).reduce((s, n) => s + n, 0);
  }
}
