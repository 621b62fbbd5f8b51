import type { IncomingMessage, ServerResponse } from 'node:http';
import express, { type Request, type Response } from 'express';
import { toNodeHandler, toWebRequest } from '@modelcontextprotocol/node';
import {
  createMcpHandler,
  getOAuthProtectedResourceMetadataUrl,
  ProtocolError,
  ProtocolErrorCode,
  type McpRequestContext,
  type AuthInfo,
} from '@modelcontextprotocol/server';
import type { ClusterBus } from '../cluster/bus.ts';
import type { AuditLog, Refusals } from '../audit/index.ts';
import type { Config } from '../config.ts';
import { outageOf } from '../db/outage.ts';
import { nothingDoneProblem, problemOf } from './answer.ts';
import type { Logger } from '../log.ts';
import type { Agent } from '../core/identity.ts';
import {
  looksLikeJwt,
  OAUTH_FAILURE_DETAIL,
  OAuthFailure,
  type Authenticate,
  type OAuthAgents,
} from '../accounts/index.ts';
import { answerPlainRequest, ServerPool } from './json-exchange.ts';
import { readJsonBody } from './json-body.ts';
import { sendProblem } from '../core/problem.ts';
import { withJsonLegacyExchanges } from './legacy-json.ts';
import { createMcpServer, SERVER_NAME } from './mcp.ts';
import { deniedRow } from './denied.ts';
import { TASK_POLL_INTERVAL_MS } from '../approval/index.ts';
import { createTaskListen, watchesTasks } from './listen.ts';
import { createInFlight, type InFlight } from './in-flight.ts';
import { createTaskWaits } from './task-waits.ts';
import { hostCheck } from './host-guard.ts';
import { createStreamRegistry } from './streams.ts';
import { MAX_ARGUMENT_DEPTH, nestedDeeperThan, TOO_DEEP_ARGUMENTS, type CallPipeline } from './call.ts';
import type { RequestContext } from './call-context.ts';

function bearer(header: string | undefined): string | undefined {
  const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
  return match?.[1];
}

export interface McpHttpDeps {
  /** Resolves each request's bearer token to its agent. */
  authenticate: Authenticate;
  /** When `oauth` is configured: JWT access tokens, checked against the issuer (docs/identity.md). */
  oauth?: OAuthAgents;
  pipeline: CallPipeline;
  audit: AuditLog;
  /** Where refused requests are recorded: a few rows per source address and reason a minute, then counted. */
  refusals: Refusals;
  /**
   * Where change events go to reach `subscriptions/listen` streams on every replica, and whence word
   * of a changed agent comes (its open streams close once its token no longer holds).
   */
  bus: ClusterBus;
  config: Config;
  log: Logger;
  version: string;
}

/**
 * The agents the auth step authenticated, by the AuthInfo it handed the SDK with each request: the
 * SDK passes that object through to the server factory untouched (McpRequestContext.authInfo), and
 * this map is how the factory knows the caller, typed, without a bag of extras riding on it.
 */
const callers = new WeakMap<AuthInfo, Agent>();

/** The agent the auth step authenticated a request as, from what the SDK handed the server factory. */
function agentOf(authInfo: AuthInfo | undefined): Agent {
  const agent = authInfo && callers.get(authInfo);
  // The route below authenticates before it hands a request on, so this cannot happen.
  if (!agent) throw new ProtocolError(ProtocolErrorCode.InvalidRequest, 'unauthenticated request');
  return agent;
}

/** The paths the MCP endpoint answers (a query string aside). */
export const isMcpPath = (url: string | undefined) => {
  const path = url?.split('?', 1)[0];
  return path === '/mcp' || path === '/mcp/';
};

/**
 * Streamable HTTP at /mcp, stateless: every request is authenticated by its own bearer token and answered
 * by a server instance that knows nothing of earlier requests, whatever protocol revision it speaks
 * (2026-07-28 natively; 2025-era clients statelessly, each answer one JSON body: legacy-json.ts). A
 * plain 2025-era request goes to a server kept for the next one (ServerPool), which takes its caller
 * from the request; nothing a request leaves behind matters to another, so any replica of a cluster
 * answers any request.
 *
 * Served on node's own request and response, ahead of express (serve-http.ts): the endpoint needs the
 * host check, the JSON body and the token, and express's router and body parser cost a call more
 * than those do (about 0.2 ms of CPU in a profile of sequential reads).
 */
