import {
  isLegacyRequest,
  WebStandardStreamableHTTPServerTransport,
  type AuthInfo,
  type McpRequestContext,
  type Server,
} from '@modelcontextprotocol/server';

/** What the node adapter hands a fetch-style handler beside the request. */
interface ExchangeOptions {
  authInfo?: AuthInfo;
  parsedBody?: unknown;
}

type Fetch = (request: Request, options?: ExchangeOptions) => Promise<Response>;

/** A JSON-RPC error as the SDK's own legacy leg answers it. */
function rpcError(status: number, code: number, message: string, id: string | number | null = null) {
  return Response.json(
    { jsonrpc: '2.0', error: { code, message }, id },
    { status, ...(status === 405 ? { headers: { Allow: 'POST' } } : {}) },
  );
}

/** The id of a posted request, for an error answer that names it. */
function requestIdOf(body: unknown): string | number | null {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return null;
  const { method, id } = body as { method?: unknown; id?: unknown };
  return typeof method === 'string' && (typeof id === 'string' || typeof id === 'number') ? id : null;
}

/**
 * Routes 2025-era (legacy) requests to a stateless exchange that answers in one `application/json`
 * body, and every other request to `modern` (an SDK handler created with `legacy: 'reject'`): the
 * split the SDK documents for serving legacy traffic in user land (isLegacyRequest).
 *
 * The SDK's own legacy leg answers every POST as an SSE stream, written in pieces through a stream
 * that watches for its end. countersign never sends a message before a call's result (no progress, no
 * logging), so the stream carries exactly one event: as JSON the answer is one body, one write, and
 * the exchange ends with it. Streamable HTTP lets a server answer a POST either way, and a client must
 * accept both (its Accept header names both). Each exchange gets a fresh server instance from
 * `createServer`, as on the modern path, given the request's context (its caller) as the SDK's
 * handler gives it: nothing is kept between requests.
 */
export function withJsonLegacyExchanges(
  modern: { fetch: Fetch },
  createServer: (ctx: McpRequestContext) => Server,
  opts: { maxRequestBodySize: number; onerror: (err: Error) => void },
): { fetch: Fetch } {
  const legacy: Fetch = async (request, options) => {
    if (request.method.toUpperCase() !== 'POST') return rpcError(405, -32000, 'Method not allowed.');
    let server: Server | undefined;
    let transport: WebStandardStreamableHTTPServerTransport | undefined;
    try {
      server = createServer({
        era: 'legacy',
        ...(options?.authInfo !== undefined ? { authInfo: options.authInfo } : {}),
      });
      transport = new WebStandardStreamableHTTPServerTransport({
        sessionIdGenerator: undefined,
        enableJsonResponse: true,
        maxRequestBodySize: opts.maxRequestBodySize,
      });
      await server.connect(transport);
      return await transport.handleRequest(request, {
        ...(options?.authInfo !== undefined ? { authInfo: options.authInfo } : {}),
        ...(options?.parsedBody !== undefined ? { parsedBody: options.parsedBody } : {}),
      });
    } catch (err) {
      opts.onerror(err instanceof Error ? err : new Error(String(err)));
      return rpcError(500, -32603, 'Internal server error', requestIdOf(options?.parsedBody));
    } finally {
      // The answer is complete: a JSON response is never streamed.
      transport?.close().catch(() => {});
      server?.close().catch(() => {});
    }
  };
  return {
    fetch: async (request, options) =>
      (await isLegacyRequest(request, options?.parsedBody))
        ? legacy(request, options)
        : modern.fetch(request, options),
  };
}
