import type { IncomingMessage, ServerResponse } from 'node:http';
import {
  classifyInboundRequest,
  isJsonContentType,
  isJSONRPCRequest,
  parseJSONRPCMessage,
  PROTOCOL_VERSION_META_KEY,
  SUPPORTED_PROTOCOL_VERSIONS,
  type JSONRPCMessage,
  type JSONRPCRequest,
  type MessageExtraInfo,
  type ProtocolError,
  type RequestId,
  type Server,
  type Transport,
} from '@modelcontextprotocol/server';
import { createAnswerHold, type RequestContext } from './call-context.ts';

/**
 * A transport that carries one JSON-RPC request at a time to the server connected to it, and settles
 * each with the server's answer to it. Anything else the server sends meanwhile (a notification) has
 * no place in a JSON answer and is dropped, as the SDK's JSON responses drop it. A server stays
 * connected to its exchange across requests (ServerPool), like a server on a long-lived connection;
 * everything a request carries (its caller, its answer hold) comes with the request itself, as the
 * exchange's `context` while it is answered.
 */
class Exchange implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: <T extends JSONRPCMessage>(message: T, extra?: MessageExtraInfo) => void;
  private pending?: { id: RequestId; settle: (answer: JSONRPCMessage) => void };
  private current?: RequestContext;

  async start(): Promise<void> {}

  /** Hands `request` to the server, in `context`; resolves with its answer. One request at a time. */
  exchange(
    request: JSONRPCRequest,
    context: RequestContext,
    extra: MessageExtraInfo,
  ): Promise<JSONRPCMessage> {
    return new Promise((settle) => {
      this.pending = { id: request.id, settle };
      this.current = context;
      this.onmessage?.(request, extra);
    });
  }

  /** The context of the request being answered (the server of this exchange asks it once per request). */
  context(): RequestContext {
    // The pool hands a request in before the server can ask, so this cannot happen.
    if (!this.current) throw new Error('no request is being answered');
    return this.current;
  }

  /**
   * The server's own messages, typed: a response is the one with a result or an error (a request or a
   * notification has a method instead), so the keys tell, without validating the message again.
   */
  async send(message: JSONRPCMessage): Promise<void> {
    const pending = this.pending;
    if (!pending || !('result' in message || 'error' in message) || message.id !== pending.id) return;
    this.pending = undefined;
    pending.settle(message);
  }

  async close(): Promise<void> {
    this.onclose?.();
  }
}

/**
 * Servers connected to their exchanges, each answering one request at a time, kept for the next
 * request once answered instead of built and connected anew for each (about 90 µs of a sequential
 * call's path, measured). At most `idle` wait between requests; a burst beyond that builds more, which
 * the collector takes once answered. Only a server that answered goes back to the pool.
 */
export class ServerPool {
  private readonly free: { server: Server; exchange: Exchange }[] = [];

  constructor(
    /** A server whose requests take their context from `context` (its exchange's request of the moment). */
    private readonly createServer: (context: () => RequestContext) => Server,
    private readonly idle = 32,
  ) {}

  /** Answers `request` on a server of the pool, in `context`, with `extra` (its web request). */
  async answer(
    request: JSONRPCRequest,
    context: RequestContext,
    extra: MessageExtraInfo,
  ): Promise<JSONRPCMessage> {
    let member = this.free.pop();
    if (!member) {
      const exchange = new Exchange();
      member = { server: this.createServer(() => exchange.context()), exchange };
      await member.server.connect(member.exchange);
    }
    const response = await member.exchange.exchange(request, context, extra);
    if (this.free.length < this.idle) this.free.push(member);
    return response;
  }

  /** Closes the servers kept: nothing is in flight on them. */
  async close(): Promise<void> {
    const members = this.free.splice(0);
    await Promise.allSettled(members.map((m) => m.server.close()));
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
 * itself, as the SDK's stateless transport answers it in JSON mode — the same server's handlers (a
 * server of the pool), the answer as one `application/json` body with status 200 — without turning the
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
    /** Who calls: the transport authenticated the request before it came here. */
    agent: RequestContext['agent'];
    servers: ServerPool;
    webRequest?: () => Promise<Request>;
  },
): Promise<boolean> {
  const message = plainRequest(req, body);
  if (!message) return false;
  // A call may hand its audit commit over (AnswerHold): the answer is prepared meanwhile, sent after.
  const hold = createAnswerHold();
  const request = await opts.webRequest?.();
  const response = await opts.servers.answer(
    message,
    { agent: opts.agent, hold },
    request ? { request } : {},
  );
  let answer = JSON.stringify(response);
  answer = await hold.settled().then(
    (instead) =>
      instead && 'result' in response ? JSON.stringify({ ...response, result: instead }) : answer,
    (err: ProtocolError) => JSON.stringify(errorResponse(message.id, err)),
  );
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) });
  res.end(answer);
  return true;
}