export function createMcpEndpoint(deps: McpHttpDeps) {
  const onerror = (err: Error) => deps.log.debug({ err: err.message }, 'MCP request refused');
  // Every request's caller comes with the request, whichever server answers it: a fresh one of the
  // SDK's handler for each request (from its authInfo), or one kept from one plain 2025-era request to
  // the next (from its exchange).
  const taskWaits = createTaskWaits(deps.bus, TASK_POLL_INTERVAL_MS);
  const serverIn = (context: () => RequestContext) =>
    createMcpServer({ context, pipeline: deps.pipeline, version: deps.version, taskWaits });
  const serverFor = (ctx: McpRequestContext) => {
    const agent = agentOf(ctx.authInfo);
    return serverIn(() => ({ agent }));
  };
  const servers = new ServerPool(serverIn);
  const maxRequestBodySize = deps.config.http.max_body_bytes;
  const handler = createMcpHandler(serverFor, {
    bus: deps.bus,
    maxRequestBodySize,
    onerror,
    legacy: 'reject',
  });
  const serve = toNodeHandler(withJsonLegacyExchanges(handler, serverFor, { maxRequestBodySize, onerror }), {
    maxRequestBodySize,
    onerror,
  });
  // An upstream's tool list changed: every open listen stream, on every replica, hears of it.
  const unsubscribe = deps.pipeline.onListChanged(() => handler.notify.toolsChanged());
  const checkHost = hostCheck(deps.config);
  const streams = createStreamRegistry(deps.config.http.max_streams_per_agent, deps.bus, deps.log);
  const { max_calls_in_flight_per_agent: max, max_calls_waiting_per_agent: maxWaiting } = deps.config.http;
  const inFlight = createInFlight(max, maxWaiting);
  const taskListen = createTaskListen({
    tasks: deps.pipeline.tasks,
    bus: deps.bus,
    log: deps.log,
    poll_ms: TASK_POLL_INTERVAL_MS,
    serverInfo: { name: SERVER_NAME, version: deps.version },
  });

  async function answer(req: IncomingMessage & { auth?: AuthInfo }, res: ServerResponse) {
    const refused = checkHost(req.headers.host, req.headers.origin);
    if (refused) return sendProblem(res, refused);
    const token = bearer(req.headers.authorization);
    const auth = await authenticateHeader(deps, req.headers.authorization, token);
    if ('failure' in auth) return refuseRead(deps, req, res, { ...auth, token });
    const read = await inTurn(deps, inFlight, auth.agent, req, res);
    if (!read) return;
    // Handed to the server factory as authInfo; the token itself goes no further.
    const authInfo: AuthInfo = { token: '', clientId: auth.agent.id, scopes: [] };
    callers.set(authInfo, auth.agent);
    const body = withShallowArguments(read.body);
    if (opensStream(body)) {
      const release = streams.open({
        agentId: auth.agent.id,
        stillValid: async () => {
          const again = await authenticateBearer(deps, token);
          return !('failure' in again) && again.agent.id === auth.agent.id;
        },
        close: () => res.destroy(),
      });
      if (!release) return tooManyStreams(deps, res, auth.agent);
      res.once('close', release);
      // A listen that names tasks (Tasks extension) is served whole here; any other by the SDK.
      if (watchesTasks(body)) return taskListen.serve(auth.agent, body, req.headers, res);
    }
    // One 2025-era request (most traffic): answered here; anything else by the SDK's handlers.
    const answered = await answerPlainRequest(req, res, body, {
      agent: auth.agent,
      servers,
      // Only tracing reads the request the handlers see (its headers): built for it alone.
      ...(deps.pipeline.tracer ? { webRequest: () => toWebRequest(req, body) } : {}),
    });
    if (answered) return;
    req.auth = authInfo;
    await serve(req, res, body);
  }

  return {
    /** Answers one request to an MCP path (isMcpPath); never rejects. */
    handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
      return answer(req, res).catch((err: unknown) => failed(deps, res, err));
    },
    async close() {
      unsubscribe();
      taskWaits.close();
      taskListen.close();
      streams.close();
      await handler.close();
      await servers.close();
    },
  };
}

/** Whether a request asks for a `subscriptions/listen` stream (2026-07-28), alone or in a batch. */
function opensStream(body: unknown): boolean {
  const messages: unknown[] = Array.isArray(body) ? body : [body];
  return messages.some(
    (m) =>
      m !== null && typeof m === 'object' && (m as { method?: unknown }).method === 'subscriptions/listen',
  );
}

/** A request without a valid token, once its body is read: a malformed body is answered as such. */
async function refuseRead(deps: McpHttpDeps, req: IncomingMessage, res: ServerResponse, refusal: Refusal) {
  const read = await readJsonBody(req, deps.config.http.max_body_bytes);
  if ('problem' in read) return sendProblem(res, read.problem);
  return refuse(deps, req, res, refusal);
}

/**
 * Whether a request only holds a listen stream: it holds no turn while it is open (the streams have
 * their own bound, http.max_streams_per_agent). tasks/result is not one: its wait holds a turn, as a
 * call does, so that one agent's waits cannot outnumber its turns.
 */
