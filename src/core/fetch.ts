import { setMaxListeners } from 'node:events';
import type { FetchLike } from '@modelcontextprotocol/client';

/**
 * `fetch` for the MCP SDK's Streamable HTTP client (countersign's upstreams over HTTP). The SDK's
 * transport hands its one AbortSignal to every request, and fetch (undici) hangs an abort listener on
 * it per request, removed once that request is collected. Under load more than undici's limit of 1,500
 * are alive between two collections, and Node then prints a "possible EventTarget memory leak" warning
 * to stderr for every further request: 802 lines over 4,000 proxied calls, 8 at a time. The listeners
 * are bounded by the collector, not kept (test/upstream.test.ts counts them after a collection), so
 * that one signal is exempt from the count (0: no limit).
 */
export const fetchUnwarned: FetchLike = (url, init) => {
  // Set on every request (two property writes): Node 20's getMaxListeners throws on a limit of 0.
  if (init?.signal) setMaxListeners(0, init.signal);
  return fetch(url, init);
};

/** The `data` of the JSON-RPC error a capped fetch answers in place of a result past its cap. */
export const RESULT_TOO_LARGE = 'countersign.result_too_large';

/** A JSON-RPC error for request `id`, standing in for an answer that was larger than `maxBytes`. */
const tooLarge = (id: unknown, maxBytes: number) =>
  JSON.stringify({
    jsonrpc: '2.0',
    id,
    error: {
      code: -32603,
      message: `the answer was larger than ${maxBytes} bytes`,
      data: { [RESULT_TOO_LARGE]: maxBytes },
    },
  });

/** The JSON-RPC id of the one request a POST carries, if it carries one. */
function requestId(init: RequestInit | undefined): string | number | undefined {
  if (typeof init?.body !== 'string') return undefined;
  try {
    const id = (JSON.parse(init.body) as { id?: unknown }).id;
    return typeof id === 'string' || typeof id === 'number' ? id : undefined;
  } catch {
    return undefined;
  }
}

/** Where an SSE stream's next event starts in `text`: after the blank line that ends one, or -1. */
function eventEnd(text: string): number {
  const m = /\r?\n\r?\n/.exec(text);
  return m ? m.index + m[0].length : -1;
}

/**
 * A body that passes an upstream's answer through while counting it, and never holds more than
 * `maxBytes`: past the cap, what was read is dropped and the request is answered with a JSON-RPC
 * error (data: RESULT_TOO_LARGE), so that the one call it answered fails and nothing else does. An
 * event stream is passed on event by event, so that the error never lands in a half-sent event.
 */
function capped(body: ReadableStream<Uint8Array>, sse: boolean, id: unknown, maxBytes: number) {
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  let held = '';
  let bytes = 0;
  let over = false;
  return body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, out) {
        if (over) return;
        bytes += chunk.byteLength;
        if (bytes > maxBytes) {
          over = true;
          held = '';
          const error = tooLarge(id, maxBytes);
          out.enqueue(encoder.encode(sse ? `event: message\ndata: ${error}\n\n` : error));
          out.terminate();
          return;
        }
        held += decoder.decode(chunk, { stream: true });
        if (!sse) return;
        for (let end = eventEnd(held); end >= 0; end = eventEnd(held)) {
          out.enqueue(encoder.encode(held.slice(0, end)));
          bytes -= Buffer.byteLength(held.slice(0, end));
          held = held.slice(end);
        }
      },
      flush(out) {
        held += decoder.decode();
        if (held) out.enqueue(encoder.encode(held));
      },
    }),
  );
}

/**
 * fetchUnwarned with each answer capped at `maxBytes` while it is read (an upstream's 200 MB result
 * cannot fill the heap). An event stream counts per event (a long-lived stream of small notifications
 * is fine); a JSON answer counts whole.
 */
export function cappedFetch(maxBytes: number): FetchLike {
  return async (url, init) => {
    const res = await fetchUnwarned(url, init);
    if (!res.body) return res;
    const type = res.headers.get('content-type') ?? '';
    const sse = type.includes('text/event-stream');
    if (!sse && !type.includes('application/json')) return res;
    const body = capped(res.body, sse, requestId(init), maxBytes);
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}
