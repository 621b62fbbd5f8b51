import type { IncomingMessage, ServerResponse } from 'node:http';
import { ANSWER_HOLD, createAnswerHold } from './answer-hold.ts';
import {
  classifyInboundRequest,
  isJsonContentType,
  isJSONRPCRequest,
  parseJSONRPCMessage,
  PROTOCOL_VERSION_META_KEY,
  SUPPORTED_PROTOCOL_VERSIONS,
  type AuthInfo,
  type JSONRPCMessage,
  type MessageExtraInfo,
  type ProtocolError,
  type RequestId,
  type Server,
  type Transport,
} from '@modelcontextprotocol/server';

/**
 * A transport for one JSON-RPC request: hands it to the connected server and settles with the server's
 * answer to it. Anything else the server sends meanwhile (a notification) has no place in a JSON answer
 * and is dropped, as the SDK's JSON responses drop it.
 */
class OneRequest implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: <T extends JSONRPCMessage>(message: T, extra?: MessageExtraInfo) => void;
  private settle: (answer: JSONRPCMessage) => void = () => {};
  readonly answer = new Promise<JSONRPCMessage>((resolve) => (this.settle = resolve));

  constructor(private readonly id: RequestId) {}

  async start(): Promise<void> {}

  /**
   * The server's own messages, typed: a response is the one with a result or an error (a request or a
   * notification has a method instead), so the keys tell, without validating the message again.
   */
  async send(message: JSONRPCMessage): Promise<void> {
    if (('result' in message || 'error' in message) && message.id === this.id) this.settle(message);
  }

  async close(): Promise<void> {
    this.onclose?.();
  }
}

/** A held commit's failure (always a ProtocolError, see AnswerHold) as the JSON-RPC error it answers. */
const errorResponse = (id: RequestId, err: ProtocolError) => ({
  jsonrpc: '2.0',
  id,
  error: { code: err.code, message: err.message, ...(err.data !== undefined ? { data: err.data } : {}) },
});

const header = (req: IncomingMessage, name: string): string | undefined => {
  const value = req.headers[name];
  return Array.isArray(value) ? value.join(', ') : value;
};

/** The protocol versions a request may name in its header and still be 2025-era, as the SDK routes them. */
const LEGACY_VERSIONS = new Set(
  SUPPORTED_PROTOCOL_VERSIONS.filter((version) => {
    const ping = { jsonrpc: '2.0', id: 1, method: 'ping' };
    const route = classifyInboundRequest({ httpMethod: 'POST', protocolVersionHeader: version, body: ping });
    return route.kind === 'legacy';
  }),
);

/**
 * Whether the SDK classifies this POST of one JSON object as a 2025-era request without the 2026
 * envelope that is not `initialize` (`legacy`, `no-claim`). The common case is told without asking it:
 * an object with neither `result` nor `error` (so not a response), a JSON-RPC request by the SDK's own
 * schema, not `initialize`, whose params carry no envelope claim and whose header, if any, names a
 * 2025-era version — what classifyInboundRequest answers `no-claim` for, after trying the body as a
 * result and as an error response (two failed schema parses, about 30 µs a call). Anything else is
 * asked of the SDK. Exported for the test that holds the two to the same answers.
 */
export function legacyWithoutClaim(
  body: Record<string, unknown>,
  route: { version?: string; method?: string; name?: string },
): boolean {
  const params = body.params as { _meta?: unknown } | undefined;
  const meta = typeof params === 'object' && params !== null ? params._meta : undefined;
  const plain =
    !('result' in body) &&
    !('error' in body) &&
    body.method !== 'initialize' &&
    !(typeof meta === 'object' && meta !== null && PROTOCOL_VERSION_META_KEY in meta) &&
    (route.version === undefined || LEGACY_VERSIONS.has(route.version));
  if (plain) return isJSONRPCRequest(body);
  const classified = classifyInboundRequest({
    httpMethod: 'POST',
    protocolVersionHeader: route.version,
    mcpMethodHeader: route.method,
    mcpNameHeader: route.name,
    body,
  });
  return classified.kind === 'legacy' && classified.reason === 'no-claim';
}

/**
 * The single 2025-era JSON-RPC request of `body` that this exchange answers, or undefined when the SDK's
 * own stateless transport is to answer the request: it is not a POST of one request, not 2025-era, an
 * `initialize`, or anything the transport would refuse (Accept without both media types, a Content-Type
 * that is not JSON, an unknown MCP-Protocol-Version, a message that is not JSON-RPC). What passes is
 * exactly what that transport hands its server unchanged, in JSON-response mode.
 */
function plainRequest(req: IncomingMessage, body: unknown) {
  if (req.method !== 'POST' || body === null || typeof body !== 'object' || Array.isArray(body)) return;
  const accept = header(req, 'accept');
  if (!accept?.includes('application/json') || !accept.includes('text/event-stream')) return;
  if (!isJsonContentType(header(req, 'content-type') ?? null)) return;
  const version = header(req, 'mcp-protocol-version');
  if (version !== undefined && !SUPPORTED_PROTOCOL_VERSIONS.includes(version)) return;
  const route = { version, method: header(req, 'mcp-method'), name: header(req, 'mcp-name') };
  if (!legacyWithoutClaim(body as Record<string, unknown>, route)) return;
  try {
    const message = parseJSONRPCMessage(body);
    return 'method' in message && 'id' in message ? message : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Answers a 2025-era POST of one JSON-RPC request (tools/call, tools/list, ping) on the node request
 * itself, as the SDK's stateless transport answers it in JSON mode — a fresh server from
 * `createServer`, the answer as one `application/json` body with status 200 — without turning the
 * request into a web Request and the answer into a web Response first. Returns false, having done
 * nothing, for every other request (see plainRequest): those go to the SDK's transport as before.
 *
 * `webRequest` builds the web Request the server's handlers see as `ctx.http.req`, when something reads
 * it (tracing reads its headers); without it, the handlers get none.
 */
export async function answerPlainRequest(
  req: IncomingMessage,
  res: ServerResponse,
  body: unknown,
  opts: {
    authInfo: AuthInfo;
    createServer: (authInfo: AuthInfo | undefined) => Server;
    webRequest?: () => Promise<Request>;
  },
): Promise<boolean> {
  const message = plainRequest(req, body);
  if (!message) return false;
  // A call may hand its audit commit over (AnswerHold): the answer is prepared meanwhile, sent after.
  const hold = createAnswerHold();
  const authInfo: AuthInfo = { ...opts.authInfo, extra: { ...opts.authInfo.extra, [ANSWER_HOLD]: hold } };
  const server = opts.createServer(authInfo);
  const transport = new OneRequest(message.id);
  let answer: string;
  try {
    await server.connect(transport);
    const request = await opts.webRequest?.();
    transport.onmessage?.(message, { authInfo, ...(request ? { request } : {}) });
    const response = await transport.answer;
    answer = JSON.stringify(response);
    answer = await hold.settled().then(
      (instead) =>
        instead && 'result' in response ? JSON.stringify({ ...response, result: instead }) : answer,
      (err: ProtocolError) => JSON.stringify(errorResponse(message.id, err)),
    );
  } catch (err) {
    void server.close().catch(() => {});
    throw err;
  }
  // Answered: the server has nothing in flight and nothing outside this exchange refers to it, so it
  // is left to the collector. Closing it would only build a "connection closed" error (a stack trace,
  // ~20 µs) for pending requests it cannot have.
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) });
  res.end(answer);
  return true;
}
