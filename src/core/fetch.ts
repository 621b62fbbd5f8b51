import { setMaxListeners } from 'node:events';
import type { FetchLike } from '@modelcontextprotocol/client';

/**
 * `fetch` for the MCP SDK's Streamable HTTP client (countersign's upstreams over HTTP). The SDK's
 * transport hands its one AbortSignal to every request, and fetch (undici) hangs an abort listener on
 * it per request, removed once that request is collected. Under load more than undici's limit of 1,500
 * are alive between two collections, and Node then prints a "possible EventTarget memory leak" warning
 * to stderr for every further request: 802 lines over 4,000 proxied calls, 8 at a time. The listeners
 * are bounded by the collector, not kept (test/e2e/upstream.test.ts counts them after a collection), so
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

/**
 * How much of an answer is read between two turns of the event loop. An answer the upstream sends
 * faster than it is read arrives as a queue of 64 KiB chunks that the stream machinery would work
 * through in one go (8 MiB up to the cap: tens of milliseconds on a loaded CPU) while every other
 * call waits; every 256 KiB the transform lets the event loop turn first.
 */
const YIELD_BYTES = 256 * 1024;

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

/**
 * Where each blank line (the end of an SSE event: two line ends, `\n` or `\r\n`) in `chunk` ends,
 * carrying over the line ends counted at the end of the chunk before (`state.ends`). Works on bytes:
 * an answer far past the cap is never decoded or copied into one string.
 */
function eventEnds(chunk: Uint8Array, state: { ends: number }): number[] {
  const found: number[] = [];
  // Buffer's indexOf is native (about 1 µs a 64 KiB chunk; Uint8Array's took 41 µs in a profile of
  // 64 MiB answers); the view copies nothing.
  const bytes = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  // Whether chunk[from, to) holds anything but CR: a line with content between two line ends.
  const content = (from: number, to: number) => {
    for (let i = from; i < to; i++) if (chunk[i] !== 0x0d) return true;
    return false;
  };
  for (let i = 0; i < chunk.length;) {
    const lf = bytes.indexOf(0x0a, i);
    if (lf < 0) {
      if (content(i, chunk.length)) state.ends = 0;
      break;
    }
    if (content(i, lf)) state.ends = 0;
    if (++state.ends === 2) {
      found.push(lf + 1);
      state.ends = 0;
    }
    i = lf + 1;
  }
  return found;
}

/**
 * Past this many bytes held, an event (or a JSON body) is held in a scratch buffer of the cap's size
 * instead of as the chunks it came in: each chunk is copied and dropped at once, so it dies young,
 * and the scratch buffer is given back for the next large answer. Held as chunks, up to 8 MiB of
 * them outlived the young generation's collections while an oversized answer was read, and each
 * such answer or two cost the server a full collection (docs/reliability.md). At most two free
 * scratch buffers are kept per cap (16 MiB at the default max_result_bytes).
 */
const SCRATCH_FROM = 256 * 1024;
const scratchPool = new Map<number, Buffer[]>();
const takeScratch = (size: number) => scratchPool.get(size)?.pop() ?? Buffer.allocUnsafeSlow(size);
const giveScratch = (b: Buffer) => {
  const free = scratchPool.get(b.length) ?? [];
  scratchPool.set(b.length, free);
  if (free.length < 2) free.push(b);
};

/** The bytes of an event (or body) not yet complete: never more than `maxBytes` (the caller counts). */
function holder(maxBytes: number) {
  let chunks: Uint8Array[] = [];
  let scratch: Buffer | undefined;
  let len = 0;
  const reset = () => {
    if (scratch) giveScratch(scratch);
    scratch = undefined;
    chunks = [];
    len = 0;
  };
  return {
    /** The bytes held. */
    size: () => len,
    push(c: Uint8Array) {
      if (scratch) {
        scratch.set(c, len);
        len += c.length;
        return;
      }
      chunks.push(c);
      len += c.length;
      if (len < SCRATCH_FROM) return;
      scratch = takeScratch(maxBytes);
      let at = 0;
      for (const x of chunks) {
        scratch.set(x, at);
        at += x.length;
      }
      chunks = [];
    },
    drain(): Uint8Array[] {
      const out = scratch ? [Buffer.from(scratch.subarray(0, len))] : chunks;
      reset();
      return out;
    },
    drop: reset,
  };
}

/**
 * A body that passes an upstream's answer through while counting it, and never holds more than
 * `maxBytes` of it: past the cap, what was read is dropped and the request is answered with a
 * JSON-RPC error (data: RESULT_TOO_LARGE), so that the one call it answered fails and nothing else
 * does (a stream that answers no request, e.g. the one opened for notifications, is ended with an
 * error instead). An event stream is passed on event by event and counted per event; a JSON body is
 * held until it is complete.
 */
export function capped(
  body: ReadableStream<Uint8Array>,
  sse: boolean,
  idOf: () => string | number | undefined,
  maxBytes: number,
) {
  const encoder = new TextEncoder();
  const pending = holder(maxBytes); // a JSON body so far, or an event stream's event so far
  const lineEnds = { ends: 0 };
  let over = false;
  let sinceTurn = 0;
  type Out = TransformStreamDefaultController<Uint8Array>;
  const refuse = (out: Out) => {
    over = true;
    pending.drop();
    // Read only now: parsing every request's body again would cost each call.
    const id = idOf();
    if (id === undefined) {
      out.error(new Error(`an answer was larger than ${maxBytes} bytes`));
      return;
    }
    const error = tooLarge(id, maxBytes);
    out.enqueue(encoder.encode(sse ? `event: message\ndata: ${error}\n\n` : error));
    out.terminate();
  };
  const step = (chunk: Uint8Array, out: Out): void => {
    if (!sse) {
      if (pending.size() + chunk.byteLength > maxBytes) return refuse(out);
      pending.push(chunk);
      return;
    }
    // Each complete event goes on if it is within the cap, and stops counting; the rest of the
    // chunk starts the next one.
    let from = 0;
    for (const end of eventEnds(chunk, lineEnds)) {
      if (pending.size() + (end - from) > maxBytes) return refuse(out);
      for (const held of pending.drain()) out.enqueue(held);
      out.enqueue(chunk.subarray(from, end));
      from = end;
    }
    if (from < chunk.length) {
      if (pending.size() + (chunk.length - from) > maxBytes) return refuse(out);
      pending.push(chunk.subarray(from));
    }
  };
  return body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, out) {
        if (over) return;
        sinceTurn += chunk.byteLength;
        if (sinceTurn < YIELD_BYTES) return step(chunk, out);
        sinceTurn = 0;
        return new Promise<void>((resolve) => setImmediate(resolve)).then(() => {
          if (!over) step(chunk, out);
        });
      },
      flush(out) {
        for (const chunk of pending.drain()) out.enqueue(chunk);
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
    const body = capped(res.body, sse, () => requestId(init), maxBytes);
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}
