import { McpError } from '@modelcontextprotocol/sdk/types.js';

/**
 * How one request ended, from the client's side:
 * - ok: a successful envelope
 * - refused: an envelope with ok:false and an error code (a structured business failure)
 * - protocol: a JSON-RPC error carrying data.code
 * - http_problem: an HTTP error answered as problem JSON with a code
 * - lost: no answer at all — the connection was refused or reset, the stream ended (the server died)
 * - unstructured: anything else: an error without a code, a 500 page, a malformed result
 */
export type Outcome = 'ok' | 'refused' | 'protocol' | 'http_problem' | 'lost' | 'unstructured';

export interface Classified {
  outcome: Outcome;
  /** The error code when there is one (envelope error.code, data.code, problem code). */
  code?: string;
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

export function classifyError(err: unknown): Classified {
  if (err instanceof McpError) {
    const code = (err.data as { code?: unknown } | undefined)?.code;
    if (typeof code === 'string') return { outcome: 'protocol', code };
    // The client's own verdicts: the connection closed or no answer came in time.
    if (err.code === -32000 || err.code === -32001) return { outcome: 'lost', detail: err.message };
    return { outcome: 'unstructured', detail: `${err.code} ${err.message}`.slice(0, 300) };
  }
  const e = err as { code?: unknown; message?: string; cause?: { code?: string; message?: string } };
  const text = `${e.message ?? String(err)} ${e.cause?.code ?? ''} ${e.cause?.message ?? ''}`;
  if (typeof e.code === 'number' && e.code >= 400) {
    const m = /"code":"([^"]+)"/.exec(text);
    return m
      ? { outcome: 'http_problem', code: m[1] }
      : { outcome: 'unstructured', detail: text.slice(0, 300) };
  }
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
