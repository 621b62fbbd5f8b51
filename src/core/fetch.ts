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