function onlyWaits(body: unknown): boolean {
  const messages: unknown[] = Array.isArray(body) ? body : [body];
  return messages.every((m) => {
    const method = m !== null && typeof m === 'object' ? (m as { method?: unknown }).method : undefined;
    return method === 'subscriptions/listen';
  });
}

/**
 * The agent's turn on this replica (http.max_calls_in_flight_per_agent), taken before its body is
 * read and held until its answer is sent; then the body. Undefined once the request was answered
 * here: refused (429, or the body's problem), or its client gone while it waited.
 */
async function inTurn(
  deps: McpHttpDeps,
  inFlight: InFlight,
  agent: Agent,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<{ body: unknown } | undefined> {
  const leave = await inFlight.enter(agent.id, () => closed(res));
  if (!leave) {
    if (!res.destroyed && !res.writableEnded) tooManyInFlight(deps, res, agent);
    return undefined;
  }
  res.once('close', leave);
  const read = await readJsonBody(req, deps.config.http.max_body_bytes);
  if ('problem' in read) {
    sendProblem(res, read.problem);
    return undefined;
  }
  // A stream stays open while its client listens (http.max_streams_per_agent counts those): it does
  // not keep the agent's other calls waiting. (tasks/result keeps its turn while it waits.)
  if (onlyWaits(read.body)) leave();
  return read;
}

/** Resolves when the response is over: sent, or its client gone. */
const closed = (res: ServerResponse) =>
  new Promise<void>((resolve) => (res.destroyed ? resolve() : res.once('close', () => resolve())));

/**
 * An agent with http.max_calls_waiting_per_agent requests already waiting for their turn on this
 * replica (besides those in flight): 429, at once.
 */
function tooManyInFlight(deps: McpHttpDeps, res: ServerResponse, agent: Agent): void {
  const { max_calls_in_flight_per_agent: active, max_calls_waiting_per_agent: waiting } = deps.config.http;
  deps.log.warn(
    { agent_id: agent.id, agent_name: agent.name, active, waiting },
    'request refused: too many in flight',
  );
  sendProblem(
    res,
    {
      code: 'RATE_LIMITED',
      reason: 'too_many_in_flight',
      title: 'Too many requests at once',
      detail: `agent "${agent.name}" already has ${active} requests in flight here and ${waiting} waiting; wait for their answers`,
    },
    { 'Retry-After': '1' },
  );
}

/**
 * An agent that already holds http.max_streams_per_agent listen streams on this replica: 429, until
 * one of them closes.
 */
function tooManyStreams(deps: McpHttpDeps, res: ServerResponse, agent: Agent): void {
  const max = deps.config.http.max_streams_per_agent;
  deps.log.warn({ agent_id: agent.id, agent_name: agent.name, max }, 'listen stream refused: too many open');
  sendProblem(res, {
    code: 'RATE_LIMITED',
    reason: 'too_many_streams',
    title: 'Too many open streams',
    detail: `agent "${agent.name}" already holds ${max} open subscriptions/listen streams here; close one first`,
  });
}

/** The caller of a request; a header that is there but not "Bearer <token>" is told apart from none. */
async function authenticateHeader(deps: McpHttpDeps, header: string | undefined, token: string | undefined) {
  if (header !== undefined && token === undefined)
    return { failure: 'malformed_authorization', via: 'token' as const };
  return authenticateBearer(deps, token);
}

/** With OAuth configured, a JWT-shaped token goes to the issuer's check; a static one (cs_…) never has that shape. */
async function authenticateBearer(deps: McpHttpDeps, token: string | undefined) {
  if (deps.oauth && token && looksLikeJwt(token)) {
    return { ...(await deps.oauth.authenticate(token)), via: 'oauth' as const };
  }
  return { ...(await deps.authenticate(token)), via: 'token' as const };
}

interface Refusal {
  failure: string;
  agent?: Agent;
  /** The client an OAuth token named, once its signature verified (never the token). */
  subject?: string;
  token: string | undefined;
  via: 'token' | 'oauth';
}

/**
 * A request without a valid agent token: audited (auth.denied, or counted into an auth.denied_summary
 * past the source's share of the minute), then 401 with the reason.
 */
async function refuse(deps: McpHttpDeps, req: IncomingMessage, res: ServerResponse, refusal: Refusal) {
  const { failure: reason, subject, via } = refusal;
  const ip = req.socket.remoteAddress ?? 'unknown';
  const oauth = via === 'oauth' ? { via, ...(subject === undefined ? {} : { subject }) } : {};
  await deps.refusals.record(ip, deniedRow(refusal, { transport: 'http', ip }, oauth));
  if (reason === 'issuer_unavailable') {
    // The authorization server could not be asked: a retryable outage, not a verdict on the token.
    return sendProblem(
      res,
      {
        code: 'SOURCE_UNAVAILABLE',
        reason,
        title: 'Service unavailable',
        detail: OAUTH_FAILURE_DETAIL[reason],
      },
      { 'Retry-After': '5' },
    );
  }
  const oauthReason = OAuthFailure.safeParse(reason);
  sendProblem(
    res,
    {
      code: 'NOT_LOGGED_IN',
      reason,
      title: 'Unauthorized',
      detail: oauthReason.success
        ? OAUTH_FAILURE_DETAIL[oauthReason.data]
        : (TOKEN_FAILURE_DETAIL[reason] ?? TOKEN_FAILURE_DETAIL.missing_token),
    },
    { 'WWW-Authenticate': bearerChallenge(deps.oauth, refusal.token !== undefined) },
  );
}

/** What a refused static-token request is told, with how to get a token that works. */
const TOKEN_FAILURE_DETAIL: Record<string, string> = {
  missing_token:
    'a valid agent token is required (Authorization: Bearer <token>); an operator creates one with: countersign agent add NAME',
  malformed_authorization:
    'the Authorization header is not "Bearer <token>" (one token after the word Bearer, nothing else); send Authorization: Bearer <agent token>',
  unknown_token:
    'this agent token is not known here (mistyped, cut short, rotated, or from another data directory or database); ' +
    'an operator creates one with: countersign agent add NAME, or issues a new one with: countersign agent rotate NAME',
  revoked_token:
    "this agent's token has been revoked; an operator creates a new agent with: countersign agent add NAME",
  agent_record_tampered:
    "this agent's record was changed in the database outside this server (TAMPERED); an operator must check it and run: countersign agent reseal NAME",
};

/**
 * The 401 challenge. With OAuth configured it names the protected-resource metadata (RFC 9728 §5.1), from
 * which an MCP client finds the authorization server; `error="invalid_token"` only when a token was sent
 * (RFC 6750 §3.1). Without OAuth it stays what static-token clients have always seen.
 */
function bearerChallenge(oauth: OAuthAgents | undefined, tokenGiven: boolean): string {
  if (!oauth) return 'Bearer realm="countersign"';
  const metadata = getOAuthProtectedResourceMetadataUrl(new URL(oauth.verifier.resource()));
  return `Bearer resource_metadata="${metadata}"${tokenGiven ? ', error="invalid_token"' : ''}`;
}

/**
 * GET /.well-known/oauth-protected-resource (and its /mcp-suffixed form, which MCP clients try first):
 * the RFC 9728 document naming this server's resource URL and its authorization server. It is public
 * and meant for clients on any origin, so neither the Host/Origin guard nor a token applies.
 */
export function protectedResourceRouter(oauth: OAuthAgents) {
  const router = express.Router();
  const document = (_req: Request, res: Response) => {
    const { config } = oauth.verifier;
    res.set({ 'Access-Control-Allow-Origin': '*', 'Cache-Control': 'public, max-age=300' }).json({
      resource: oauth.verifier.resource(),
      authorization_servers: [config.issuer],
      bearer_methods_supported: ['header'],
      ...(config.scopes_supported ? { scopes_supported: config.scopes_supported } : {}),
      resource_name: 'countersign',
    });
  };
  router.get(
    ['/.well-known/oauth-protected-resource', '/.well-known/oauth-protected-resource/mcp'],
    document,
  );
  return router;
}

/** A failure before the MCP handler answered: the database gone (retryable, said so), else a crash. */
function failed(deps: McpHttpDeps, res: ServerResponse, err: unknown): void {
  if (outageOf(err)) {
    // Authentication (and its audit) needs the database: a clear, retryable answer, never an HTML page.
    // No call had begun: nothing was done (server/answer.ts decides what each stage is told).
    return sendProblem(res, { ...nothingDoneProblem }, { 'Retry-After': '1' });
  }
  deps.log.error({ err }, 'MCP endpoint failed');
  if (res.headersSent) res.destroy();
  else sendProblem(res, problemOf('crash', 'Internal error'));
}

/**
 * A tools/call whose arguments nest deeper than the limit is handed on with them replaced by the
 * too-deep marker: the SDK validates messages recursively and overflows its stack near 4,000 levels,
 * so without this the call would die as -32603 instead of reaching the seam, which answers
 * INVALID_ARGUMENT (too_deep) and audits it.
 */
function withShallowArguments(body: unknown): unknown {
  const messages: unknown[] = Array.isArray(body) ? body : [body];
  for (const message of messages) {
    if (message === null || typeof message !== 'object') continue;
    const params = (message as { method?: unknown; params?: { arguments?: unknown } } | null)?.params;
    if (
      (message as { method?: unknown }).method === 'tools/call' &&
      params &&
      nestedDeeperThan(params.arguments, MAX_ARGUMENT_DEPTH)
    ) {
      params.arguments = TOO_DEEP_ARGUMENTS;
    }
  }
  return body;
}
