import express, { type NextFunction, type Request, type Response } from 'express';
import { toNodeHandler } from '@modelcontextprotocol/node';
import {
  createMcpHandler,
  ProtocolError,
  ProtocolErrorCode,
  type AuthInfo,
  type ServerEventBus,
} from '@modelcontextprotocol/server';
import { isAuditUnavailable, type AuditLog } from '../audit/log.ts';
import type { Config } from '../config.ts';
import { HTTP_STATUS, type AppErrorCode } from '../core/errors.ts';
import { isConnectionError } from '../db/knex.ts';
import type { Logger } from '../log.ts';
import type { Agent } from '../core/identity.ts';
import type { Authenticate } from './agent-cache.ts';
import { createMcpServer } from './mcp.ts';
import type { CallPipeline } from './pipeline.ts';
import { MAX_ARGUMENT_DEPTH, nestedDeeperThan, TOO_DEEP_ARGUMENTS } from './steps.ts';

/** An HTTP refusal: a code from core/errors.ts, the machine reason, and words for people. */
export interface Problem {
  code: AppErrorCode;
  /** Stable and specific (missing_token, body_too_large …); the last part of the problem's type (else the code). */
  reason?: string;
  title: string;
  detail?: string;
  /** When the code's usual status (HTTP_STATUS) is not the precise one, e.g. 413 for a body too large. */
  status?: number;
}

/** RFC 9457 problem details: the one way an HTTP refusal is answered, with the same codes as everywhere. */
export function sendProblem(res: Response, problem: Problem, headers: Record<string, string> = {}): void {
  if (res.headersSent) return;
  const status = problem.status ?? HTTP_STATUS[problem.code];
  res
    .status(status)
    .set({ 'Content-Type': 'application/problem+json', ...headers })
    .send(
      JSON.stringify({
        type: `urn:countersign:problem:${problem.reason ?? problem.code}`,
        title: problem.title,
        status,
        detail: problem.detail,
        code: problem.code,
        reason: problem.reason,
      }),
    );
}

function bearer(req: Request): string | undefined {
  const header = req.get('authorization');
  const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
  return match?.[1];
}

/** Host and Origin must name this server, so a web page cannot reach a loopback countersign by DNS rebinding. */
export function hostGuard(config: Config) {
  const allowed = new Set(config.http.allowed_hosts.map((h) => h.toLowerCase()));
  const hostOk = (host: string) => {
    const name = host.toLowerCase().replace(/:\d+$/, '');
    return allowed.has(name);
  };
  return (req: Request, res: Response, next: NextFunction) => {
    const host = req.get('host');
    if (!host || !hostOk(host)) {
      return sendProblem(res, {
        code: 'PERMISSION_DENIED',
        reason: 'host_not_allowed',
        title: 'Host not allowed',
        detail: `Host "${host ?? ''}" is not served here`,
      });
    }
    const origin = req.get('origin');
    if (origin) {
      let originHost: string;
      try {
        originHost = new URL(origin).host;
      } catch {
        originHost = '';
      }
      if (!hostOk(originHost)) {
        return sendProblem(res, {
          code: 'PERMISSION_DENIED',
          reason: 'origin_not_allowed',
          title: 'Origin not allowed',
          detail: `Origin "${origin}" is not allowed`,
        });
      }
    }
    next();
  };
}

export interface McpHttpDeps {
  /** Resolves each request's bearer token to its agent. */
  authenticate: Authenticate;
  pipeline: CallPipeline;
  audit: AuditLog;
  /** Where change events go to reach `subscriptions/listen` streams on every replica. */
  bus: ServerEventBus;
  config: Config;
  log: Logger;
  version: string;
}

/** The agent the auth step put on a request, as the SDK hands it to the server factory. */
function agentOf(authInfo: AuthInfo | undefined): Agent {
  const agent = authInfo?.extra?.agent as Agent | undefined;
  // The route below authenticates before it hands a request on, so this cannot happen.
  if (!agent) throw new ProtocolError(ProtocolErrorCode.InvalidRequest, 'unauthenticated request');
  return agent;
}

/**
 * Streamable HTTP at /mcp, stateless: every request is authenticated by its own bearer token and answered
 * by a fresh server instance, whatever protocol revision it speaks (2026-07-28 natively; 2025-era
 * clients through the SDK's stateless fallback). Nothing is kept between requests, so any replica of a
 * cluster answers any request.
 */
export function createMcpRouter(deps: McpHttpDeps) {
  const router = express.Router();
  const onerror = (err: Error) => deps.log.debug({ err: err.message }, 'MCP request refused');
  const handler = createMcpHandler(
    ({ authInfo }) =>
      createMcpServer({
        authorize: async () => agentOf(authInfo),
        pipeline: deps.pipeline,
        version: deps.version,
      }),
    { bus: deps.bus, maxRequestBodySize: deps.config.http.max_body_bytes, onerror },
  );
  const serve = toNodeHandler(handler, { maxRequestBodySize: deps.config.http.max_body_bytes, onerror });
  // An upstream's tool list changed: every open listen stream, on every replica, hears of it.
  const unsubscribe = deps.pipeline.onListChanged(() => handler.notify.toolsChanged());

  router.use(hostGuard(deps.config));
  router.use(express.json({ limit: deps.config.http.max_body_bytes, type: ['application/json'] }));

  router.all('/', async (req: Request, res: Response) => {
    const auth = await deps.authenticate(bearer(req));
    if ('failure' in auth) return refuse(deps, req, res, auth.failure, auth.agent);
    // Handed to the server factory as authInfo; the token itself goes no further.
    (req as Request & { auth?: AuthInfo }).auth = {
      token: '',
      clientId: auth.agent.id,
      scopes: [],
      extra: { agent: auth.agent },
    };
    await serve(req, res, withShallowArguments(req.body));
  });

  router.use(mcpErrorHandler(deps));

  return {
    router,
    async close() {
      unsubscribe();
      await handler.close();
    },
  };
}

/** A request without a valid agent token: audited (auth.denied), then 401 with the reason. */
async function refuse(deps: McpHttpDeps, req: Request, res: Response, reason: string, agent?: Agent) {
  await deps.audit.append({
    kind: 'auth.denied',
    agent_id: agent?.id ?? null,
    result: 'error',
    error_code: 'UNAUTHENTICATED',
    details: { reason, transport: 'http', ip: req.ip ?? null },
  });
  sendProblem(
    res,
    {
      code: 'NOT_LOGGED_IN',
      reason,
      title: 'Unauthorized',
      detail: 'a valid agent token is required (Authorization: Bearer …)',
    },
    { 'WWW-Authenticate': 'Bearer realm="countersign"' },
  );
}

/** Errors before the MCP handler answers: body too large or malformed, the database gone, a crash. */
function mcpErrorHandler(deps: McpHttpDeps) {
  return (
    err: Error & { type?: string; status?: number },
    _req: Request,
    res: Response,
    next: NextFunction,
  ) => {
    if (err.type === 'entity.too.large') {
      return sendProblem(res, {
        code: 'INVALID_ARGUMENT',
        reason: 'body_too_large',
        status: 413,
        title: 'Request body too large',
        detail: `limit ${deps.config.http.max_body_bytes} bytes`,
      });
    }
    if (err.type === 'entity.parse.failed') {
      return sendProblem(res, {
        code: 'INVALID_ARGUMENT',
        reason: 'malformed_json',
        title: 'Malformed JSON',
        detail: 'the request body is not valid JSON',
      });
    }
    if (isAuditUnavailable(err) || isConnectionError(err)) {
      // Authentication (and its audit) needs the database: a clear, retryable answer, never an HTML page.
      return sendProblem(
        res,
        {
          code: 'SOURCE_UNAVAILABLE',
          reason: 'database_unavailable',
          title: 'Service unavailable',
          detail: 'the database is unavailable; nothing was done; retry shortly',
        },
        { 'Retry-After': '1' },
      );
    }
    if (res.headersSent) return next(err);
    deps.log.error({ err }, 'MCP endpoint failed');
    return sendProblem(res, { code: 'INTERNAL_ERROR', reason: 'internal', title: 'Internal error' });
  };
}

/**
 * A tools/call whose arguments nest deeper than the limit is handed on with them replaced by the
 * too-deep marker: the SDK validates messages recursively and overflows its stack near 4,000 levels,
 * so without this the call would die as -32603 instead of reaching the seam, which answers
 * INVALID_ARGUMENT (too_deep) and audits it.
 */
function withShallowArguments(body: unknown): unknown {
  const messages = Array.isArray(body) ? body : [body];
  for (const message of messages) {
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
